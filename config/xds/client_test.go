package xds

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/testcert"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const nodeID = "envoy-ratelimit"

// server is a management server as Envoy Gateway runs it: go-control-plane's
// xDS server on a snapshot cache keyed by node id, with only the aggregated
// service registered. It records every request it receives.
type server struct {
	addr     string
	cache    cachev3.SnapshotCache
	grpc     *grpc.Server
	requests chan *discoverypb.DiscoveryRequest
	cancel   context.CancelFunc
	done     chan struct{}
}

// startServer serves on addr ("127.0.0.1:0" for any port) with TLS when
// tlsCfg is not nil, and stops when the test ends.
func startServer(t *testing.T, addr string, tlsCfg *tls.Config) *server {
	t.Helper()
	// A restarted server takes its old port back (Go listens with
	// SO_REUSEADDR, and Stop has closed the old listener).
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &server{addr: lis.Addr().String(), cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil),
		requests: make(chan *discoverypb.DiscoveryRequest, 64), cancel: cancel, done: make(chan struct{})}
	var opts []grpc.ServerOption
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	s.grpc = grpc.NewServer(opts...)
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, req *discoverypb.DiscoveryRequest) error {
		s.requests <- req
		return nil
	}}
	discoverypb.RegisterAggregatedDiscoveryServiceServer(s.grpc, serverv3.NewServer(ctx, s.cache, cb))
	go func() {
		defer close(s.done)
		_ = s.grpc.Serve(lis)
	}()
	t.Cleanup(s.stop)
	return s
}

func (s *server) stop() {
	s.cancel()
	s.grpc.Stop()
	<-s.done
}

// push sets the snapshot of version for the node.
func (s *server) push(t *testing.T, version string, cfgs ...*ratelimitpb.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(cfgs))
	for i, c := range cfgs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(context.Background(), nodeID, snap); err != nil {
		t.Fatal(err)
	}
}

// request waits for the next request the server receives that answers a
// response (ACK or NACK), skipping the initial ones.
func (s *server) reply(t *testing.T) *discoverypb.DiscoveryRequest {
	t.Helper()
	for {
		select {
		case req := <-s.requests:
			if req.GetResponseNonce() != "" {
				return req
			}
		case <-time.After(20 * time.Second):
			t.Fatal("no ACK or NACK from the client")
		}
	}
}

// initial waits for the first request of a stream.
func (s *server) initial(t *testing.T) *discoverypb.DiscoveryRequest {
	t.Helper()
	select {
	case req := <-s.requests:
		return req
	case <-time.After(20 * time.Second):
		t.Fatal("the client sent no request")
	}
	return nil
}

