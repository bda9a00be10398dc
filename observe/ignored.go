package observe

import (
	"log/slog"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/puzpuzpuz/xsync/v4"
)

// MaxIgnoredFields bounds the series of an IgnoredFields counter: fields
// past it are counted under field="_other" (a hostile peer can send any
// field number).
const MaxIgnoredFields = 32

// IgnoredFields counts the fields of received messages that Sluice does
// not use, in a counter whose one label, field, names the field: at most
// MaxIgnoredFields series, the rest under "_other". With a logger it logs
// a WARN for each field the first time it is seen. Safe for concurrent
// use; counting a field already seen costs no allocation.
type IgnoredFields struct {
	vec    *prometheus.CounterVec
	series *xsync.Map[ignoredKey, prometheus.Counter]
	log    *slog.Logger
	msg    string

	mu    sync.Mutex // makes the series
	other prometheus.Counter
}

type ignoredKey struct {
	name string
	num  int32
}

// NewConfigIgnoredFields registers sluice_config_ignored_fields_total,
// the pushed config versions that carried a field Sluice does not use
// (config/xds's Options.OnIgnoredField, which logs them itself).
func NewConfigIgnoredFields(reg prometheus.Registerer) (*IgnoredFields, error) {
	return newIgnoredFields(reg, "config_ignored_fields_total",
		"Pushed config versions (xDS) that carried a field Sluice does not use, by field (message.name, or message.number for a field of a newer proto).", nil, "")
}

// NewRequestIgnoredFields registers sluice_rls_ignored_fields_total, the
// ShouldRateLimit requests that carried a field Sluice does not read
// (server's Options.OnIgnoredField), and logs each field at WARN once.
func NewRequestIgnoredFields(reg prometheus.Registerer, log *slog.Logger) (*IgnoredFields, error) {
	return newIgnoredFields(reg, "rls_ignored_fields_total",
		"ShouldRateLimit requests that carried a field Sluice does not read (a newer Envoy's), by field (message.number).", log,
		"rls: requests carry a field Sluice does not read (a newer Envoy's proto?); it is ignored")
}

func newIgnoredFields(reg prometheus.Registerer, name, help string, log *slog.Logger, msg string) (*IgnoredFields, error) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "sluice", Name: name, Help: help}, []string{"field"})
	if err := reg.Register(vec); err != nil {
		return nil, err
	}
	return &IgnoredFields{vec: vec, series: xsync.NewMap[ignoredKey, prometheus.Counter](), log: log, msg: msg}, nil
}

// Named counts field, named in full.
func (f *IgnoredFields) Named(field string) { f.add(ignoredKey{field, -1}) }

// Field counts the field number of message (its full name).
func (f *IgnoredFields) Field(message string, number int32) { f.add(ignoredKey{message, number}) }

func (f *IgnoredFields) add(k ignoredKey) {
	if c, ok := f.series.Load(k); ok {
		c.Inc()
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.series.Load(k); ok {
		c.Inc()
		return
	}
	if f.series.Size() >= MaxIgnoredFields {
		if f.other == nil {
			f.other = f.vec.WithLabelValues("_other")
			if f.log != nil {
				f.log.Warn(f.msg+"; more fields than the metric keeps, the rest counted as _other", "max", MaxIgnoredFields)
			}
		}
		f.other.Inc()
		return
	}
	label := k.name
	if k.num >= 0 {
		label += "." + strconv.Itoa(int(k.num))
	}
	c := f.vec.WithLabelValues(label)
	f.series.Store(k, c)
	if f.log != nil {
		f.log.Warn(f.msg, "field", label)
	}
	c.Inc()
}
