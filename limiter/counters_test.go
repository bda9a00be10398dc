package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// countersStores are the stores the lookup and reset tests run on: the
// real ones, each a fresh store.
func countersStores(t *testing.T) map[string]func(t *testing.T) store.Store {
	srv := redistest.Start(t)
	return map[string]func(t *testing.T) store.Store{
		"memory": func(*testing.T) store.Store { return memory.New(memory.Options{}) },
		"redis": func(t *testing.T) store.Store {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := redis.New(ctx, redis.Options{URL: "redis://" + srv.Addr, Timeout: time.Minute,
				KeyPrefix: fmt.Sprintf("%s/%d:", t.Name(), time.Now().UnixNano())})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		},
	}
}

func newCountersRig(t *testing.T, st store.Store) *rig {
	r := &rig{clock: &fakeClock{}, obs: &recorder{}}
	r.clock.now.Store(t0)
	r.lim = limiter.New(tables{loadTable(t, multiLimits)}, st, limiter.Options{Clock: r.clock, Observer: r.obs})
	return r
}

func (r *rig) counters(t *testing.T, rq *limiter.Request) []limiter.Lookup {
	t.Helper()
	got, err := r.lim.Counters(context.Background(), rq)
	if err != nil {
		t.Fatalf("Counters: %v", err)
	}
	return got
}

// counterWant is one counter's expected state.
type counterWant struct {
	name            string
	used, remaining uint64
	reset, retry    time.Duration
}

func expectCounters(t *testing.T, step string, got limiter.Lookup, want ...counterWant) {
	t.Helper()
	if len(got.Counters) != len(want) {
		t.Fatalf("%s: %d counters, want %d", step, len(got.Counters), len(want))
	}
	for i, w := range want {
		c := &got.Counters[i]
		if c.Rule.Name != w.name || c.Used() != w.used || c.Decision.Remaining != w.remaining ||
			c.Decision.ResetAfter != w.reset || c.Decision.RetryAfter != w.retry {
			t.Errorf("%s: counter %d = {%s used %d remaining %d reset %v retry %v}, want %+v", step, i,
				c.Rule.Name, c.Used(), c.Decision.Remaining, c.Decision.ResetAfter, c.Decision.RetryAfter, w)
		}
	}
}

// TestCounters_ConsumesNothing: a lookup reports every limit of the
// matched rule as a check would count it, and many lookups change no
// counter: the next check sees exactly what it would have without them.
// On the real stores.
func TestCounters_ConsumesNothing(t *testing.T) {
	for name, open := range countersStores(t) {
		t.Run(name, func(t *testing.T) {
			r := newCountersRig(t, open(t))
			user := req(desc("user", "alice"))
			got := r.counters(t, user)
			if got[0].Rule == nil || got[0].Rule.Name != "per_second" || got[0].Unlimited || got[0].Override {
				t.Fatalf("lookup before any check: rule %v, want per_second", got[0].Rule)
			}
			expectCounters(t, "fresh", got[0],
				counterWant{"per_second", 0, 3, time.Second, 0}, counterWant{"per_minute", 0, 5, time.Minute, 0}, counterWant{"shadow_minute", 0, 1, time.Minute, 0})
			// (A fresh fixed window's reset is its end: t0 is a minute boundary.)
			r.check(t, user)
			r.check(t, user)
			r.clock.advance(250 * time.Millisecond)
			observed := len(r.obs.rules)
			for range 20 {
				got = r.counters(t, user)
			}
			if n := len(r.obs.rules); n != observed {
				t.Errorf("lookups told the observer about %d decisions, want none", n-observed)
			}
			expectCounters(t, "after two checks", got[0],
				counterWant{"per_second", 2, 1, 750 * time.Millisecond, 0},
				counterWant{"per_minute", 2, 3, time.Minute - 250*time.Millisecond, 0},
				counterWant{"shadow_minute", 1, 0, time.Minute - 250*time.Millisecond, time.Minute - 250*time.Millisecond})
			if got[0].Counters[2].Decision.Allowed || !got[0].Counters[0].Decision.Allowed {
				t.Errorf("allowed = %v, %v: want one more to fit per second and not in the shadow limit",
					got[0].Counters[0].Decision.Allowed, got[0].Counters[2].Decision.Allowed)
			}
			resp := r.check(t, user)
			if st := resp.Statuses[0]; st.Code != limiter.OK || st.Decision.Remaining != 0 {
				t.Errorf("the third check after 20 lookups: %v remaining %d, want OK with 0 left per second", st.Code, st.Decision.Remaining)
			}
			if resp := r.check(t, user); resp.Statuses[0].Code != limiter.OverLimit {
				t.Errorf("the fourth check: %v, want OVER_LIMIT", resp.Statuses[0].Code)
			}
		})
	}
}

