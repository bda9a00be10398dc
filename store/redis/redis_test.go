package redis

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

func TestMain(m *testing.M) {
	// rueidis closes the connections a cluster refresh replaced after
	// sleeping 5 s in a goroutine of its own.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
}

var prefixes atomic.Int64

// open returns a store on srv with a key prefix of its own, and a Timeout
// of a minute unless opt sets one: its calls must succeed, and a busy
// machine stalls a process past the default second now and then (the
// tests of the timeouts set theirs).
func open(t testing.TB, opt Options) *Store {
	t.Helper()
	if opt.KeyPrefix == "" {
		opt.KeyPrefix = "t" + strconv.FormatInt(prefixes.Add(1), 10) + ":"
	}
	if opt.Timeout == 0 {
		opt.Timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := New(ctx, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func must(r *store.Rule, err error) *store.Rule {
	if err != nil {
		panic(err)
	}
	return r
}

func TestTake_Smoke(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, Options{URL: "redis://" + srv.Addr})
	fw := must(store.NewFixedWindow(2, time.Minute))
	tb := must(store.NewTokenBucket(1, time.Second, 2))
	now := int64(1_800_000_000_123_456_789)
	hits := []store.Hit{{Key: "a", Rule: fw, Cost: 1, Veto: true}, {Key: "b", Rule: tb, Cost: 1, Veto: true}}
	out := make([]store.Decision, 2)
	for step, want := range []bool{true, true, false} {
		if err := s.Take(context.Background(), now, hits, out); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		t.Logf("step %d: %+v", step, out)
		if out[0].Allowed != want {
			t.Fatalf("step %d: allowed %v, want %v", step, out[0].Allowed, want)
		}
	}
}

// TestNew_ShortTimeout: a store whose Timeout is too short for any answer
// still opens: its first ping waits as long as a probe may, when that is
// longer (a PONG a busy machine delayed past a Timeout of Envoy's 20 ms
// failed the start).
func TestNew_ShortTimeout(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := New(ctx, Options{URL: "redis://" + srv.Addr, Timeout: time.Nanosecond, ProbeTimeout: time.Minute})
	if err != nil {
		t.Fatalf("New with a Timeout of 1ns: %v, want the first ping to wait the ProbeTimeout", err)
	}
	s.Close()
}

// TestNew_BadURLHidesThePassword: a URL that does not parse is named in
// the error without its password.
func TestNew_BadURLHidesThePassword(t *testing.T) {
	for _, u := range []string{"redis://user:hunter2@redis:notaport", "redis://:hunter2@redis:6379/notadb", "ftp://u:hunter2@redis"} {
		_, err := New(context.Background(), Options{URL: u})
		if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.HasPrefix(err.Error(), "redis: url") {
			t.Errorf("New(%q) = %v, want an error without the password", u, err)
		}
	}
}