func limits(name, domain string, perMinute uint32) *ratelimitpb.RateLimitConfig {
	return &ratelimitpb.RateLimitConfig{Name: name, Domain: domain, Descriptors: []*ratelimitpb.RateLimitDescriptor{{
		Key: "generic_key", Value: "default",
		RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_MINUTE, RequestsPerUnit: perMinute},
	}}}
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
	s := startServer(t, "127.0.0.1:0", nil)
	r, updates := run(t, Options{Server: s.addr, NodeMetadata: map[string]string{"zone": "a"}})

	first := s.initial(t)
	if first.GetNode().GetId() != nodeID || first.GetTypeUrl() != TypeURL || first.GetVersionInfo() != "" ||
		len(first.GetResourceNames()) != 0 || first.GetNode().GetMetadata().GetFields()["zone"].GetStringValue() != "a" {
		t.Fatalf("initial request %v: want node %q, type %s, no version, every resource", first, nodeID, TypeURL)
	}
	if r.Current() != nil {
		t.Fatal("a table before the first push")
	}

	// Push: both domains arrive in one table, and the client ACKs.
	s.push(t, "1", limits("eg/http", "http", 10), limits("eg/grpc", "grpc", 20))
	if err := update(t, updates); err != nil {
		t.Fatal(err)
	}
	if limitOf(r, "http") != 10 || limitOf(r, "grpc") != 20 {
		t.Fatalf("limits %d, %d after the push, want 10, 20", limitOf(r, "http"), limitOf(r, "grpc"))
	}
	ack := s.reply(t)
	if ack.GetVersionInfo() != "1" || ack.GetErrorDetail() != nil || ack.GetNode().GetId() != nodeID {
		t.Fatalf("ACK %v, want version 1 without error", ack)
	}

	// Update: one domain changes, one goes away, one table swap.
	before := r.Current()
	s.push(t, "2", limits("eg/http", "http", 11))
	if err := update(t, updates); err != nil {
		t.Fatal(err)
	}
	if limitOf(r, "http") != 11 || limitOf(r, "grpc") != -1 || r.Current() == before {
		t.Fatalf("limits %d, %d after the update, want 11 and none", limitOf(r, "http"), limitOf(r, "grpc"))
	}
	if ack := s.reply(t); ack.GetVersionInfo() != "2" || ack.GetErrorDetail() != nil {
		t.Fatalf("ACK %v, want version 2", ack)
	}

	// A push that does not compile: NACK naming resource and field, the
	// last accepted version, and the limits stay.
	good := r.Current()
	bad := limits("eg/bad", "bad", 1)
	bad.Descriptors[0].RateLimit.Unit = ratelimitpb.RateLimitUnit_UNKNOWN
	s.push(t, "3", limits("eg/http", "http", 99), bad)
	if err := update(t, updates); err == nil {
		t.Fatal("the bad push was applied")
	}
	nack := s.reply(t)
	want := `config: resource "eg/bad": descriptors[0]: rate_limit has no unit`
	if nack.GetVersionInfo() != "2" || nack.GetErrorDetail() == nil || nack.GetErrorDetail().GetMessage() != want ||
		codes.Code(nack.GetErrorDetail().GetCode()) != codes.InvalidArgument {
		t.Fatalf("NACK %v, want version 2 and error %q", nack, want)
	}
	if r.Current() != good || limitOf(r, "http") != 11 {
		t.Fatalf("limit %d after the bad push, want 11 still", limitOf(r, "http"))
	}
	if st := r.Status(); st.LastOK || st.Failures != 1 || st.Successes != 2 {
		t.Errorf("status %+v, want 2 successes, then a failure", st)
	}

	// The server restarts with a new cache whose versions start over: the
	// client connects again, asks for the whole state and takes it.
	s.stop()
	s = startServer(t, s.addr, nil)
	if again := s.initial(t); again.GetVersionInfo() != "" || again.GetResponseNonce() != "" || again.GetNode().GetId() != nodeID {
		t.Fatalf("request on the new stream %v, want node %q and no version or nonce", again, nodeID)
	}
	s.push(t, "1", limits("eg/http", "http", 12))
	if err := update(t, updates); err != nil {
		t.Fatal(err)
	}
	if limitOf(r, "http") != 12 {
		t.Fatalf("limit %d after the restart, want 12", limitOf(r, "http"))
	}
	if ack := s.reply(t); ack.GetVersionInfo() != "1" || ack.GetErrorDetail() != nil {
		t.Fatalf("ACK %v, want version 1", ack)
	}
}

func TestClient_EmptyPushRemovesEveryDomain(t *testing.T) {
	s := startServer(t, "127.0.0.1:0", nil)
	r, updates := run(t, Options{Server: s.addr})
	s.push(t, "1", limits("a", "a", 1))
	if err := update(t, updates); err != nil || limitOf(r, "a") != 1 {
		t.Fatalf("first push: %v, limit %d", err, limitOf(r, "a"))
	}
	s.push(t, "2")
	if err := update(t, updates); err != nil || r.Current() == nil || len(r.Current().Domains()) != 0 {
		t.Fatalf("empty push: %v, table %v", err, r.Current())
	}
}

func TestClient_MutualTLS(t *testing.T) {
	ca := testcert.NewCA(t)
	dir := t.TempDir()
	srvCert := ca.Server(t).TLS(t)
	s := startServer(t, "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{srvCert},
		ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})
	certFile, keyFile := ca.Client(t).WriteFiles(t, dir, "client")
	caFile := ca.WriteFile(t, dir)

	// Without a client certificate the server refuses the stream.
	noCert, err := ClientTLS("", "", caFile, "")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(credentials.NewTLS(noCert)))
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
	conn2, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(credentials.NewTLS(wrong)))
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
	r, updates := run(t, Options{Server: s.addr, TLS: cfg})
	s.push(t, "1", limits("eg/http", "http", 7))
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

func TestNackMessage_Bounded(t *testing.T) {
	long := strings.Repeat("config: resource \"r\": descriptors[0]: rate_limit has no unit\n", 200)
	msg := nackMessage(errors.New(long))
	if len(msg) > maxNackMessage+30 || !strings.HasSuffix(msg, "(more errors not shown)") {
		t.Errorf("message of %d bytes ending %q", len(msg), msg[len(msg)-30:])
	}
}
