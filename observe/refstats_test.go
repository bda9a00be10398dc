package observe_test

import (
	"context"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/statsd_exporter/pkg/event"
	"github.com/prometheus/statsd_exporter/pkg/exporter"
	"github.com/prometheus/statsd_exporter/pkg/line"
	"github.com/prometheus/statsd_exporter/pkg/mapper"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/storetest"
)

const refLimits = `
domain: web
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: remote_address
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
`

// reloads is a fixed config reload history.
type reloads struct{ s config.ReloadStatus }

func (r reloads) Status() config.ReloadStatus { return r.s }

const shouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// refTraffic is a server's metrics after some traffic: 12 hits on k
// (limit 10: 10 within, 2 over, 3 near), 2 on remote_address 10.0.0.1
// (detailed), 4 ShouldRateLimit calls of which 1 invalid, one successful
// config load.
type refTraffic struct {
	rules *observe.Rules
	grpc  *observe.GRPCMetrics
	lim   *limiter.Limiter
	call  func(err error)
}

func newRefTraffic(t *testing.T) *refTraffic {
	t.Helper()
	tab := loadTable(t, refLimits)
	reg := prometheus.NewRegistry()
	rules, err := observe.NewRules(reg, observe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rules.SetTable(tab)
	gm, err := observe.NewGRPCMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	r := &refTraffic{rules: rules, grpc: gm,
		lim: limiter.New(tables{tab}, memory.New(memory.Options{}), limiter.Options{Observer: rules, Clock: storetest.NewClock(t0)})}
	r.call = func(err error) {
		icpt := gm.UnaryServerInterceptor()
		_, _ = icpt(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: shouldRateLimit},
			func(context.Context, any) (any, error) { return nil, err })
	}
	return r
}

func (r *refTraffic) send(t *testing.T, n int, d limiter.Descriptor) {
	t.Helper()
	for range n {
		var resp limiter.Response
		if err := r.lim.Check(context.Background(), &limiter.Request{Domain: "web", Descriptors: []limiter.Descriptor{d}}, &resp); err != nil {
			t.Fatal(err)
		}
	}
}

func (r *refTraffic) run(t *testing.T) {
	t.Helper()
	r.send(t, 12, desc("k", "a"))
	r.send(t, 2, desc("remote_address", "10.0.0.1"))
	for range 3 {
		r.call(nil)
	}
	r.call(status.Error(codes.InvalidArgument, "no domain"))
}

// udpLines reads statsd lines from pc until the line end arrives.
func udpLines(t *testing.T, pc net.PacketConn, end string) []string {
	t.Helper()
	if err := pc.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	var lines []string
	buf := make([]byte, 65536)
	for {
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			t.Fatalf("reading statsd lines (have %q): %v", lines, err)
		}
		for l := range strings.Lines(string(buf[:n])) {
			l = strings.TrimSuffix(l, "\n")
			if l == end {
				return lines
			}
			lines = append(lines, l)
		}
	}
}

// timerCalls adds up the calls that name's timer lines stand for (each
// line counts 1/rate).
func timerCalls(t *testing.T, lines []string, name string) (calls float64) {
	t.Helper()
	for _, l := range lines {
		rest, ok := strings.CutPrefix(l, name+":")
		if !ok {
			continue
		}
		parts := strings.Split(rest, "|")
		if parts[1] != "ms" {
			t.Errorf("%q: not a timer", l)
		}
		rate := 1.0
		if len(parts) == 3 {
			r, err := strconv.ParseFloat(strings.TrimPrefix(parts[2], "@"), 64)
			if err != nil {
				t.Fatal(err)
			}
			rate = r
		}
		calls += 1 / rate
	}
	return calls
}