// TestCounters_Reset: a reset sets every counter of the descriptor's rule
// back to empty on the real stores, and leaves other clients' counters.
func TestCounters_Reset(t *testing.T) {
	for name, open := range countersStores(t) {
		t.Run(name, func(t *testing.T) {
			r := newCountersRig(t, open(t))
			alice, bob := req(desc("user", "alice")), req(desc("user", "bob"))
			for range 4 {
				r.check(t, alice)
				r.check(t, bob)
			}
			if resp := r.check(t, alice); resp.Statuses[0].Code != limiter.OverLimit {
				t.Fatalf("alice's fifth check: %v, want OVER_LIMIT", resp.Statuses[0].Code)
			}
			got, err := r.lim.Reset(context.Background(), alice)
			if err != nil {
				t.Fatalf("Reset: %v", err)
			}
			expectCounters(t, "Reset's answer", got[0],
				counterWant{"per_second", 0, 3, time.Second, 0}, counterWant{"per_minute", 0, 5, time.Minute, 0}, counterWant{"shadow_minute", 0, 1, time.Minute, 0})
			if resp := r.check(t, alice); resp.Statuses[0].Code != limiter.OK {
				t.Errorf("alice after the reset: %v, want OK", resp.Statuses[0].Code)
			}
			expectCounters(t, "bob, untouched", r.counters(t, bob)[0],
				counterWant{"per_second", 3, 0, time.Second, time.Second},
				counterWant{"per_minute", 3, 2, time.Minute, 0},
				counterWant{"shadow_minute", 1, 0, time.Minute, time.Minute})
		})
	}
}

// TestCounters_Matching: a lookup matches as a check does: no rule, an
// unknown domain, an unlimited rule, a replaced limit, an override.
func TestCounters_Matching(t *testing.T) {
	r := newCountersRig(t, memory.New(memory.Options{}))
	o := desc("user", "carol")
	o.Override = limiter.Override{RequestsPerUnit: 7, Unit: 2} // per minute
	got := r.counters(t, req(desc("nothing", "here"), desc("both", "x"), desc("replacer", "y"), o))
	if got[0].Rule != nil || got[0].Counters != nil {
		t.Errorf("no rule: %+v, want nothing", got[0])
	}
	if got[1].Rule == nil || len(got[1].Counters) != 2 || !got[1].Counters[0].Replaced || got[1].Counters[1].Replaced ||
		got[1].Counters[1].Decision.Remaining != 100 {
		t.Errorf("both, with replacer: %+v, want its first limit replaced and the second counted", got[1])
	}
	if len(got[3].Counters) != 1 || !got[3].Override || got[3].Rule != nil || got[3].Counters[0].Decision.Limit != 7 {
		t.Errorf("override: %+v, want one counter of 7", got[3])
	}
	got = r.counters(t, &limiter.Request{Domain: "elsewhere", Descriptors: []limiter.Descriptor{desc("user", "x")}})
	if got[0].Rule != nil {
		t.Errorf("unknown domain: %+v, want no rule", got[0])
	}
	if _, err := r.lim.Counters(context.Background(), &limiter.Request{Domain: "test"}); !errors.As(err, new(*limiter.InvalidError)) {
		t.Errorf("no descriptor: %v, want an InvalidError", err)
	}
}

// TestCounters_Errors: a store that cannot reset says so; a failing store
// is a StoreError whatever the failure mode; no table is ErrNoConfig.
func TestCounters_Errors(t *testing.T) {
	r := newMultiRig(t, limiter.Options{FailureMode: limiter.FailAllow})
	if _, err := r.lim.Reset(context.Background(), req(desc("user", "a"))); !errors.Is(err, limiter.ErrNoReset) {
		t.Errorf("Reset on a store without Resetter: %v, want ErrNoReset", err)
	}
	r.st.fail = errors.New("down")
	if _, err := r.lim.Counters(context.Background(), req(desc("user", "a"))); !errors.As(err, new(*limiter.StoreError)) {
		t.Errorf("Counters on a failing store: %v, want a StoreError", err)
	}
	if r.obs.failures != 0 {
		t.Errorf("a failed lookup told the observer: %d failures, want 0", r.obs.failures)
	}
	none := limiter.New(tables{}, memory.New(memory.Options{}), limiter.Options{})
	if _, err := none.Counters(context.Background(), req(desc("user", "a"))); !errors.Is(err, limiter.ErrNoConfig) {
		t.Errorf("no table: %v, want ErrNoConfig", err)
	}
}

// BenchmarkCounters is a lookup of a rule of three limits on the memory
// store: an operator's call, not the hot path, but measured.
func BenchmarkCounters(b *testing.B) {
	lim := limiter.New(tables{loadTable(b, multiLimits)}, memory.New(memory.Options{}), limiter.Options{})
	rq := req(desc("user", "alice"))
	var resp limiter.Response
	if err := lim.Check(context.Background(), rq, &resp); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := lim.Counters(context.Background(), rq); err != nil {
			b.Fatal(err)
		}
	}
}
