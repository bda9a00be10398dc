package limiter_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

const chargeLimits = `
domain: test
descriptors:
  - key: budget
    rate_limit: {unit: minute, requests_per_unit: 100, name: budget}
  - key: x
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: q
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: two
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: zero
    rate_limit: {unit: minute, requests_per_unit: 0}
`

func newChargeRig(t *testing.T, opts limiter.Options) *rig {
	r := &rig{st: newMapStore(), clock: &fakeClock{}, obs: &recorder{}}
	r.clock.now.Store(t0)
	opts.Clock, opts.Observer = r.clock, r.obs
	r.lim = limiter.New(tables{loadTable(t, chargeLimits)}, r.st, opts)
	return r
}

func charge(d limiter.Descriptor, cost uint64) limiter.Descriptor {
	d = withCost(d, cost)
	d.Kind = limiter.Charge
	return d
}

func refund(d limiter.Descriptor, cost uint64) limiter.Descriptor {
	d = withCost(d, cost)
	d.Kind = limiter.Refund
	return d
}

func request(ds ...limiter.Descriptor) *limiter.Request {
	return &limiter.Request{Domain: "test", Descriptors: ds}
}

// TestCheck_PeeksAsTheReference replays the reference's
// integration-test/scripts/token-quota.sh (2 per minute, a peek with
// hits_addend 0 on each request and a charge of 1 when its stream ends:
// requests 1 to 3 pass, the 4th is refused) and Envoy AI Gateway's counts
// (a budget of N against a cost of C admits N/C + 1 calls; a limit of 0
// admits one call). With StrictPeeks a peek needs one more unit: a budget
// used up exactly admits no more.
func TestCheck_PeeksAsTheReference(t *testing.T) {
	for _, c := range []struct {
		key            string
		cost           uint64
		within, strict int
	}{
		{"two", 1, 3, 2},
		{"budget", 25, 5, 4},
		{"budget", 30, 4, 4},
		{"zero", 1, 1, 0},
	} {
		for _, strict := range []bool{false, true} {
			r := newChargeRig(t, limiter.Options{StrictPeeks: strict})
			admitted := 0
			for range 10 {
				if r.check(t, request(withCost(desc(c.key, "u"), 0))).Overall != limiter.OK {
					break
				}
				admitted++
				r.check(t, request(charge(desc(c.key, "u"), c.cost)))
			}
			want := c.within
			if strict {
				want = c.strict
			}
			if admitted != want {
				t.Errorf("%s, cost %d, strict %v: %d calls admitted, want %d", c.key, c.cost, strict, admitted, want)
			}
		}
	}
	// The reference's answer to a peek at the limit: OK, nothing
	// remaining, the time until the window ends.
	r := newChargeRig(t, limiter.Options{})
	r.check(t, request(charge(desc("two", "u"), 2)))
	r.clock.advance(20 * time.Second)
	resp := r.check(t, request(withCost(desc("two", "u"), 0)))
	if st := &resp.Statuses[0]; resp.Overall != limiter.OK || st.Code != limiter.OK || st.Remaining() != 0 || st.ResetAfter() != 40*time.Second {
		t.Errorf("peek at the limit: %v, status %v remaining %d reset %v; want OK, 0, 40s", resp.Overall, st.Code, st.Remaining(), st.ResetAfter())
	}
}

// TestCheck_ChargeRecordedWhole is the sequence: a budget of 100
// per minute, peeks before requests and the usage charged after them.
// With either --denied-hits mode, the charge past the limit is recorded
// whole and every later peek is OVER_LIMIT until the window ends.
func TestCheck_ChargeRecordedWhole(t *testing.T) {
	for _, opts := range []limiter.Options{{}, {SaturateDenied: true}} {
		r := newChargeRig(t, opts)
		peek := withCost(desc("budget", "u"), 0)
		for i, c := range []struct {
			name      string
			d         limiter.Descriptor
			advance   time.Duration
			code      limiter.Code
			remaining uint32
		}{
			{"peek", peek, 0, limiter.OK, 100},
			{"charge 80", charge(desc("budget", "u"), 80), 0, limiter.OK, 20},
			{"peek", peek, 0, limiter.OK, 20},
			{"charge 150", charge(desc("budget", "u"), 150), 0, limiter.OverLimit, 0},
			{"peek after the overspend", peek, time.Second, limiter.OverLimit, 0},
			{"a plain request", desc("budget", "u"), 0, limiter.OverLimit, 0},
			{"peek at the window's last second", peek, 58 * time.Second, limiter.OverLimit, 0},
			{"peek in the next window", peek, time.Second, limiter.OK, 100},
		} {
			r.clock.advance(c.advance)
			resp := r.check(t, request(c.d))
			if st := &resp.Statuses[0]; resp.Overall != c.code || st.Code != c.code || st.Remaining() != c.remaining {
				t.Errorf("saturate %v: step %d %s: %v, status %v remaining %d; want %v remaining %d",
					opts.SaturateDenied, i, c.name, resp.Overall, st.Code, st.Remaining(), c.code, c.remaining)
			}
		}
	}
}

