package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	ratelimitpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/logbuf"
)

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v\n%s", url, resp.Status, err, b)
	}
	return string(b)
}

// TestServe_Observability runs serve with the bench limits and checks
// /metrics on the HTTP port and the debug endpoints on --debug-addr.
func TestServe_Observability(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srvCtx, stop := context.WithCancel(ctx)
	var stderr logbuf.Buffer
	addrs := make(chan [2]net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		// No sweep: the hot counter's window of a second would be
		// swept from /debug/keys if the test ran into the first sweep.
		done <- serve(srvCtx, []string{"--config", "../../examples/bench.yaml", "--grpc-addr", "127.0.0.1:0",
			"--http-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0", "--near-limit-ratio", "0.5", "--memory-sweep-interval", "1h"},
			func(string) string { return "" }, &stderr, func(g, h net.Addr) { addrs <- [2]net.Addr{g, h} })
	}()
	var grpcAddr, httpAddr net.Addr
	select {
	case a := <-addrs:
		grpcAddr, httpAddr = a[0], a[1]
	case err := <-done:
		t.Fatalf("serve: %v\n%s", err, stderr.String())
	}
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()

	conn, err := grpc.NewClient(grpcAddr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlspb.NewRateLimitServiceClient(conn)
	hot := &rlspb.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitpb.RateLimitDescriptor{
		{Entries: []*ratelimitpb.RateLimitDescriptor_Entry{{Key: "hot", Value: "hot"}}}}}
	for range 12 { // the hot rule allows 10 a second
		if _, err := c.ShouldRateLimit(ctx, hot); err != nil {
			t.Fatal(err)
		}
	}

	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(httpGet(t, "http://"+httpAddr.String()+"/metrics")))
	if err != nil {
		t.Fatal(err)
	}
	hits := map[string]float64{}
	for _, m := range fams["sluice_rule_hits_total"].GetMetric() {
		for _, l := range m.Label {
			if l.GetName() == "rule" {
				hits[l.GetValue()] = m.Counter.GetValue()
			}
		}
	}
	// Every hit counts, allowed or not; the file's other rules are
	// exported at zero before their first hit.
	if hits["hot_hot"] != 12 || len(hits) != 6 || hits["k"] != 0 {
		t.Errorf("sluice_rule_hits_total by rule = %v, want hot_hot 12 and the 5 other rules at 0", hits)
	}
	for _, name := range []string{"grpc_server_handled_total", "sluice_config_last_reload_successful", "sluice_build_info", "go_goroutines",
		"sluice_memory_keys"} {
		if fams[name] == nil {
			t.Errorf("/metrics lacks %s", name)
		}
	}

	m := regexp.MustCompile(`msg="debug endpoints" addr=(\S+)`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("no debug address in the log:\n%s", stderr.String())
	}
	if body := httpGet(t, "http://"+m[1]+"/rlconfig"); !strings.Contains(body, "bench.hot_hot: unit=SECOND requests_per_unit=10") {
		t.Errorf("/rlconfig lacks the hot rule:\n%s", body)
	}
	if body := httpGet(t, "http://"+m[1]+"/debug/keys?domain=bench"); !strings.Contains(body, "bench|hot=hot|fw:1s") {
		t.Errorf("/debug/keys lacks the hot counter:\n%s", body)
	}
	// The first scrape is counted by the HTTP metrics: the second shows it.
	if body := httpGet(t, "http://"+httpAddr.String()+"/metrics"); !strings.Contains(body, `sluice_http_requests_total{code="200",method="get"}`) {
		t.Errorf("/metrics does not count HTTP requests:\n%s", body)
	}
	if body := httpGet(t, "http://"+m[1]+"/debug/build"); !strings.HasPrefix(body, "sluice ") {
		t.Errorf("/debug/build = %q", body)
	}
}

func TestServe_ObservabilityFlags(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, args := range [][]string{{"--near-limit-ratio", "0"}, {"--near-limit-ratio", "1.5"}, {"--metrics-max-values-per-rule", "0"}} {
		var stderr logbuf.Buffer
		err := serve(ctx, append([]string{"--config", "../../examples/bench.yaml", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, args...),
			func(string) string { return "" }, &stderr, nil)
		if err == nil || !strings.Contains(err.Error(), "observability") {
			t.Errorf("serve %v: err %v, want an observability error", args, err)
		}
	}
}
