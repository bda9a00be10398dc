package server_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memcache"
	"github.com/sluicehq/sluice/store/memcache/memcachetest"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestStoreError_NamesTheRuleNotTheKey: a store that fails on one hit
// (a real Redis or memcached whose counter holds what no count is) is
// answered UNAVAILABLE over gRPC and 503 over HTTP with a message that
// holds no descriptor value and, when the store's error is about one hit
// (memcached's count of one key; Redis's script fails for the batch),
// names the hit's rule by its path: the counter key carries the value, and these
// messages reach clients, logs and spans (docs/TRACING.md promises values
// only for detailed_metric rules).
func TestStoreError_NamesTheRuleNotTheKey(t *testing.T) {
	const secret = "s3cr3t-v4lue"
	rsrv := redistest.Start(t)
	msrv := memcachetest.Start(t)
	for _, c := range []struct {
		name     string
		open     func(t *testing.T) store.Store
		corrupt  func(t *testing.T)
		namesHit bool
	}{
		{"redis", func(t *testing.T) store.Store {
			s, err := redis.New(ctx(t), redis.Options{URL: "redis://" + rsrv.Addr, KeyPrefix: "storeerr:", Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}, func(t *testing.T) {
			keys := strings.Fields(rsrv.CLI("--scan", "--pattern", "storeerr:*"))
			if len(keys) == 0 {
				t.Fatal("no counter key in Redis")
			}
			for _, k := range keys {
				rsrv.CLI("SET", k, "-5")
			}
		}, false},
		{"memcache", func(t *testing.T) store.Store {
			s, err := memcache.New(context.Background(), memcache.Options{Servers: []string{msrv.Addr}, KeyPrefix: "storeerr:", Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}, func(t *testing.T) { corruptMemcached(t, msrv.Addr, "storeerr:") }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			lim := limiter.New(tables{loadTable(t)}, c.open(t), limiter.Options{})
			rls := rlspb.NewRateLimitServiceClient(serveLoopback(t, server.NewGRPC(lim, server.NewHealth(), server.GRPCOptions{})))
			in := req(0, d("extra", secret))
			if _, err := rls.ShouldRateLimit(ctx(t), in); err != nil {
				t.Fatal(err)
			}
			c.corrupt(t)
			_, err := rls.ShouldRateLimit(ctx(t), in)
			msg := status.Convert(err).Message()
			if status.Code(err) != codes.Unavailable || strings.Contains(msg, secret) || c.namesHit != strings.Contains(msg, "rule e2e.extra") {
				t.Errorf("gRPC: %v, want Unavailable without %q (naming rule e2e.extra: %v)", err, secret, c.namesHit)
			}
			hs := httptest.NewServer(server.NewHTTP(lim, server.NewHealth(), server.Options{}))
			defer hs.Close()
			e := &env{http: hs}
			r := e.do(t, "POST", "/v1/check", `{"domain":"e2e","key":"extra","value":"`+secret+`"}`)
			body := fmt.Sprint(r.body)
			if r.code != 503 || strings.Contains(body, secret) || c.namesHit != strings.Contains(body, "rule e2e.extra") {
				t.Errorf("HTTP: %d %s, want 503 without %q (naming rule e2e.extra: %v)", r.code, body, secret, c.namesHit)
			}
		})
	}
}

// corruptMemcached overwrites every key of memcached at addr that starts
// with prefix with bytes that are no count.
func corruptMemcached(t *testing.T, addr, prefix string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	rd := bufio.NewReader(conn)
	fmt.Fprint(conn, "lru_crawler metadump all\r\n")
	var keys []string
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		line = strings.TrimSpace(line)
		if line == "END" {
			break
		}
		f, ok := strings.CutPrefix(strings.Fields(line)[0], "key=")
		if !ok {
			continue
		}
		if k, err := url.QueryUnescape(f); err == nil && strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		t.Fatal("no counter key in memcached")
	}
	for _, k := range keys {
		fmt.Fprintf(conn, "set %s 0 0 8\r\nnotcount\r\n", k)
		if line, err := rd.ReadString('\n'); err != nil || strings.TrimSpace(line) != "STORED" {
			t.Fatalf("set %s: %q %v", k, line, err)
		}
	}
}
