package limiter_test

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/store"
)

const limits = `
domain: test
descriptors:
  - key: fw
    rate_limit: {unit: minute, requests_per_unit: 2, name: fw_rule}
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20}
  - key: free
    rate_limit: {unlimited: true, name: free_rule, replaces: [{name: replaced_rule}]}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 5, name: replaced_rule}
  - key: big
    rate_limit: {unit: hour, requests_per_unit: 100, replaces: [{name: replaced_rule}]}
  - key: path
    descriptors:
      - key: method
        value: GET
        rate_limit: {unit: second, requests_per_unit: 3}
`

// t0 is a minute boundary, so fixed windows reset 60 s after it.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()

type fakeClock struct{ now atomic.Int64 }

func (c *fakeClock) Now() int64              { return c.now.Load() }
func (c *fakeClock) advance(d time.Duration) { c.now.Add(int64(d)) }

// mapStore is a hand-written Store: a mutex, a map and the store
// package's pure algorithms, all-or-nothing like a real store: takes
// commit together, other modes apply in their turn.
type mapStore struct {
	mu    sync.Mutex
	state map[string]store.State
	takes int
	fail  error
}

func newMapStore() *mapStore { return &mapStore{state: map[string]store.State{}} }

func (m *mapStore) Take(_ context.Context, now int64, hits []store.Hit, out []store.Decision) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	m.takes++
	next := make([]store.State, len(hits))
	denied := false
	for i, h := range hits {
		if h.Always() {
			m.state[strings.Clone(h.Key)], out[i] = h.Apply(m.state[h.Key], now)
		} else {
			next[i], out[i] = h.Apply(m.state[h.Key], now)
		}
		if !out[i].Allowed && h.Veto {
			denied = true
		}
	}
	for i, h := range hits {
		switch {
		case h.Always():
		case !denied:
			m.state[strings.Clone(h.Key)] = next[i]
		case out[i].Allowed:
			// Denied as a whole: report what was there before.
			out[i] = store.View(m.state[h.Key], h.Rule, now)
		}
	}
	return nil
}

type tables struct{ t *config.Table }

func (t tables) Current() *config.Table { return t.t }