// TestCheck_ChargeInARequest: a charge that does not fit denies its
// request, whose hits consume nothing; a charge or a refund in a denied
// request is recorded anyway.
func TestCheck_ChargeInARequest(t *testing.T) {
	r := newChargeRig(t, limiter.Options{})
	resp := r.check(t, request(desc("x", "a"), charge(desc("budget", "u"), 150)))
	if resp.Overall != limiter.OverLimit || resp.Statuses[0].Code != limiter.OK || resp.Statuses[1].Code != limiter.OverLimit {
		t.Fatalf("a hit and a charge past the limit: %v %v %v", resp.Overall, resp.Statuses[0].Code, resp.Statuses[1].Code)
	}
	if k := resp.Statuses[1].Kind; k != limiter.Charge {
		t.Errorf("the charge's status has kind %v", k)
	}
	resp = r.check(t, request(withCost(desc("x", "a"), 0), withCost(desc("budget", "u"), 0)))
	if x, b := resp.Statuses[0].Remaining(), resp.Statuses[1].Code; x != 10 || b != limiter.OverLimit {
		t.Errorf("after it: x has %d left (want 10: not consumed), the budget is %v (want over: recorded)", x, b)
	}

	resp = r.check(t, request(charge(desc("budget", "v"), 30), refund(desc("budget", "u"), 100), withCost(desc("x", "b"), 11)))
	if resp.Overall != limiter.OverLimit || resp.Statuses[0].Code != limiter.OK || resp.Statuses[1].Code != limiter.OK {
		t.Fatalf("a charge, a refund and a hit over its limit: %v %v %v", resp.Overall, resp.Statuses[0].Code, resp.Statuses[1].Code)
	}
	resp = r.check(t, request(withCost(desc("budget", "v"), 0), withCost(desc("budget", "u"), 0)))
	if v, u := resp.Statuses[0].Remaining(), resp.Statuses[1].Remaining(); v != 70 || u != 50 {
		t.Errorf("after a denied request: %d and %d left, want 70 (charged) and 50 (refunded)", v, u)
	}
}

// TestCheck_ChargeShadowRule: a shadow rule records the charge and
// answers OK.
func TestCheck_ChargeShadowRule(t *testing.T) {
	r := newChargeRig(t, limiter.Options{})
	resp := r.check(t, request(charge(desc("shadow", "a"), 5)))
	if resp.Overall != limiter.OK || resp.Statuses[0].Code != limiter.OK || resp.Statuses[0].Decision.Allowed {
		t.Fatalf("charge 5 of 1 in shadow mode: %v %+v", resp.Overall, resp.Statuses[0])
	}
	resp = r.check(t, request(withCost(desc("shadow", "a"), 0)))
	if resp.Overall != limiter.OK || resp.Statuses[0].Decision.Allowed {
		t.Fatalf("peek in shadow mode: %v %+v, want OK reporting the overspend", resp.Overall, resp.Statuses[0].Decision)
	}
}

// TestCheck_ChargeQuotaMode: a quota descriptor over its limit does not
// deny the request while another quota descriptor is within; the request
// is taken again without it, and its charge, recorded in the first round,
// is not recorded twice.
func TestCheck_ChargeQuotaMode(t *testing.T) {
	r := newChargeRig(t, limiter.Options{})
	resp := r.check(t, request(charge(desc("q", "a"), 10), desc("q", "b"), desc("x", "c")))
	if resp.Overall != limiter.OK || resp.Statuses[0].Code != limiter.OverLimit || resp.Statuses[1].Code != limiter.OK {
		t.Fatalf("one quota descriptor charged past its limit: %v %v %v", resp.Overall, resp.Statuses[0].Code, resp.Statuses[1].Code)
	}
	r.check(t, request(refund(desc("q", "a"), 10)))
	resp = r.check(t, request(withCost(desc("q", "a"), 0), withCost(desc("q", "b"), 0), withCost(desc("x", "c"), 0)))
	if a, b, c := resp.Statuses[0].Remaining(), resp.Statuses[1].Remaining(), resp.Statuses[2].Remaining(); a != 5 || b != 4 || c != 9 {
		t.Errorf("remaining %d, %d, %d; want 5 (charged once, refunded), 4 and 9 (taken once)", a, b, c)
	}
}

// TestCheck_RefundNeverOver: a refund's status is OK with what is left,
// never below empty nor above the limit.
func TestCheck_RefundNeverOver(t *testing.T) {
	r := newChargeRig(t, limiter.Options{})
	r.check(t, request(charge(desc("budget", "u"), 130)))
	for i, c := range []struct {
		cost      uint64
		remaining uint32
	}{{20, 0}, {40, 30}, {1000, 100}} {
		resp := r.check(t, request(refund(desc("budget", "u"), c.cost)))
		if st := &resp.Statuses[0]; resp.Overall != limiter.OK || st.Code != limiter.OK || st.Remaining() != c.remaining || st.Kind != limiter.Refund {
			t.Errorf("refund %d (%d): %v %+v, want OK with %d left", i, c.cost, resp.Overall, st, c.remaining)
		}
	}
}