// TestRefStats_StatsdOverUDP: the reference's stats, as its statsd sink
// names them, arrive on a real UDP socket; a second flush sends only what
// changed.
func TestRefStats_StatsdOverUDP(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	sink, err := observe.NewStatsdSink(pc.LocalAddr().String(), observe.StatsdOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	tr := newRefTraffic(t)
	rs := observe.NewRefStats(tr.rules, tr.grpc, reloads{config.ReloadStatus{Successes: 1}}, observe.RefStatsOptions{})
	tr.run(t)
	flush := func() []string {
		t.Helper()
		if err := rs.Flush(sink); err != nil {
			t.Fatal(err)
		}
		sink.Counter("test.end", 1)
		if err := sink.Flush(); err != nil {
			t.Fatal(err)
		}
		return udpLines(t, pc, "test.end:1|c")
	}
	lines := flush()
	const rl = "ratelimit.service.rate_limit."
	want := []string{
		rl + "web.k.total_hits:12|c", rl + "web.k.within_limit:10|c", rl + "web.k.over_limit:2|c", rl + "web.k.near_limit:3|c",
		// A detailed rule's key is its values; an address stays one part.
		rl + "web.remote_address_10_0_0_1.total_hits:2|c", rl + "web.remote_address_10_0_0_1.within_limit:2|c",
		"ratelimit.service.config_load_success:1|c",
		"ratelimit.service.call.should_rate_limit.service_error:1|c",
		"ratelimit_server.ShouldRateLimit.total_requests:4|c",
	}
	var counters []string
	for _, l := range lines {
		if !strings.Contains(l, "|ms") {
			counters = append(counters, l)
		}
	}
	slices.Sort(want)
	slices.Sort(counters)
	if !slices.Equal(counters, want) {
		t.Errorf("counter lines:\n%s\nwant:\n%s", strings.Join(counters, "\n"), strings.Join(want, "\n"))
	}
	if n := timerCalls(t, lines, "ratelimit_server.ShouldRateLimit.response_time"); n != 4 {
		t.Errorf("response_time lines stand for %v calls, want 4: %q", n, lines)
	}

	tr.send(t, 1, desc("k", "a"))
	lines = flush()
	want = []string{rl + "web.k.total_hits:1|c", rl + "web.k.over_limit:1|c"}
	slices.Sort(lines)
	slices.Sort(want)
	if !slices.Equal(lines, want) {
		t.Errorf("second flush:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

// TestRefStats_Tags: EXTRA_TAGS end every name as gostats writes them.
func TestRefStats_Tags(t *testing.T) {
	tags, err := observe.ParseTags("zone:eu.west, cluster:c1")
	if err != nil {
		t.Fatal(err)
	}
	tr := newRefTraffic(t)
	rs := observe.NewRefStats(tr.rules, tr.grpc, nil, observe.RefStatsOptions{Tags: tags})
	tr.send(t, 1, desc("k", "a"))
	rec := &recordSink{}
	if err := rs.Flush(rec); err != nil {
		t.Fatal(err)
	}
	want := "ratelimit.service.rate_limit.web.k.total_hits.__cluster=c1.__zone=eu_west"
	if !slices.Contains(rec.counters, want) {
		t.Errorf("counters %q, want %q among them", rec.counters, want)
	}
	for _, bad := range []string{"novalue", ":v", "a:b,c"} {
		if _, err := observe.ParseTags(bad); err == nil {
			t.Errorf("ParseTags(%q): no error", bad)
		}
	}
}

type recordSink struct{ counters, forgot []string }

func (r *recordSink) Counter(name string, _ uint64) { r.counters = append(r.counters, name) }
func (r *recordSink) Timer(string, uint64, uint64)  {}
func (r *recordSink) Forget(names []string)         { r.forgot = append(r.forgot, names...) }
func (r *recordSink) Flush() error                  { return nil }

// exporterFor runs statsd_exporter's own exporter with mapping on reg and
// returns its event channel; closing it stops the exporter.
func exporterFor(t *testing.T, reg *prometheus.Registry, mapping string) (chan event.Events, func()) {
	t.Helper()
	m := &mapper.MetricMapper{Logger: slog.New(slog.DiscardHandler)}
	if err := m.InitFromYAMLString(mapping); err != nil {
		t.Fatal(err)
	}
	cv := func(name, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: name}, []string{label})
	}
	exp := exporter.NewExporter(reg, m, slog.New(slog.DiscardHandler), cv("actions", "action"),
		prometheus.NewCounter(prometheus.CounterOpts{Name: "unmapped", Help: "unmapped"}), cv("errors", "reason"),
		cv("events", "type"), cv("conflicts", "type"), prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "metrics", Help: "metrics"}, []string{"type"}))
	ch := make(chan event.Events)
	done := make(chan struct{})
	go func() {
		defer close(done)
		exp.Listen(ch)
	}()
	return ch, func() { close(ch); <-done }
}

