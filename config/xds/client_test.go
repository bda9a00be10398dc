package xds

import (
	"context"
	"crypto/tls"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/config/xds/xdstest"
	"github.com/sluicehq/sluice/internal/testcert"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const nodeID = "envoy-ratelimit"

func limits(name, domain string, perMinute uint32) *ratelimitpb.RateLimitConfig {
	return xdstest.Limits(name, domain, "default", perMinute)
}

// limitOf is the per-minute limit domain's rule has in r's table; -1 when
// there is none.
func limitOf(r *config.Reloader, domain string) int {
	t := r.Current()
	if t == nil {
		return -1
	}
	rule, _ := t.Match(domain, []config.Entry{{Key: "generic_key", Value: "default"}}, nil)
	if rule == nil {
		return -1
	}
	return int(rule.RequestsPerUnit)
}

// run starts a client with opts against s and returns its Reloader, whose
// updates arrive on the returned channel. The client stops when the test
// ends.
func run(t *testing.T, opts Options) (*config.Reloader, <-chan error) {
	t.Helper()
	if opts.NodeID == "" {
		opts.NodeID = nodeID
	}
	opts.BackoffInitial, opts.BackoffMax = 10*time.Millisecond, 50*time.Millisecond
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	r := config.NewSourceReloader(c, nil, nil)
	updates := make(chan error, 16)
	r.OnReload(func(_ *config.Table, err error) { updates <- err })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
	return r, updates
}

func update(t *testing.T, updates <-chan error) error {
	t.Helper()
	select {
	case err := <-updates:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("no config update")
	}
	return nil
}

func TestClient_PushUpdateNackReconnect(t *testing.T) {
	s := xdstest.Start(t, "127.0.0.1:0", nil)
	r, updates := run(t, Options{Server: s.Addr, NodeMetadata: map[string]string{"zone": "a"}})

	first := s.Request(t)
	if first.GetNode().GetId() != nodeID || first.GetTypeUrl() != TypeURL || first.GetVersionInfo() != "" ||
		len(first.GetResourceNames()) != 0 || first.GetNode().GetMetadata().GetFields()["zone"].GetStringValue() != "a" {
		t.Fatalf("initial request %v: want node %q, type %s, no version, every resource", first, nodeID, TypeURL)
	}
	if r.Current() != nil {
		t.Fatal("a table before the first push")
	}

	// Push: both domains arrive in one table, and the client ACKs.
	s.Push(t, nodeID, "1", limits("eg/http", "http", 10), limits("eg/grpc", "grpc", 20))
	if err := update(t, updates); err != nil {
		t.Fatal(err)
	}
	if limitOf(r, "http") != 10 || limitOf(r, "grpc") != 20 {
		t.Fatalf("limits %d, %d after the push, want 10, 20", limitOf(r, "http"), limitOf(r, "grpc"))
	}
	ack := s.Reply(t)
	if ack.GetVersionInfo() != "1" || ack.GetErrorDetail() != nil || ack.GetNode().GetId() != nodeID {
		t.Fatalf("ACK %v, want version 1 without error", ack)
	}

	// Update: one domain changes, one goes away, one table swap.
	before := r.Current()
	s.Push(t, nodeID, "2", limits("eg/http", "http", 11))
	if err := update(t, updates); err != nil {
		t.Fatal(err)
	}
	if limitOf(r, "http") != 11 || limitOf(r, "grpc") != -1 || r.Current() == before {
		t.Fatalf("limits %d, %d after the update, want 11 and none", limitOf(r, "http"), limitOf(r, "grpc"))
	}
	if ack := s.Reply(t); ack.GetVersionInfo() != "2" || ack.GetErrorDetail() != nil {
		t.Fatalf("ACK %v, want version 2", ack)
	}

	// A push that does not compile: NACK naming resource and field, the
	// last accepted version, and the limits stay.
	good := r.Current()
	bad := limits("eg/bad", "bad", 1)
	bad.Descriptors[0].RateLimit.Unit = ratelimitpb.RateLimitUnit_UNKNOWN
	s.Push(t, nodeID, "3", limits("eg/http", "http", 99), bad)
	if err := update(t, updates); err == nil {
		t.Fatal("the bad push was applied")
	}
	nack := s.Reply(t)
	want := `config: resource "eg/bad": descriptors[0]: rate_limit has no unit`
	if nack.GetVersionInfo() != "2" || nack.GetErrorDetail() == nil || nack.GetErrorDetail().GetMessage() != want ||
		codes.Code(nack.GetErrorDetail().GetCode()) != codes.InvalidArgument {
		t.Fatalf("NACK %v, want version 2 and error %q", nack, want)
	}
	if r.Current() != good || limitOf(r, "http") != 11 {
		t.Fatalf("limit %d after the bad push, want 11 still", limitOf(r, "http"))
	}
	// The snapshot cache answers a NACK with the same config again: the
	// client NACKs it again (after a delay) without compiling it again.
	if again := s.Reply(t); again.GetErrorDetail().GetMessage() != want || again.GetVersionInfo() != "2" {
		t.Fatalf("second NACK %v, want the same error", again)
	}
	select {
	case err := <-updates:
		t.Fatalf("the repeated bad config was compiled again: %v", err)
	default:
	}
	if st := r.Status(); st.LastOK || st.Failures != 1 || st.Successes != 2 || st.Version != "2" {
		t.Errorf("status %+v, want 2 successes, then a failure, version 2 in force", st)
	}

	// The server restarts with a new cache whose versions start over: the
	// client connects again, asks for the whole state and takes it.
	s.Stop()
	s = xdstest.Start(t, s.Addr, nil)
	if again := s.Request(t); again.GetVersionInfo() != "" || again.GetResponseNonce() != "" || again.GetNode().GetId() != nodeID {
		t.Fatalf("request on the new stream %v, want node %q and no version or nonce", again, nodeID)
	}
	s.Push(t, nodeID, "1", limits("eg/http", "http", 12))
	if err := update(t, updates); err != nil {
		t.Fatal(err)
	}
	if limitOf(r, "http") != 12 {
		t.Fatalf("limit %d after the restart, want 12", limitOf(r, "http"))
	}
	if ack := s.Reply(t); ack.GetVersionInfo() != "1" || ack.GetErrorDetail() != nil {
		t.Fatalf("ACK %v, want version 1", ack)
	}
}

func TestClient_EmptyPushRemovesEveryDomain(t *testing.T) {
	s := xdstest.Start(t, "127.0.0.1:0", nil)
	r, updates := run(t, Options{Server: s.Addr})
	s.Push(t, nodeID, "1", limits("a", "a", 1))
	if err := update(t, updates); err != nil || limitOf(r, "a") != 1 {
		t.Fatalf("first push: %v, limit %d", err, limitOf(r, "a"))
	}
	s.Push(t, nodeID, "2")
	if err := update(t, updates); err != nil || r.Current() == nil || len(r.Current().Domains()) != 0 {
		t.Fatalf("empty push: %v, table %v", err, r.Current())
	}
}

func TestClient_MutualTLS(t *testing.T) {
	ca := testcert.NewCA(t)
	dir := t.TempDir()
	srvCert := ca.Server(t).TLS(t)
	s := xdstest.Start(t, "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{srvCert},
		ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})
	certFile, keyFile := ca.Client(t).WriteFiles(t, dir, "client")
	caFile := ca.WriteFile(t, dir)

	// Without a client certificate the server refuses the stream.
	noCert, err := ClientTLS("", "", caFile, "")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(s.Addr, grpc.WithTransportCredentials(credentials.NewTLS(noCert)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if st, err := discoverypb.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx); err == nil {
		if _, err = st.Recv(); status.Code(err) != codes.Unavailable {
			t.Fatalf("stream without a client certificate: %v, want UNAVAILABLE", err)
		}
	}

	// A server certificate from another CA is refused by the client.
	other := testcert.NewCA(t)
	otherCA := other.WriteFile(t, t.TempDir())
	wrong, err := ClientTLS(certFile, keyFile, otherCA, "")
	if err != nil {
		t.Fatal(err)
	}
	conn2, err := grpc.NewClient(s.Addr, grpc.WithTransportCredentials(credentials.NewTLS(wrong)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	if st, err := discoverypb.NewAggregatedDiscoveryServiceClient(conn2).StreamAggregatedResources(ctx); err == nil {
		if _, err = st.Recv(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("stream to a server of another CA: %v, want a certificate error", err)
		}
	}

	// With both: pushes arrive.
	cfg, err := ClientTLS(certFile, keyFile, caFile, "localhost")
	if err != nil {
		t.Fatal(err)
	}
	r, updates := run(t, Options{Server: s.Addr, TLS: cfg})
	s.Push(t, nodeID, "1", limits("eg/http", "http", 7))
	if err := update(t, updates); err != nil || limitOf(r, "http") != 7 {
		t.Fatalf("push over mTLS: %v, limit %d", err, limitOf(r, "http"))
	}
}

func TestClientTLS_BadFiles(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t)
	cert, key := ca.Client(t).WriteFiles(t, dir, "c")
	for _, tc := range []struct{ cert, key, ca string }{
		{cert, "", ""},
		{cert, cert, ""},
		{"", "", dir + "/missing.crt"},
		{"", "", cert + ".nope"},
		{"", "", key},
	} {
		if _, err := ClientTLS(tc.cert, tc.key, tc.ca, ""); err == nil || !strings.HasPrefix(err.Error(), "xds: ") {
			t.Errorf("ClientTLS(%q, %q, %q) = %v, want an xds: error", tc.cert, tc.key, tc.ca, err)
		}
	}
}

func TestNew_Options(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Error("New without a server succeeded")
	}
	c, err := New(Options{Server: "127.0.0.1:1", Jitter: 3, BackoffInitial: time.Minute, BackoffMax: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.conn.Close()
	if c.opts.NodeID != "default" || c.opts.Jitter != 1 || c.opts.BackoffMax != time.Minute || c.String() != "xds 127.0.0.1:1" {
		t.Errorf("options %+v", c.opts)
	}
	for range 100 {
		if d := c.jittered(time.Second); d < 0 || d > time.Second {
			t.Fatalf("jittered(1s) = %v", d)
		}
	}
}

// TestClient_PushSwapsAllDomainsAtOnce: readers matching concurrently with
// pushes never see one domain of a push with another of the previous
// push. Every push gives both domains the same limit.
func TestClient_PushSwapsAllDomainsAtOnce(t *testing.T) {
	s := xdstest.Start(t, "127.0.0.1:0", nil)
	r, updates := run(t, Options{Server: s.Addr})
	s.Push(t, nodeID, "0", limits("a", "a", 1), limits("b", "b", 1))
	if err := update(t, updates); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var mixed atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				tbl := r.Current()
				ra, _ := tbl.Match("a", []config.Entry{{Key: "generic_key", Value: "default"}}, nil)
				rb, _ := tbl.Match("b", []config.Entry{{Key: "generic_key", Value: "default"}}, nil)
				if ra == nil || rb == nil || ra.RequestsPerUnit != rb.RequestsPerUnit {
					mixed.Add(1)
				}
			}
		})
	}
	for v := 2; v <= 12; v++ {
		s.Push(t, nodeID, strconv.Itoa(v), limits("a", "a", uint32(v)), limits("b", "b", uint32(v)))
		if err := update(t, updates); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if mixed.Load() != 0 {
		t.Errorf("%d reads saw two pushes at once", mixed.Load())
	}
	if limitOf(r, "a") != 12 || limitOf(r, "b") != 12 {
		t.Errorf("limits %d, %d after the last push, want 12", limitOf(r, "a"), limitOf(r, "b"))
	}
}

