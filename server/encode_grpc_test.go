package server_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/server"
)

// TestGRPC_ConcurrentReplies sends many concurrent calls over real
// loopback, each with a limit of its own that its answer repeats: a
// pooled response reused while gRPC still held it would answer some call
// with another's numbers (and -race would see the writes).
func TestGRPC_ConcurrentReplies(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{ResponseHeaders: true})
	const workers, calls = 32, 60
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range calls {
				n := uint32(w*calls + i + 2)
				in := req(0, override(d("nothing", fmt.Sprint(w, "-", i)), n, typepb.RateLimitUnit_HOUR))
				want := overall(ok, st(ok, "", n, hour, n-1, time.Hour))
				want.ResponseHeadersToAdd = []*corepb.HeaderValue{
					{Key: "RateLimit-Limit", Value: strconv.Itoa(int(n))},
					{Key: "RateLimit-Remaining", Value: strconv.Itoa(int(n - 1))},
					{Key: "RateLimit-Reset", Value: "3600"},
				}
				// (A deadline per call: 1,920 calls under -race on a busy
				// machine can outlast one shared deadline.)
				c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				got, err := e.rls.ShouldRateLimit(c, in)
				cancel()
				if err != nil {
					t.Errorf("worker %d call %d: %v", w, i, err)
					return
				}
				if !proto.Equal(got, want) {
					t.Errorf("worker %d call %d:\n got %s\nwant %s", w, i, protojson.Format(got), protojson.Format(want))
					return
				}
			}
		})
	}
	wg.Wait()
}
