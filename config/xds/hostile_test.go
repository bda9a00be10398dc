package xds

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sluicehq/sluice/config"
)

// Management servers that misbehave, written against the ADS protocol
// (go-control-plane's stubs), served in memory inside a synctest bubble so
// that the client's timers run on the bubble's clock: each test covers
// minutes of pacing and backoff in no time, and its counts and times are
// exact (the tests turn jitter off).

// adsStream is the server's side of an ADS stream.
type adsStream = discoverypb.AggregatedDiscoveryService_StreamAggregatedResourcesServer

// adsFunc serves every stream with a function.
type adsFunc func(adsStream) error

func (f adsFunc) StreamAggregatedResources(s adsStream) error {
	return f(s)
}

func (adsFunc) DeltaAggregatedResources(discoverypb.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	return fmt.Errorf("delta xDS is not served")
}

// logCount counts the lines and bytes a logger writes.
type logCount struct {
	mu            sync.Mutex
	lines, errors int
	bytes, widest int
}

func (l *logCount) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for line := range bytes.SplitSeq(bytes.TrimSuffix(p, []byte("\n")), []byte("\n")) {
		l.lines++
		l.bytes += len(line) + 1
		l.widest = max(l.widest, len(line))
		if bytes.Contains(line, []byte("level=ERROR")) {
			l.errors++
		}
	}
	return len(p), nil
}

// counts returns what was logged.
func (l *logCount) counts() (lines, errors, bytes, widest int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lines, l.errors, l.bytes, l.widest
}

// hostile runs a client against a server whose streams serve runs, for d
// of the bubble's time, and returns its Reloader once the client has
// stopped. It must run inside synctest.Test. The client's backoff starts
// at 500ms (its default) and has no jitter.
func hostile(t *testing.T, log *logCount, d time.Duration, serve adsFunc) *config.Reloader {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	discoverypb.RegisterAggregatedDiscoveryServiceServer(srv, serve)
	go srv.Serve(lis)
	defer srv.Stop()
	logger := slog.New(slog.DiscardHandler)
	if log != nil {
		logger = slog.New(slog.NewTextHandler(log, nil))
	}
	c, err := New(Options{Server: "passthrough:///ads", NodeID: nodeID, Jitter: -1, Logger: logger,
		dial: func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }})
	if err != nil {
		t.Fatal(err)
	}
	r := config.NewSourceReloader(c, nil, logger)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	time.Sleep(d)
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
	return r
}

// response is a state-of-the-world response of cfgs.
func response(t *testing.T, version, nonce string, cfgs ...*ratelimitpb.RateLimitConfig) *discoverypb.DiscoveryResponse {
	resp := &discoverypb.DiscoveryResponse{VersionInfo: version, Nonce: nonce, TypeUrl: TypeURL}
	for _, c := range cfgs {
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		resp.Resources = append(resp.Resources, a)
	}
	return resp
}

// broken is a config with n problems: n rules without a unit.
func broken(n int) *ratelimitpb.RateLimitConfig {
	c := &ratelimitpb.RateLimitConfig{Name: "eg/broken", Domain: "broken"}
	for i := range n {
		c.Descriptors = append(c.Descriptors, &ratelimitpb.RateLimitDescriptor{Key: "generic_key",
			Value: fmt.Sprintf("value-%04d-%s", i, strings.Repeat("x", 20)), RateLimit: &ratelimitpb.RateLimitPolicy{RequestsPerUnit: 1}})
	}
	return c
}

// exchange records what a hostile server saw: when each reply came (in
// the bubble's time since start) and the replies themselves.
type exchange struct {
	mu      sync.Mutex
	start   time.Time
	at      []time.Duration
	replies []*discoverypb.DiscoveryRequest
	streams []time.Duration // when each stream opened
}

func newExchange() *exchange { return &exchange{start: time.Now()} }

// opened records a stream opening and returns how many have opened.
func (e *exchange) opened() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.streams = append(e.streams, time.Since(e.start))
	return len(e.streams)
}

func (e *exchange) reply(req *discoverypb.DiscoveryRequest) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.at = append(e.at, time.Since(e.start))
	e.replies = append(e.replies, req)
}

