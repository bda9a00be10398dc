package observe_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/observe"
)

// TestIgnoredFields: each field is a series of its own, named message.number
// (or as given), up to MaxIgnoredFields; later fields count under _other.
// Each field is logged once, and the overflow once.
func TestIgnoredFields(t *testing.T) {
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	f, err := observe.NewRequestIgnoredFields(reg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	const msg = "envoy.service.ratelimit.v3.RateLimitRequest"
	f.Field(msg, 9)
	f.Field(msg, 9)
	f.Named("x.y")
	for n := range observe.MaxIgnoredFields + 5 {
		f.Field("m", int32(100+n))
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_rls_ignored_fields_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			series[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	if len(series) != observe.MaxIgnoredFields+1 {
		t.Errorf("%d series, want %d and _other", len(series), observe.MaxIgnoredFields)
	}
	for _, c := range []struct {
		label string
		want  float64
	}{{msg + ".9", 2}, {"x.y", 1}, {"m.100", 1}, {"_other", 7}} {
		got, ok := series[c.label]
		if !ok {
			got = -1
		}
		if got != c.want {
			t.Errorf("field=%q: %v, want %v", c.label, got, c.want)
		}
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != observe.MaxIgnoredFields+1 ||
		strings.Count(logs.String(), "field="+msg+".9") != 1 {
		t.Errorf("%d WARNs, want one per field and one for the overflow:\n%s", n, logs.String())
	}
}

// TestIgnoredFields_Allocs: a field already seen, or one past the cap, is
// counted without an allocation (requests' path).
func TestIgnoredFields_Allocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under -race")
	}
	f, err := observe.NewRequestIgnoredFields(prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for n := range observe.MaxIgnoredFields + 1 {
		f.Field("m", int32(n))
	}
	if a := testing.AllocsPerRun(1000, func() { f.Field("m", 1); f.Field("m", 1000) }); a != 0 {
		t.Errorf("%.1f allocations per count, want 0", a)
	}
}