// TestClient_ServerLater: a client started before its server keeps trying
// (with backoff) and takes the config once the server is up; its stream
// carries the configured gRPC metadata.
func TestClient_ServerLater(t *testing.T) {
	s := xdstest.Start(t, "127.0.0.1:0", nil)
	addr := s.Addr
	s.Stop() // the port is free again, and nothing listens on it
	failed := &signalWriter{match: "xds: stream ended", seen: make(chan struct{})}
	r, updates := run(t, Options{Server: addr, Headers: map[string]string{"x-token": "secret"},
		Logger: slog.New(slog.NewTextHandler(failed, nil))})
	select {
	case <-failed.seen:
	case <-time.After(xdstest.Wait):
		t.Fatal("no failed attempt logged")
	}
	s = xdstest.Start(t, addr, nil)
	s.Push(t, nodeID, "1", limits("eg/http", "http", 4))
	if err := update(t, updates); err != nil || limitOf(r, "http") != 4 {
		t.Fatalf("push after the server came up: %v, limit %d", err, limitOf(r, "http"))
	}
	if got := s.Metadata().Get("x-token"); len(got) != 1 || got[0] != "secret" {
		t.Errorf("stream metadata x-token = %q, want secret", got)
	}
}

// signalWriter closes seen when a line containing match is written.
type signalWriter struct {
	match string
	seen  chan struct{}
	once  sync.Once
}

func (w *signalWriter) Write(p []byte) (int, error) {
	if strings.Contains(string(p), w.match) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}