func loadTable(t testing.TB, yaml string) *config.Table {
	t.Helper()
	p := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	tab, err := config.Load(p, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

type rig struct {
	lim   *limiter.Limiter
	st    *mapStore
	clock *fakeClock
	obs   *recorder
}

func newRig(t testing.TB, opts limiter.Options) *rig {
	r := &rig{st: newMapStore(), clock: &fakeClock{}, obs: &recorder{}}
	r.clock.now.Store(t0)
	opts.Clock, opts.Observer = r.clock, r.obs
	r.lim = limiter.New(tables{loadTable(t, limits)}, r.st, opts)
	return r
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) limiter.Descriptor {
	var d limiter.Descriptor
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, config.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func withCost(d limiter.Descriptor, cost uint64) limiter.Descriptor {
	d.Cost, d.HasCost = cost, true
	return d
}

func (r *rig) check(t *testing.T, req *limiter.Request) *limiter.Response {
	t.Helper()
	var resp limiter.Response
	if err := r.lim.Check(context.Background(), req, &resp); err != nil {
		t.Fatalf("Check: %v", err)
	}
	return &resp
}

// want is the expected status of one descriptor.
type want struct {
	code      limiter.Code
	limited   bool
	name      string
	rpu       uint64
	remaining uint32
	reset     time.Duration
}

func (w want) check(t *testing.T, step string, i int, got *limiter.Status) {
	t.Helper()
	if got.Code != w.code || got.Limited != w.limited || got.Name != w.name || got.RequestsPerUnit != w.rpu ||
		got.Remaining() != w.remaining || got.ResetAfter() != w.reset {
		t.Errorf("%s: status %d = {code %v limited %v name %q rpu %d remaining %d reset %v}, want %+v",
			step, i, got.Code, got.Limited, got.Name, got.RequestsPerUnit, got.Remaining(), got.ResetAfter(), w)
	}
}

func TestCheck_Steps(t *testing.T) {
	r := newRig(t, limiter.Options{})
	fw := func(remaining uint32, code limiter.Code) want {
		return want{code: code, limited: true, name: "fw_rule", rpu: 2, remaining: remaining, reset: 60 * time.Second}
	}
	none := want{code: limiter.OK}
	steps := []struct {
		name    string
		req     limiter.Request
		overall limiter.Code
		want    []want
	}{
		{"unknown domain", limiter.Request{Domain: "nope", Descriptors: []limiter.Descriptor{desc("fw", "x")}}, limiter.OK, []want{none}},
		{"no rule", limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("other", "x")}}, limiter.OK, []want{none}},
		{"more entries than the rule", limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("fw", "x", "y", "z")}}, limiter.OK, []want{none}},
		{"first hit", limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("fw", "x")}}, limiter.OK, []want{fw(1, limiter.OK)}},
		{"check only", limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{withCost(desc("fw", "x"), 0)}}, limiter.OK, []want{fw(1, limiter.OK)}},
		{"take both of another value", limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{withCost(desc("fw", "z"), 2)}}, limiter.OK, []want{fw(0, limiter.OK)}},
		{"a peek at the limit is OK, as the reference answers", limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{withCost(desc("fw", "z"), 0)}}, limiter.OK, []want{fw(0, limiter.OK)}},
		{"second hit", limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("fw", "x")}}, limiter.OK, []want{fw(0, limiter.OK)}},
		{"third hit denied", limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("fw", "x")}}, limiter.OverLimit, []want{fw(0, limiter.OverLimit)}},
		{"other value counts apart", limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("fw", "y")}, HitsAddend: 2}, limiter.OK, []want{fw(0, limiter.OK)}},
		{"nested rule", limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("path", "/a", "method", "GET")}}, limiter.OK,
			[]want{{code: limiter.OK, limited: true, rpu: 3, remaining: 2, reset: time.Second}}},
		{"nested rule, other value", limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("path", "/a", "method", "POST")}}, limiter.OK, []want{none}},
	}
	for _, s := range steps {
		resp := r.check(t, &s.req)
		if resp.Overall != s.overall {
			t.Errorf("%s: overall = %v, want %v", s.name, resp.Overall, s.overall)
		}
		if len(resp.Statuses) != len(s.want) {
			t.Fatalf("%s: %d statuses, want %d", s.name, len(resp.Statuses), len(s.want))
		}
		for i, w := range s.want {
			w.check(t, s.name, i, &resp.Statuses[i])
		}
	}
}

func TestCheck_HitsAddend(t *testing.T) {
	r := newRig(t, limiter.Options{})
	// Request-level hits_addend 0 means 1.
	resp := r.check(t, &limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("tb", "a")}})
	if got := resp.Statuses[0].Remaining(); got != 19 {
		t.Errorf("hits_addend 0: remaining = %d, want 19", got)
	}
	// The descriptor's own wins over the request's.
	resp = r.check(t, &limiter.Request{Domain: "test", HitsAddend: 5,
		Descriptors: []limiter.Descriptor{withCost(desc("tb", "a"), 3), desc("tb", "b")}})
	if a, b := resp.Statuses[0].Remaining(), resp.Statuses[1].Remaining(); a != 16 || b != 15 {
		t.Errorf("descriptor 3 / request 5: remaining = %d, %d; want 16, 15", a, b)
	}
}

// TestCheck_StatusHits: Status.Hits is the cost applied to each
// descriptor with a rule or an override, 0 for a check and for no rule.
func TestCheck_StatusHits(t *testing.T) {
	r := newRig(t, limiter.Options{})
	over := desc("custom", "v")
	over.Override = limiter.Override{RequestsPerUnit: 100, Unit: config.Minute}
	for _, c := range []struct {
		name string
		req  limiter.Request
		want []uint64
	}{
		{"hits_addend 0 means 1", limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("tb", "a")}}, []uint64{1}},
		{"request and descriptor cost", limiter.Request{Domain: "test", HitsAddend: 5,
			Descriptors: []limiter.Descriptor{withCost(desc("tb", "a"), 3), desc("tb", "b"), withCost(desc("tb", "c"), 0)}}, []uint64{3, 5, 0}},
		{"unlimited, no rule, override", limiter.Request{Domain: "test", HitsAddend: 4,
			Descriptors: []limiter.Descriptor{desc("free", "x"), desc("none", "x"), over}}, []uint64{4, 0, 4}},
		{"denied", limiter.Request{Domain: "test", HitsAddend: 30, Descriptors: []limiter.Descriptor{desc("tb", "d")}}, []uint64{30}},
	} {
		resp := r.check(t, &c.req)
		for i, want := range c.want {
			if got := resp.Statuses[i].Hits; got != want {
				t.Errorf("%s: status %d: Hits = %d, want %d", c.name, i, got, want)
			}
		}
	}
}

