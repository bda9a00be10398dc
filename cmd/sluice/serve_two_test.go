package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/store/redis/redistest"
)

// startServesAtOnce starts one serve per args in this process, all at
// once (their flags registered and parsed concurrently), and returns each
// one's gRPC and HTTP addresses once all listen. They stop when the test
// ends.
func startServesAtOnce(t *testing.T, args ...[]string) [][2]string {
	t.Helper()
	type event struct {
		i     int
		addrs [2]string
		err   error
	}
	events := make(chan event, 2*len(args))
	for i, a := range args {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		a = append([]string{"--config", "testdata/serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-level", "error"}, a...)
		go func() {
			defer close(done)
			err := serve(ctx, a, serveEnv{}.get, io.Discard, func(g, h net.Addr) { events <- event{i: i, addrs: [2]string{g.String(), h.String()}} })
			events <- event{i: i, err: fmt.Errorf("serve %q returned %v", a, err)}
		}()
		t.Cleanup(func() { cancel(); <-done })
	}
	addrs := make([][2]string, len(args))
	timeout := time.After(30 * time.Second)
	for range args {
		select {
		case e := <-events:
			if e.err != nil {
				t.Fatal(e.err)
			}
			addrs[e.i] = e.addrs
		case <-timeout:
			t.Fatal("the servers did not start")
		}
	}
	return addrs
}

// TestServe_TwoAtOnce runs four servers in one process at once, each with
// its own backend and extension settings, and checks that each uses its
// own: the memory store's key bound, the status page's prefix, the Redis
// store's key prefix. The settings live in each invocation's values
// (under -race, package variables shared by the servers would race).
func TestServe_TwoAtOnce(t *testing.T) {
	rs := redistest.Start(t)
	url := "redis://" + rs.Addr
	addrs := startServesAtOnce(t,
		[]string{"--memory-max-keys", "8", "--ui=false"},
		[]string{"--ui-prefix", "/sluice"},
		[]string{"--store", "redis", "--redis-url", url, "--redis-key-prefix", "first:", "--redis-timeout", storeTimeout},
		[]string{"--store", "redis", "--redis-url", url, "--redis-key-prefix", "second:", "--ui=false", "--redis-timeout", storeTimeout},
	)
	ctx := testCtx(t)
	const ips = 32
	for _, a := range addrs {
		rls, _ := dialRLS(t, a[0])
		for i := range ips {
			r, err := rls.ShouldRateLimit(ctx, rlsRequest("e2e", "remote_address", fmt.Sprintf("10.0.0.%d", i)))
			if err != nil || r.OverallCode != rlspb.RateLimitResponse_OK {
				t.Fatalf("%s: request %d: %v %v", a[0], i, r, err)
			}
		}
	}

	// The memory stores: 8 keys at most on the first, all 32 on the second.
	for i, want := range []struct{ evicted bool }{{true}, {false}} {
		fams := getFamilies(t, "http://"+addrs[i][1]+"/metrics")
		keys := fams["sluice_memory_keys"].GetMetric()[0].GetGauge().GetValue()
		evictions := fams["sluice_memory_evictions_total"].GetMetric()[0].GetCounter().GetValue()
		if (evictions > 0) != want.evicted || !want.evicted && keys != ips {
			t.Errorf("server %d: %v keys, %v evictions; want evictions %v (its own --memory-max-keys)", i, keys, evictions, want.evicted)
		}
	}
	// The status pages: off on the first, under /sluice on the second.
	for i, c := range []struct {
		path string
		code int
	}{{"/", http.StatusNotFound}, {"/sluice/", http.StatusOK}, {"/", http.StatusOK}} {
		res, err := http.Get("http://" + addrs[i][1] + c.path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != c.code {
			t.Errorf("server %d: GET %s: %s, want %d (its own --ui and --ui-prefix)", i, c.path, res.Status, c.code)
		}
	}
	// The Redis stores: each server's keys under its own prefix.
	for _, prefix := range []string{"first:", "second:"} {
		keys := strings.Fields(rs.CLI("--scan", "--pattern", prefix+"e2e|*"))
		if len(keys) != ips {
			t.Errorf("%d keys under %s, want %d (one per address): %q", len(keys), prefix, ips, keys)
		}
	}
}