// roundTrip sends resp on s and records the client's reply.
func (e *exchange) roundTrip(s adsStream, resp *discoverypb.DiscoveryResponse) error {
	if err := s.Send(resp); err != nil {
		return err
	}
	req, err := s.Recv()
	if err != nil {
		return err
	}
	e.reply(req)
	return nil
}

// seen returns what the server saw, when the test is done with it.
func (e *exchange) seen() (at []time.Duration, replies []*discoverypb.DiscoveryRequest, streams []time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.at, e.replies, e.streams
}

// replying is a server that sends next(1) on each stream, then next(n+1)
// after the client's reply to next(n), for n up to last, recording the
// replies in ex; then it holds the stream open.
func replying(ex *exchange, last int, next func(n int) *discoverypb.DiscoveryResponse) adsFunc {
	return func(s adsStream) error {
		ex.opened()
		if _, err := s.Recv(); err != nil {
			return err
		}
		for n := 1; n <= last; n++ {
			if err := ex.roundTrip(s, next(n)); err != nil {
				return err
			}
		}
		<-s.Context().Done()
		return nil
	}
}

// rounds bounds every hostile loop, so that a client that answers at full
// speed (no time passes in the bubble) ends the test instead of hanging it.
const rounds = 60

// TestHostile_SameBadConfigNewVersions: a server that answers each NACK
// with the same bad config under a new version. The config is compiled
// once, its NACKs wait 1s, 2s, 4s... (paced by the config, whatever its
// version), the log holds a bounded summary, and the NACK is bounded yet
// says how many problems there are.
func TestHostile_SameBadConfigNewVersions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bad := broken(2000)
		ex := newExchange()
		log := &logCount{}
		r := hostile(t, log, 10*time.Second, replying(ex, rounds, func(v int) *discoverypb.DiscoveryResponse {
			return response(t, strconv.Itoa(v), "n"+strconv.Itoa(v), bad)
		}))
		at, replies, _ := ex.seen()
		want := []time.Duration{0, time.Second, 3 * time.Second, 7 * time.Second}
		if len(at) != len(want) {
			t.Fatalf("%d NACKs in 10s at %v, want %d at %v", len(at), at, len(want), want)
		}
		for i, at := range at {
			if at != want[i] {
				t.Errorf("NACK %d at %v, want %v", i, at, want[i])
			}
			nack := replies[i]
			msg := nack.GetErrorDetail().GetMessage()
			if nack.GetErrorDetail() == nil || nack.GetVersionInfo() != "" || len(msg) > maxNackMessage ||
				!strings.HasPrefix(msg, `config: resource "eg/broken": descriptors[0]: rate_limit has no unit`) ||
				!strings.Contains(msg, "more problems not shown)") {
				t.Errorf("NACK %d: version %q, %d bytes of detail %.200q...", i, nack.GetVersionInfo(), len(msg), msg)
			}
		}
		if st := r.Status(); st.Failures != 1 || st.Successes != 0 {
			t.Errorf("status %+v: want the config compiled once", st)
		}
		// 10 problems, a count, the client's NACK line, and a few lines
		// about the stream.
		lines, errs, n, widest := log.counts()
		t.Logf("log: %d lines (%d ERROR), %d bytes, the widest %d bytes", lines, errs, n, widest)
		if errs > 12 || lines > 20 || widest > 2048 {
			t.Errorf("log: %d lines (%d ERROR), %d bytes, the widest %d bytes", lines, errs, n, widest)
		}
	})
}

// TestHostile_AlternatingBadConfigs: two bad configs in turn, each under a
// new version, on a server that drops the stream after each NACK: each is
// compiled once, and the client remembers them on every new stream.
func TestHostile_AlternatingBadConfigs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := broken(3), broken(4)
		ex := newExchange()
		v := 0
		r := hostile(t, nil, 2*time.Minute, func(s adsStream) error {
			ex.opened()
			if _, err := s.Recv(); err != nil {
				return err
			}
			for range 2 {
				if v++; v > rounds {
					<-s.Context().Done()
					return nil
				}
				cfg := a
				if v%2 == 0 {
					cfg = b
				}
				if err := ex.roundTrip(s, response(t, strconv.Itoa(v), "n", cfg)); err != nil {
					return err
				}
			}
			return fmt.Errorf("dropped")
		})
		at, replies, _ := ex.seen()
		if st := r.Status(); st.Failures != 2 {
			t.Errorf("%d compiles of two configs, want 2", st.Failures)
		}
		for i, req := range replies {
			if req.GetErrorDetail() == nil {
				t.Errorf("reply %d is not a NACK", i)
			}
		}
		if len(replies) > 20 {
			t.Errorf("%d NACKs in 2 minutes at %v", len(replies), at)
		}
	})
}

