package client

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testCtx is a context that ends with the test, bounded by a timeout.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// fixedTable serves one loaded table.
type fixedTable struct{ t *config.Table }

func (f fixedTable) Current() *config.Table { return f.t }

// startSluice runs a real Sluice (limits from yaml, the in-memory store,
// the server's gRPC stack) on a loopback port and returns its address. A
// nil clock means the wall clock.
func startSluice(t testing.TB, yaml string, clock store.Clock) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	tbl, err := config.Load(file, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	lim := limiter.New(fixedTable{tbl}, memory.New(memory.Options{}), limiter.Options{Clock: clock})
	return serveGRPC(t, server.NewGRPC(lim, server.NewHealth(), server.GRPCOptions{}))
}

// serveGRPC serves s on a loopback port until the test ends.
func serveGRPC(t testing.TB, s *grpc.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Serve(ln)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
	return ln.Addr().String()
}

// deadAddr returns a loopback address where nothing listens.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// dial connects to addr with a timeout generous enough for a loaded test
// machine, unless opts set another.
func dial(t *testing.T, addr string, opts ...Option) *Client {
	t.Helper()
	c, err := Dial(addr, append([]Option{WithTimeout(5 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// stallingRLS is a hand-written Envoy rate-limit server that never
// answers before the caller gives up.
type stallingRLS struct {
	rlspb.UnimplementedRateLimitServiceServer
}

func (stallingRLS) ShouldRateLimit(ctx context.Context, _ *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