// TestRefStats_EnvoyGatewayMapping: the lines Sluice sends, read by
// statsd_exporter's line parser and mapped with Envoy Gateway's mapping
// (its statsd-exporter sidecar's configuration), give the Prometheus
// series that Envoy Gateway's dashboards read.
func TestRefStats_EnvoyGatewayMapping(t *testing.T) {
	mapping, err := os.ReadFile("testdata/envoy-gateway-statsd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	sink, err := observe.NewStatsdSink(pc.LocalAddr().String(), observe.StatsdOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	tr := newRefTraffic(t)
	rs := observe.NewRefStats(tr.rules, tr.grpc, reloads{config.ReloadStatus{Successes: 2, Failures: 1}}, observe.RefStatsOptions{})
	tr.run(t)
	if err := rs.Flush(sink); err != nil {
		t.Fatal(err)
	}
	sink.Counter("test.end", 1)
	lines := udpLines(t, pc, "test.end:1|c")

	reg := prometheus.NewRegistry()
	ch, stop := exporterFor(t, reg, string(mapping))
	parser := line.NewParser()
	sampleErrors := *prometheus.NewCounterVec(prometheus.CounterOpts{Name: "e", Help: "e"}, []string{"reason"})
	c := func() prometheus.Counter { return prometheus.NewCounter(prometheus.CounterOpts{Name: "c", Help: "c"}) }
	for _, l := range lines {
		ch <- parser.LineToEvents(l, sampleErrors, c(), c(), c(), slog.New(slog.DiscardHandler))
	}
	stop()
	fams := scrape(t, reg)
	web := map[string]string{"domain": "web", "key1": "k"}
	check(t, fams, "ratelimit_service_rate_limit_total_hits", web, 12)
	check(t, fams, "ratelimit_service_rate_limit_within_limit", web, 10)
	check(t, fams, "ratelimit_service_rate_limit_over_limit", web, 2)
	check(t, fams, "ratelimit_service_rate_limit_near_limit", web, 3)
	check(t, fams, "ratelimit_service_rate_limit_total_hits", map[string]string{"domain": "web", "key1": "remote_address_10_0_0_1"}, 2)
	check(t, fams, "ratelimit_service_should_rate_limit_error", map[string]string{"err_type": "service_error"}, 1)
	check(t, fams, "ratelimit_service_total_requests", map[string]string{"grpc_method": "ShouldRateLimit"}, 4)
	check(t, fams, "ratelimit_service_response_time_seconds", map[string]string{"grpc_method": "ShouldRateLimit"}, 4)
	check(t, fams, "ratelimit_service_config_load_success", nil, 2)
	check(t, fams, "ratelimit_service_config_load_error", nil, 1)
}

// TestMappedSink: in process, with Sluice's default mapping (the
// reference's USE_PROMETHEUS series) and with Envoy Gateway's; a nested
// rule's key gives key1 and key2; a thousand calls are a thousand
// observations.
func TestMappedSink(t *testing.T) {
	egMapping, err := os.ReadFile("testdata/envoy-gateway-statsd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, mapping := range []string{"", string(egMapping)} {
		tab := loadTable(t, `
domain: gw
descriptors:
  - key: route
    value: r1
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 1}
`)
		rules, err := observe.NewRules(prometheus.NewRegistry(), observe.Options{})
		if err != nil {
			t.Fatal(err)
		}
		gm, err := observe.NewGRPCMetrics(prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		rs := observe.NewRefStats(rules, gm, reloads{config.ReloadStatus{Successes: 1}}, observe.RefStatsOptions{})
		lim := limiter.New(tables{tab}, memory.New(memory.Options{}), limiter.Options{Observer: rules, Clock: storetest.NewClock(t0)})
		for range 3 {
			var resp limiter.Response
			req := &limiter.Request{Domain: "gw", Descriptors: []limiter.Descriptor{desc("route", "r1", "user", "u")}}
			if err := lim.Check(context.Background(), req, &resp); err != nil {
				t.Fatal(err)
			}
		}
		for range 1000 {
			_, _ = gm.UnaryServerInterceptor()(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: shouldRateLimit},
				func(context.Context, any) (any, error) { return nil, nil })
		}

		reg := prometheus.NewRegistry()
		sink, err := observe.NewMappedSink(reg, mapping, nil)
		if err != nil {
			t.Fatal(err)
		}
		sink.Start()
		if err := rs.Flush(sink); err != nil {
			t.Fatal(err)
		}
		if err := sink.Close(); err != nil {
			t.Fatal(err)
		}
		fams := scrape(t, reg)
		l := map[string]string{"domain": "gw", "key1": "route_r1", "key2": "user"}
		check(t, fams, "ratelimit_service_rate_limit_total_hits", l, 3)
		check(t, fams, "ratelimit_service_rate_limit_over_limit", l, 2)
		check(t, fams, "ratelimit_service_total_requests", map[string]string{"grpc_method": "ShouldRateLimit"}, 1000)
		check(t, fams, "ratelimit_service_response_time_seconds", map[string]string{"grpc_method": "ShouldRateLimit"}, 1000)
		check(t, fams, "ratelimit_service_config_load_success", nil, 1)
		if _, ok := fams["statsd_exporter_events_total"]; !ok {
			t.Error("no statsd_exporter_events_total: the exporter's own counters are not registered")
		}
	}
	if _, err := observe.NewMappedSink(prometheus.NewRegistry(), "mappings: [{match: }", nil); err == nil {
		t.Error("a bad mapping: no error")
	}
}

// TestStatsdSink_BadAddress: an address without a port is refused.
func TestStatsdSink_BadAddress(t *testing.T) {
	if _, err := observe.NewStatsdSink("no-port", observe.StatsdOptions{}); err == nil {
		t.Error("NewStatsdSink(no-port): no error")
	}
}

// BenchmarkMappedSink_Timer: what one call's response_time observation
// costs the in-process exporter at a flush.
func BenchmarkMappedSink_Timer(b *testing.B) {
	sink, err := observe.NewMappedSink(prometheus.NewRegistry(), "", nil)
	if err != nil {
		b.Fatal(err)
	}
	sink.Start()
	defer sink.Close()
	b.ReportAllocs()
	b.ResetTimer()
	sink.Timer("ratelimit_server.ShouldRateLimit.response_time", 1, uint64(b.N))
	if err := sink.Flush(); err != nil {
		b.Fatal(err)
	}
}