// TestHostile_SameResponseAgain: a server that sends the same config and
// version again after each ACK gets it compiled once, and ACKs that wait
// 1s, 2s, 4s...
func TestHostile_SameResponseAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := newExchange()
		r := hostile(t, nil, 10*time.Second, replying(ex, rounds, func(n int) *discoverypb.DiscoveryResponse {
			return response(t, "7", "n"+strconv.Itoa(n), limits("eg/http", "http", 10))
		}))
		at, replies, _ := ex.seen()
		want := []time.Duration{0, time.Second, 3 * time.Second, 7 * time.Second}
		if len(at) != len(want) {
			t.Fatalf("%d ACKs in 10s at %v, want %d at %v", len(at), at, len(want), want)
		}
		for i, at := range at {
			if req := replies[i]; at != want[i] || req.GetErrorDetail() != nil || req.GetVersionInfo() != "7" || req.GetResponseNonce() != "n"+strconv.Itoa(i+1) {
				t.Errorf("reply %d at %v: %v, want an ACK of version 7 at %v", i, at, req, want[i])
			}
		}
		if st := r.Status(); st.Successes != 1 || limitOf(r, "http") != 10 {
			t.Errorf("status %+v: want one compile", st)
		}
	})
}

// TestHostile_SameConfigNewVersions: the config in force under new
// versions is ACKed at once each time (a server may bump its version for
// a change elsewhere) without being compiled; the status names the
// latest version.
func TestHostile_SameConfigNewVersions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := newExchange()
		r := hostile(t, nil, time.Second, replying(ex, 20, func(v int) *discoverypb.DiscoveryResponse {
			return response(t, strconv.Itoa(v), "n", limits("eg/http", "http", 10))
		}))
		at, replies, _ := ex.seen()
		if len(replies) != 20 {
			t.Fatalf("%d replies, want 20", len(replies))
		}
		for i, req := range replies {
			if at[i] != 0 || req.GetErrorDetail() != nil || req.GetVersionInfo() != strconv.Itoa(i+1) {
				t.Errorf("reply %d at %v: %v, want an ACK of version %d at once", i, at[i], req, i+1)
			}
		}
		if st := r.Status(); st.Version != "20" || !st.LastOK || st.Failures != 0 || st.Successes != 1 {
			t.Errorf("status %+v, want version 20 in force, compiled once", st)
		}
	})
}

// TestHostile_PushAndDrop: a server that sends a config and drops the
// stream. The config is compiled once, and the reconnections wait 0.5s,
// 1s, 2s... up to 30s, since no stream stays open.
func TestHostile_PushAndDrop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		big := broken(0)
		for i := range 5000 {
			big.Descriptors = append(big.Descriptors, &ratelimitpb.RateLimitDescriptor{Key: "generic_key", Value: fmt.Sprintf("v%05d", i),
				RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_MINUTE, RequestsPerUnit: 1}})
		}
		ex := newExchange()
		r := hostile(t, nil, 2*time.Minute, func(s adsStream) error {
			if ex.opened() > rounds {
				<-s.Context().Done()
				return nil
			}
			if _, err := s.Recv(); err != nil {
				return err
			}
			if err := ex.roundTrip(s, response(t, "1", "n", big)); err != nil {
				return err
			}
			return fmt.Errorf("dropped")
		})
		_, replies, streams := ex.seen()
		// Opened at 0, then after waits of 0.5, 1, 2, 4, 8, 16, 30, 30 s.
		want := []time.Duration{0, 500 * time.Millisecond, 1500 * time.Millisecond, 3500 * time.Millisecond,
			7500 * time.Millisecond, 15500 * time.Millisecond, 31500 * time.Millisecond, 61500 * time.Millisecond, 91500 * time.Millisecond}
		if len(streams) != len(want) {
			t.Fatalf("%d streams in 2 minutes, opened at %v; want %d at %v", len(streams), streams, len(want), want)
		}
		for i, at := range streams {
			if at != want[i] {
				t.Errorf("stream %d opened at %v, want %v", i, at, want[i])
			}
			if req := replies[i]; req.GetErrorDetail() != nil || req.GetVersionInfo() != "1" {
				t.Errorf("stream %d: reply %v, want an ACK of version 1", i, req)
			}
		}
		if st := r.Status(); st.Successes != 1 || st.Failures != 0 {
			t.Errorf("status %+v: want one compile", st)
		}
	})
}