func TestCheck_TokenBucketFields(t *testing.T) {
	r := newRig(t, limiter.Options{})
	resp := r.check(t, &limiter.Request{Domain: "test", HitsAddend: 15, Descriptors: []limiter.Descriptor{desc("tb", "a")}})
	st := &resp.Statuses[0]
	// requests_per_unit is the refill per unit; remaining whole tokens;
	// reset is the time until full: 15 tokens at 10/s = 1.5 s → 2 s.
	if st.RequestsPerUnit != 10 || st.Unit != config.Second || st.Remaining() != 5 || st.ResetAfter() != 2*time.Second {
		t.Errorf("after 15 of 20: rpu %d unit %v remaining %d reset %v; want 10 second 5 2s",
			st.RequestsPerUnit, st.Unit, st.Remaining(), st.ResetAfter())
	}
	// Denied: 6 tokens needed, 5 there; retry when one more has refilled.
	resp = r.check(t, &limiter.Request{Domain: "test", HitsAddend: 6, Descriptors: []limiter.Descriptor{desc("tb", "a")}})
	if resp.Overall != limiter.OverLimit || resp.RetryAfter() != time.Second {
		t.Errorf("6 of 5: overall %v retry %v; want OVER_LIMIT 1s", resp.Overall, resp.RetryAfter())
	}
	// More than the capacity can never succeed.
	resp = r.check(t, &limiter.Request{Domain: "test", HitsAddend: 21, Descriptors: []limiter.Descriptor{desc("tb", "b")}})
	if resp.Overall != limiter.OverLimit || resp.RetryAfter() != store.Never {
		t.Errorf("21 of 20: overall %v retry %v; want OVER_LIMIT never", resp.Overall, resp.RetryAfter())
	}
	r.clock.advance(2 * time.Second)
	resp = r.check(t, &limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{withCost(desc("tb", "a"), 0)}})
	if st := &resp.Statuses[0]; st.Remaining() != 20 || st.ResetAfter() != 0 {
		t.Errorf("after refill: remaining %d reset %v; want 20 0s", st.Remaining(), st.ResetAfter())
	}
}

func TestCheck_FixedWindowResets(t *testing.T) {
	r := newRig(t, limiter.Options{})
	req := limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("fw", "x")}}
	r.check(t, &req)
	r.clock.advance(59*time.Second + 500*time.Millisecond)
	resp := r.check(t, &req)
	if st := &resp.Statuses[0]; st.Code != limiter.OK || st.ResetAfter() != time.Second {
		t.Errorf("at 59.5 s: code %v reset %v; want OK 1s (rounded up)", st.Code, st.ResetAfter())
	}
	if resp = r.check(t, &req); resp.Overall != limiter.OverLimit || resp.RetryAfter() != time.Second {
		t.Errorf("third in window: overall %v retry %v; want OVER_LIMIT 1s", resp.Overall, resp.RetryAfter())
	}
	r.clock.advance(time.Second)
	if resp = r.check(t, &req); resp.Overall != limiter.OK || resp.Statuses[0].Remaining() != 1 {
		t.Errorf("next window: overall %v remaining %d; want OK 1", resp.Overall, resp.Statuses[0].Remaining())
	}
}

func TestCheck_Unlimited(t *testing.T) {
	r := newRig(t, limiter.Options{})
	for range 3 {
		resp := r.check(t, &limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("free", "x")}})
		st := &resp.Statuses[0]
		if st.Code != limiter.OK || !st.Unlimited || st.Limited || st.Remaining() != math.MaxUint32 {
			t.Fatalf("unlimited: %+v", st)
		}
	}
	if r.st.takes != 0 {
		t.Errorf("unlimited rule reached the store %d times", r.st.takes)
	}
}

