package observe

import (
	_ "embed" // the default statsd mapping
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cactus/go-statsd-client/v5/statsd"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/statsd_exporter/pkg/event"
	"github.com/prometheus/statsd_exporter/pkg/exporter"
	"github.com/prometheus/statsd_exporter/pkg/mapper"
	"github.com/prometheus/statsd_exporter/pkg/registry"
)

// StatsdSink sends RefStats's stats to a statsd server in statsd's line
// format ("name:3|c", "name:2|ms"): over UDP, several lines a datagram,
// or over TCP, newline-terminated (StatsdOptions.Protocol). With
// StatsdOptions.DogStatsD the lines are DogStatsD's, with tags
// ("name:3|c|#key:value,..."), named as envoyproxy/ratelimit's
// USE_DOG_STATSD names them (see dogName). Safe for concurrent use.
type StatsdSink struct {
	c          statsd.Statter
	tcp        *tcpSender // nil over UDP
	dog        bool
	mogrifiers []Mogrifier

	mu       sync.Mutex
	err      error              // the first send error since the last Flush
	dogNames map[string]dogStat // DogStatsD's name and tags of each stat name sent
	reported uint64             // lines dropped, as the last Flush reported them
}

// dogStat is a stat's DogStatsD name and tags.
type dogStat struct {
	name string
	tags []statsd.Tag
}

// StatsdOptions configure a StatsdSink. The zero value means defaults.
type StatsdOptions struct {
	// Protocol is "udp" (the default) or "tcp".
	Protocol string
	// DogStatsD sends DogStatsD lines, with tags.
	DogStatsD bool
	// Mogrifiers rename stats into a name and tags (DogStatsD only):
	// the first whose pattern matches applies.
	Mogrifiers []Mogrifier
	// MaxBuffered bounds, over TCP, the bytes waiting to be written
	// (default 4 MiB); lines past it are dropped and counted.
	MaxBuffered int
	// RetryEvery is, over TCP, how often a lost server is dialled again
	// while lines wait (default 1s).
	RetryEvery time.Duration
}