// TestStream_BackoffStartsOverAfterAStableStream: the wait before a
// reconnection starts over once a stream stayed open for StableAfter (30s
// by default), not before.
func TestStream_BackoffStartsOverAfterAStableStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := newExchange()
		hostile(t, nil, 80*time.Second, func(s adsStream) error {
			switch n := ex.opened(); {
			case n == 4:
				time.Sleep(DefaultStableAfter - time.Millisecond) // not quite stable
			case n == 5:
				time.Sleep(DefaultStableAfter)
			case n > 6:
				<-s.Context().Done()
				return nil
			}
			return fmt.Errorf("dropped")
		})
		_, _, streams := ex.seen()
		// Waits of 0.5, 1, 2s; 4s after the fourth stream, open for just
		// under 30s; 0.5s after the fifth, open for 30s, then 1s.
		want := []time.Duration{0, 500 * time.Millisecond, 1500 * time.Millisecond, 3500 * time.Millisecond,
			37499 * time.Millisecond, 67999 * time.Millisecond, 68999 * time.Millisecond}
		if len(streams) != len(want) {
			t.Fatalf("streams opened at %v, want %v", streams, want)
		}
		for i, at := range streams {
			if at != want[i] {
				t.Errorf("stream %d opened at %v, want %v", i, at, want[i])
			}
		}
	})
}

// TestHostile_RollbackAndFix: after a rejected config, the server goes
// back to the config in force under a new version (ACKed at once without
// a compile, the status good again), sends the rejected one again (NACKs
// without a compile, still paced: no new config was applied) and finally
// a fix, which is applied at once although a NACK was waiting.
func TestHostile_RollbackAndFix(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		good, bad := limits("eg/http", "http", 10), broken(1)
		ex := newExchange()
		script := []*discoverypb.DiscoveryResponse{
			response(t, "1", "a", good), response(t, "2", "b", bad), response(t, "3", "c", bad),
			response(t, "4", "d", good), response(t, "5", "e", bad), response(t, "6", "f", bad),
		}
		r := hostile(t, nil, time.Minute, func(s adsStream) error {
			if _, err := s.Recv(); err != nil {
				return err
			}
			for _, resp := range script {
				if err := ex.roundTrip(s, resp); err != nil {
					return err
				}
			}
			// Version 6 is NACKed after a delay; the fix comes before.
			if err := s.Send(response(t, "6", "g", bad)); err != nil {
				return err
			}
			time.Sleep(100 * time.Millisecond)
			if err := ex.roundTrip(s, response(t, "7", "h", limits("eg/http", "http", 11))); err != nil {
				return err
			}
			<-s.Context().Done()
			return nil
		})
		at, replies, _ := ex.seen()
		type reply struct {
			at      time.Duration
			version string
			nack    bool
		}
		want := []reply{{0, "1", false}, {0, "1", true}, {time.Second, "1", true}, {time.Second, "4", false},
			{3 * time.Second, "4", true}, {7 * time.Second, "4", true}, {7*time.Second + 100*time.Millisecond, "7", false}}
		if len(replies) != len(want) {
			t.Fatalf("%d replies at %v, want %d", len(replies), at, len(want))
		}
		for i, req := range replies {
			got := reply{at[i], req.GetVersionInfo(), req.GetErrorDetail() != nil}
			if got != want[i] {
				t.Errorf("reply %d: %+v, want %+v", i, got, want[i])
			}
		}
		// Compiled: 1 (good), 2 (bad), 7 (the fix); 4 is the config in
		// force.
		if st := r.Status(); st.Failures != 1 || st.Successes != 2 || st.Version != "7" || !st.LastOK || limitOf(r, "http") != 11 {
			t.Errorf("status %+v, limit %d: want one failed compile and version 7 in force", st, limitOf(r, "http"))
		}
	})
}