func TestCheck_Replaces(t *testing.T) {
	r := newRig(t, limiter.Options{})
	// big replaces small: small reports "no rule" and is not counted.
	for range 6 {
		resp := r.check(t, &limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("small", "x"), desc("big", "x")}})
		if s := &resp.Statuses[0]; s.Code != limiter.OK || s.Limited || s.Rule != nil {
			t.Fatalf("replaced descriptor: %+v", s)
		}
		if b := &resp.Statuses[1]; !b.Limited || b.RequestsPerUnit != 100 {
			t.Fatalf("replacing descriptor: %+v", b)
		}
	}
	// small alone still has all of its 5.
	resp := r.check(t, &limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("small", "x")}})
	if got := resp.Statuses[0].Remaining(); got != 4 {
		t.Errorf("small after being replaced 6 times: remaining %d, want 4", got)
	}
	// An unlimited rule's replaces act too.
	resp = r.check(t, &limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("free", "x"), desc("small", "x")}})
	if s := &resp.Statuses[1]; s.Limited {
		t.Errorf("replaced by an unlimited rule: %+v", s)
	}
}

func TestCheck_RuleShadowMode(t *testing.T) {
	r := newRig(t, limiter.Options{})
	req := limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("shadow", "x")}}
	r.check(t, &req)
	resp := r.check(t, &req)
	st := &resp.Statuses[0]
	if resp.Overall != limiter.OK || st.Code != limiter.OK || !st.Limited || st.RequestsPerUnit != 1 || st.Decision.Allowed {
		t.Errorf("shadow rule over its limit: overall %v status %+v; want OK, limit kept, decision denied", resp.Overall, st)
	}
	// A shadow rule never denies the others, and consumes only when
	// the request is allowed.
	r.check(t, &limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("fw", "s")}})
	r.check(t, &limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("fw", "s")}})
	resp = r.check(t, &limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("shadow", "fresh"), desc("fw", "s")}})
	if resp.Overall != limiter.OverLimit {
		t.Fatalf("fw over: overall %v", resp.Overall)
	}
	resp = r.check(t, &limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("shadow", "fresh")}})
	if !resp.Statuses[0].Decision.Allowed {
		t.Errorf("shadow rule consumed by a denied request")
	}
}

func TestCheck_GlobalShadowMode(t *testing.T) {
	r := newRig(t, limiter.Options{ShadowMode: true})
	req := limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("fw", "x")}, HitsAddend: 3}
	resp := r.check(t, &req)
	if resp.Overall != limiter.OK || resp.Statuses[0].Code != limiter.OverLimit {
		t.Errorf("global shadow: overall %v status %v; want OK, OVER_LIMIT", resp.Overall, resp.Statuses[0].Code)
	}
}

func TestCheck_AllOrNothing(t *testing.T) {
	r := newRig(t, limiter.Options{})
	// fw/x has 2; a request of 3 on fw/x and 1 on tb/a is denied as a
	// whole: tb/a reports OK with its remaining unchanged.
	resp := r.check(t, &limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("tb", "a"), withCost(desc("fw", "x"), 3)}})
	if resp.Overall != limiter.OverLimit || resp.Statuses[0].Code != limiter.OK || resp.Statuses[1].Code != limiter.OverLimit {
		t.Fatalf("codes: overall %v, %v, %v", resp.Overall, resp.Statuses[0].Code, resp.Statuses[1].Code)
	}
	if got := resp.Statuses[0].Remaining(); got != 20 {
		t.Errorf("within-limit descriptor of a denied request: remaining %d, want 20 (unchanged)", got)
	}
	resp = r.check(t, &limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{withCost(desc("tb", "a"), 0), withCost(desc("fw", "x"), 0)}})
	if a, b := resp.Statuses[0].Remaining(), resp.Statuses[1].Remaining(); a != 20 || b != 2 {
		t.Errorf("after the denied request: remaining %d, %d; want 20, 2", a, b)
	}
}

func TestCheck_DeniedHitsSaturate(t *testing.T) {
	r := newRig(t, limiter.Options{SaturateDenied: true})
	resp := r.check(t, &limiter.Request{Domain: "test", HitsAddend: 25, Descriptors: []limiter.Descriptor{desc("tb", "a")}})
	if resp.Overall != limiter.OverLimit {
		t.Fatalf("25 of 20: %v", resp.Overall)
	}
	resp = r.check(t, &limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{withCost(desc("tb", "a"), 0)}})
	if got := resp.Statuses[0].Remaining(); got != 0 {
		t.Errorf("saturate: remaining %d after a denied 25, want 0", got)
	}
}