// NewStatsdSink sends to addr (host:port). Over UDP a host name is
// resolved again every 30 seconds, so a statsd server that moves is
// followed; over TCP at each connection. Over TCP, call Start before the
// first Flush.
func NewStatsdSink(addr string, o StatsdOptions) (*StatsdSink, error) {
	s := &StatsdSink{dog: o.DogStatsD, mogrifiers: o.Mogrifiers, dogNames: map[string]dogStat{}}
	var err error
	switch o.Protocol {
	case "", "udp":
		s.c, err = statsd.NewClientWithConfig(&statsd.ClientConfig{Address: addr, UseBuffered: true,
			FlushInterval: 100 * time.Millisecond, ResInterval: 30 * time.Second, TagFormat: statsd.SuffixOctothorpe})
	case "tcp":
		if _, _, err = net.SplitHostPort(addr); err != nil {
			break
		}
		if o.MaxBuffered <= 0 {
			o.MaxBuffered = 4 << 20
		}
		if o.RetryEvery <= 0 {
			o.RetryEvery = time.Second
		}
		s.tcp = newTCPSender(addr, o.MaxBuffered, o.RetryEvery)
		s.c, err = statsd.NewClientWithSender(s.tcp, "", statsd.SuffixOctothorpe)
	default:
		err = fmt.Errorf("protocol %q: want udp or tcp", o.Protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("observe: statsd %s: %w", addr, err)
	}
	return s, nil
}

// Start runs, over TCP, the goroutine that writes to the server; Close
// stops it. Over UDP it does nothing.
func (s *StatsdSink) Start() {
	if s.tcp != nil {
		s.tcp.start()
	}
}

// Dropped returns the lines dropped so far because the TCP buffer was
// full or a connection broke midway (always 0 over UDP).
func (s *StatsdSink) Dropped() uint64 {
	if s.tcp == nil {
		return 0
	}
	return s.tcp.dropped.Load()
}

func (s *StatsdSink) keep(err error) {
	if err == nil {
		return
	}
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
}

// named returns what stat is sent as: itself, or with DogStatsD its
// name and tags, worked out once per name.
func (s *StatsdSink) named(stat string) (string, []statsd.Tag) {
	if !s.dog {
		return stat, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := s.dogNames[stat]; ok {
		return d.name, d.tags
	}
	name, tags := dogName(stat, s.mogrifiers)
	d := dogStat{name: name, tags: make([]statsd.Tag, len(tags))}
	for i, t := range tags {
		k, v, _ := strings.Cut(t, ":")
		d.tags[i] = statsd.Tag{k, v}
	}
	s.dogNames[stat] = d
	return d.name, d.tags
}

// Counter implements Sink.
func (s *StatsdSink) Counter(name string, delta uint64) {
	name, tags := s.named(name)
	s.keep(s.c.Inc(name, int64(min(delta, 1<<63-1)), 1, tags...))
}

// Timer implements Sink. n calls of the same duration go out as one line
// per set bit of n, each with the sample rate 1/2^k that makes a statsd
// server count it 2^k times (an exact power of two, so that no server's
// rounding of 1/rate loses a call): at most 64 lines, however many calls.
func (s *StatsdSink) Timer(name string, ms, n uint64) {
	name, tags := s.named(name)
	v := strconv.FormatUint(ms, 10)
	for k := 0; n > 0; k, n = k+1, n>>1 {
		if n&1 == 0 {
			continue
		}
		line := v + "|ms"
		if k > 0 {
			line += "|@" + strconv.FormatFloat(1/float64(uint64(1)<<k), 'g', -1, 64)
		}
		s.keep(s.c.Raw(name, line, 1, tags...))
	}
}

// Forget implements Sink: the DogStatsD names of names are dropped (the
// statsd server drops what is no longer sent, as it is configured to).
func (s *StatsdSink) Forget(names []string) {
	if !s.dog {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range names {
		delete(s.dogNames, n)
	}
}

// Flush implements Sink: the buffered lines go out within 100 ms over
// UDP, at once over TCP. It reports the lines dropped since the last
// Flush.
func (s *StatsdSink) Flush() error {
	if s.tcp != nil {
		s.tcp.flush()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.err
	s.err = nil
	if d := s.Dropped(); d > s.reported {
		err = errors.Join(err, fmt.Errorf("observe: statsd: %d lines dropped (server unreachable or slow)", d-s.reported))
		s.reported = d
	}
	return err
}

// Close sends what is buffered and closes the socket.
func (s *StatsdSink) Close() error { return s.c.Close() }

// DefaultStatsdMapping maps the reference's stats to the Prometheus
// series that envoyproxy/ratelimit's USE_PROMETHEUS serves without a
// mapping file (and that Envoy Gateway's statsd-exporter mapping makes):
// ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,
// within_limit,shadow_mode}{domain,key1[,key2]},
// ratelimit_service_should_rate_limit_error{err_type},
// ratelimit_service_total_requests{grpc_method},
// ratelimit_service_response_time_seconds{grpc_method} and
// ratelimit_service_config_load_{success,error}.
//
//go:embed refmapping.yaml
var DefaultStatsdMapping string

// MappedSink turns RefStats's stats into Prometheus series the way a
// statsd_exporter does, with its mapping rules, in this process: the
// reference's USE_PROMETHEUS. The series, and the exporter's own
// statsd_exporter_* counters, are registered on the registry given to
// NewMappedSink. A series is dropped once every counter mapped to it is
// forgotten (its rule left the config), so that the series are bounded
// by the config in force. Start it before the first Flush and Close it
// after the last.
type MappedSink struct {
	exp     *exporter.Exporter
	mapper  *mapper.MetricMapper
	events  chan event.Events
	done    chan struct{}
	mu      sync.Mutex
	pending event.Events // guarded by mu
	// fed maps the name of each counter sent and not forgotten since to
	// its series (nil if the mapping makes none); series holds those
	// series by key; expired lists the series no name feeds any more,
	// for the exporter's goroutine to drop. Guarded by mu.
	fed     map[string]*mappedSeries
	series  map[string]*mappedSeries
	expired []*mappedSeries
}

// mappedSeries is one series of the exporter and the count of the names
// that feed it.
type mappedSeries struct {
	key, name string
	labels    prometheus.Labels
	feeders   int
}

// mappedBatch is the most events handed to the exporter at once.
const mappedBatch = 1024

// NewMappedSink maps with mappingYAML (a statsd_exporter mapping file's
// contents; DefaultStatsdMapping if empty) onto reg.
func NewMappedSink(reg prometheus.Registerer, mappingYAML string, logger *slog.Logger) (*MappedSink, error) {
	if mappingYAML == "" {
		mappingYAML = DefaultStatsdMapping
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m := &mapper.MetricMapper{Registerer: reg, Logger: logger}
	if err := m.InitFromYAMLString(mappingYAML); err != nil {
		return nil, fmt.Errorf("observe: statsd mapping: %w", err)
	}
	counterVec := func(name, help, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{label})
	}
	actions := counterVec("statsd_exporter_events_actions_total", "The total number of StatsD events by action.", "action")
	unmapped := prometheus.NewCounter(prometheus.CounterOpts{Name: "statsd_exporter_events_unmapped_total",
		Help: "The total number of StatsD events no mapping was found for."})
	errs := counterVec("statsd_exporter_events_error_total", "The total number of StatsD events discarded due to errors.", "reason")
	events := counterVec("statsd_exporter_events_total", "The total number of StatsD events seen.", "type")
	conflicts := counterVec("statsd_exporter_events_conflict_total", "The total number of StatsD events with conflicting names.", "type")
	metrics := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "statsd_exporter_metrics_total",
		Help: "The total number of metrics."}, []string{"type"})
	for _, c := range []prometheus.Collector{actions, unmapped, errs, events, conflicts, metrics} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	ms := &MappedSink{
		exp: exporter.NewExporter(reg, m, logger, actions, unmapped, errs, events, conflicts, metrics), mapper: m,
		events: make(chan event.Events), done: make(chan struct{}),
		fed: map[string]*mappedSeries{}, series: map[string]*mappedSeries{},
	}
	ms.exp.Registry = &forgetful{Registry: registry.NewRegistry(reg, m), sink: ms}
	return ms, nil
}

// forgetful is the exporter's registry: it drops the series the sink
// found expired, on the exporter's goroutine, which calls
// RemoveStaleMetrics every second between batches of events.
type forgetful struct {
	*registry.Registry
	sink *MappedSink
}

func (f *forgetful) RemoveStaleMetrics() {
	f.sink.mu.Lock()
	expired := f.sink.expired
	f.sink.expired = nil
	f.sink.mu.Unlock()
	for _, s := range expired {
		m, ok := f.Metrics[s.name]
		if !ok {
			continue
		}
		hash, _ := f.HashLabels(s.labels)
		if rm := m.Metrics[hash.Values]; rm != nil {
			v := m.Vectors[rm.VecKey]
			v.Holder.Delete(rm.Labels)
			v.RefCount--
			delete(m.Metrics, hash.Values)
		}
	}
	f.Registry.RemoveStaleMetrics()
}

// feed records that counter name is sent: its series stays while any
// name that feeds it is not forgotten. s.mu is held.
func (s *MappedSink) feed(name string) {
	if _, ok := s.fed[name]; ok {
		return
	}
	// The series the exporter makes of the name (exporter.handleEvent).
	mapping, labels, present := s.mapper.GetMapping(name, mapper.MetricTypeCounter)
	ser := &mappedSeries{name: mapper.EscapeMetricName(name), labels: prometheus.Labels{}}
	if present {
		if mapping.Action == mapper.ActionTypeDrop || mapping.Name == "" {
			s.fed[name] = nil
			return
		}
		ser.name = mapper.EscapeMetricName(mapping.Name)
		maps.Copy(ser.labels, labels)
	}
	ser.key = ser.name
	for _, k := range slices.Sorted(maps.Keys(ser.labels)) {
		ser.key += "\xff" + k + "\xff" + ser.labels[k]
	}
	if known := s.series[ser.key]; known != nil {
		ser = known
	} else {
		s.series[ser.key] = ser
		// Fed again before the exporter dropped it: it stays.
		s.expired = slices.DeleteFunc(s.expired, func(e *mappedSeries) bool { return e.key == ser.key })
	}
	ser.feeders++
	s.fed[name] = ser
}

// Forget implements Sink: a series that only forgotten names fed is
// dropped within a second.
func (s *MappedSink) Forget(names []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, name := range names {
		ser, ok := s.fed[name]
		if !ok {
			continue
		}
		delete(s.fed, name)
		if ser == nil {
			continue
		}
		if ser.feeders--; ser.feeders == 0 {
			delete(s.series, ser.key)
			s.expired = append(s.expired, ser)
		}
	}
}

// Start runs the exporter's goroutine.
func (s *MappedSink) Start() {
	go func() {
		defer close(s.done)
		s.exp.Listen(s.events)
	}()
}

// Close stops the exporter's goroutine once it has handled every event
// flushed.
func (s *MappedSink) Close() error {
	close(s.events)
	<-s.done
	return nil
}

// Counter implements Sink.
func (s *MappedSink) Counter(name string, delta uint64) {
	s.mu.Lock()
	s.feed(name)
	s.mu.Unlock()
	s.add(&event.CounterEvent{CMetricName: name, CValue: float64(delta), CLabels: map[string]string{}})
}

// Timer implements Sink: one observation a call, of the milliseconds as
// the reference's Prometheus sink passes them (a mapping's scale turns
// them into seconds). The n observations are one event handed over n
// times, 8 bytes each: the exporter handles events one after the other,
// and what it writes into an event's labels is the same each time.
func (s *MappedSink) Timer(name string, ms, n uint64) {
	e := &event.ObserverEvent{OMetricName: name, OValue: float64(ms), OLabels: map[string]string{}}
	for range n {
		s.add(e)
	}
}

func (s *MappedSink) add(e event.Event) {
	s.mu.Lock()
	s.pending = append(s.pending, e)
	var full event.Events
	if len(s.pending) >= mappedBatch {
		full, s.pending = s.pending, nil
	}
	s.mu.Unlock()
	if full != nil {
		s.events <- full
	}
}

// Flush implements Sink: it returns once the exporter has taken every
// event.
func (s *MappedSink) Flush() error {
	s.mu.Lock()
	batch := s.pending
	s.pending = nil
	s.mu.Unlock()
	if len(batch) > 0 {
		s.events <- batch
	}
	return nil
}