func TestCheck_Override(t *testing.T) {
	r := newRig(t, limiter.Options{})
	ov := func(d limiter.Descriptor) limiter.Descriptor {
		d.Override = limiter.Override{RequestsPerUnit: 1, Unit: config.Hour}
		return d
	}
	steps := []struct {
		name    string
		req     limiter.Request
		overall limiter.Code
		w       want
	}{
		// The override replaces the rule (and its shadow mode).
		{"override on a rule", limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{ov(desc("shadow", "o"))}}, limiter.OK,
			want{code: limiter.OK, limited: true, rpu: 1, remaining: 0, reset: time.Hour}},
		{"override on a rule, again", limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{ov(desc("shadow", "o"))}}, limiter.OverLimit,
			want{code: limiter.OverLimit, limited: true, rpu: 1, remaining: 0, reset: time.Hour}},
		{"override without a rule", limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{ov(desc("nomatch", "o"))}}, limiter.OK,
			want{code: limiter.OK, limited: true, rpu: 1, remaining: 0, reset: time.Hour}},
		{"override in an unknown domain", limiter.Request{Domain: "other", Descriptors: []limiter.Descriptor{ov(desc("x", "o"))}}, limiter.OK,
			want{code: limiter.OK}},
	}
	for _, s := range steps {
		resp := r.check(t, &s.req)
		if resp.Overall != s.overall {
			t.Errorf("%s: overall %v, want %v", s.name, resp.Overall, s.overall)
		}
		s.w.check(t, s.name, 0, &resp.Statuses[0])
	}
	if n := len(r.obs.rules); n != 3 || r.obs.rules[0] != nil {
		t.Errorf("observer saw %d overrides (%v), want 3 with a nil rule", n, r.obs.rules)
	}
}

func TestValidate(t *testing.T) {
	r := newRig(t, limiter.Options{MaxDescriptors: 2, MaxEntries: 2})
	cases := []struct {
		name   string
		req    limiter.Request
		reason string
	}{
		{"empty domain", limiter.Request{Descriptors: []limiter.Descriptor{desc("a", "b")}}, "domain must not be empty"},
		{"no descriptors", limiter.Request{Domain: "test"}, "at least one descriptor"},
		{"too many descriptors", limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("a", "b"), desc("a", "b"), desc("a", "b")}}, "3 descriptors exceed the limit of 2"},
		{"too many entries", limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("a", "b", "c", "d", "e", "f")}}, "descriptor 0: 3 entries exceed the limit of 2"},
		{"empty key", limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("a", "b"), desc("", "b")}}, "descriptor 1: entry 0 has an empty key"},
		{"override too long", limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{{Entries: desc("a", "b").Entries, Override: limiter.Override{RequestsPerUnit: 3, Unit: config.Year, UnitMultiplier: 1000}}}}, "too long"},
		{"unknown override unit", limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{{Entries: desc("a", "b").Entries, Override: limiter.Override{RequestsPerUnit: 3}}}}, "unknown unit"},
	}
	for _, c := range cases {
		var resp limiter.Response
		err := r.lim.Check(context.Background(), &c.req, &resp)
		var inv *limiter.InvalidError
		if !errors.As(err, &inv) || !strings.Contains(inv.Reason, c.reason) {
			t.Errorf("%s: err = %v, want an InvalidError containing %q", c.name, err, c.reason)
		}
	}
	// An empty value and a long value are not errors.
	req := limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("fw", ""), desc("fw", strings.Repeat("v", 10000))}}
	if err := r.lim.Check(context.Background(), &req, new(limiter.Response)); err != nil {
		t.Errorf("empty and long values: %v", err)
	}
}

func TestCheck_Errors(t *testing.T) {
	r := newRig(t, limiter.Options{})
	req := limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("fw", "x")}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.lim.Check(ctx, &req, new(limiter.Response)); !errors.Is(err, context.Canceled) {
		t.Errorf("done context: err %v, want context.Canceled", err)
	}
	if r.st.takes != 0 {
		t.Errorf("done context reached the store")
	}
	noTable := limiter.New(tables{}, r.st, limiter.Options{})
	if err := noTable.Check(context.Background(), &req, new(limiter.Response)); !errors.Is(err, limiter.ErrNoConfig) {
		t.Errorf("no table: err %v, want ErrNoConfig", err)
	}
}

func TestCheck_StoreFailure(t *testing.T) {
	boom := errors.New("boom")
	for _, c := range []struct {
		mode    limiter.FailureMode
		overall limiter.Code
	}{{limiter.FailAllow, limiter.OK}, {limiter.FailDeny, limiter.OverLimit}} {
		r := newRig(t, limiter.Options{FailureMode: c.mode})
		r.st.fail = boom
		resp := r.check(t, &limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("fw", "x"), desc("shadow", "x"), desc("none", "x")}})
		if resp.Overall != c.overall || resp.Statuses[0].Code != c.overall || resp.Statuses[1].Code != limiter.OK || resp.Statuses[2].Limited {
			t.Errorf("%v: overall %v statuses %v %v %v", c.mode, resp.Overall, resp.Statuses[0].Code, resp.Statuses[1].Code, resp.Statuses[2].Limited)
		}
		if r.obs.failures != 1 || r.obs.mode != c.mode {
			t.Errorf("%v: observer saw %d failures in mode %v", c.mode, r.obs.failures, r.obs.mode)
		}
	}
	r := newRig(t, limiter.Options{})
	r.st.fail = boom
	var se *limiter.StoreError
	err := r.lim.Check(context.Background(), &limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("fw", "x")}}, new(limiter.Response))
	if !errors.As(err, &se) || !errors.Is(err, boom) {
		t.Errorf("error mode: err %v, want a StoreError wrapping boom", err)
	}
}

func TestParseFailureMode(t *testing.T) {
	for _, s := range []string{"error", "allow", "deny"} {
		m, err := limiter.ParseFailureMode(s)
		if err != nil || m.String() != s {
			t.Errorf("ParseFailureMode(%q) = %v, %v", s, m, err)
		}
	}
	if _, err := limiter.ParseFailureMode("open"); err == nil {
		t.Error(`ParseFailureMode("open"): no error`)
	}
}

func TestResponse_MostRestrictive(t *testing.T) {
	r := newRig(t, limiter.Options{})
	resp := r.check(t, &limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("none", "x"), desc("tb", "a"), desc("fw", "x")}})
	if i := resp.MostRestrictive(); i != 2 {
		t.Errorf("MostRestrictive = %d, want 2 (fw: 1 left)", i)
	}
	resp = r.check(t, &limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("none", "x")}})
	if i := resp.MostRestrictive(); i != -1 {
		t.Errorf("MostRestrictive with no limit = %d, want -1", i)
	}
}

func TestObserver(t *testing.T) {
	r := newRig(t, limiter.Options{})
	r.check(t, &limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("fw", "x"), desc("none", "x"), desc("free", "x")}})
	if len(r.obs.rules) != 2 || r.obs.rules[0].Name != "fw_rule" || r.obs.rules[1].Name != "free_rule" {
		t.Errorf("observer saw %v, want fw_rule and free_rule", r.obs.rules)
	}
}

// TestCheck_Concurrent: N goroutines on one 2-per-minute rule, exactly 2
// succeed.
func TestCheck_Concurrent(t *testing.T) {
	r := newRig(t, limiter.Options{})
	var ok atomic.Int32
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			var resp limiter.Response
			req := limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("fw", "c")}}
			if err := r.lim.Check(context.Background(), &req, &resp); err != nil {
				t.Error(err)
			}
			if resp.Overall == limiter.OK {
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 2 {
		t.Errorf("%d of 32 allowed, want 2", ok.Load())
	}
}

type recorder struct {
	mu       sync.Mutex
	rules    []*config.Rule
	failures int
	mode     limiter.FailureMode
}

func (r *recorder) Observe(_ string, _ []config.Entry, rule *config.Rule, _ *limiter.Status) {
	r.mu.Lock()
	r.rules = append(r.rules, rule)
	r.mu.Unlock()
}

func (r *recorder) StoreFailed(_ string, mode limiter.FailureMode, _ error) {
	r.mu.Lock()
	r.failures++
	r.mode = mode
	r.mu.Unlock()
}
