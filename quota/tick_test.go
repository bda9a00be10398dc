package quota

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store"
)

// The tests below take Tick's phases one at a time (measure, exchange,
// divide, push), calling each with s.mu held as Tick does; the tests of
// service_test.go and bounds_test.go run whole Ticks.

// theGroup returns s's only group; s.mu is held.
func theGroup(t *testing.T, s *Service) *group {
	t.Helper()
	if len(s.groups) != 1 {
		t.Fatalf("%d groups, want 1", len(s.groups))
	}
	for _, g := range s.groups {
		return g
	}
	return nil
}

// theSub returns st's only subscription; s.mu is held.
func theSub(t *testing.T, st *Stream) *sub {
	t.Helper()
	if len(st.subs) != 1 {
		t.Fatalf("%d buckets on the stream, want 1", len(st.subs))
	}
	for _, b := range st.subs {
		return b
	}
	return nil
}

// recordingFleet grants every claim its Max, records what it is given,
// and checks that the Service's lock is free while it runs.
type recordingFleet struct {
	s        *Service
	t        *testing.T
	deadline time.Time
	local    map[string]store.Claim
	release  []string
	fail     string // a group whose claim fails
}

func (f *recordingFleet) Exchange(ctx context.Context, _ time.Time, local map[string]store.Claim, release []string) (store.Grants, error) {
	if !f.s.mu.TryLock() {
		f.t.Error("Exchange called with the Service locked")
	} else {
		f.s.mu.Unlock()
	}
	f.deadline, _ = ctx.Deadline()
	f.local, f.release = local, release
	g := store.Grants{Granted: map[string]float64{}, Live: 2}
	var err error
	for k, c := range local {
		if k == f.fail {
			err = errors.New("claim failed")
			continue
		}
		g.Granted[k] = c.Max
	}
	return g, err
}

// newFleetService is a Service on the test limits with a recordingFleet.
func newFleetService(t *testing.T, o Options) (*Service, *recordingFleet) {
	f := &recordingFleet{t: t}
	o.Fleet = f
	s, _ := newTestService(t, o)
	f.s = s
	return s, f
}

// TestMeasure: the first phase abandons idle buckets and returns the
// claims of this interval: a group's capacity (its limit less the
// reserve), at first at most an equal part per live replica, its
// proxies' demands; and the groups to give back.
func TestMeasure(t *testing.T) {
	s, _ := newFleetService(t, Options{IdleAbandon: 10 * time.Second})
	a, _ := s.Open()
	b, _ := s.Open()
	idle, _ := s.Open()
	mustReport(t, a, at(0), use("tenant", "x", 2000, 0))
	mustReport(t, a, at(0.5), use("tenant", "x", 2000, 0))
	mustReport(t, b, at(0.5), use("tenant", "x", 1, 0)) // a first report: no rate yet
	mustReport(t, idle, at(0), use("tenant", "idle", 1, 0))
	for _, st := range []*Stream{a, b, idle} {
		st.Pending()
	}

	local, release, claimed := s.measure(at(1))
	if len(local) != 2 || len(claimed) != 2 || len(release) != 0 {
		t.Fatalf("step 1: %d claims (%d groups), %v released; want 2 claims, none released", len(local), len(claimed), release)
	}
	s.mu.Lock()
	x := theSub(t, a).g
	s.mu.Unlock()
	c := local[x.key]
	slices.SortFunc(c.Demands, func(x, y store.Demand) int { return cmp.Compare(x.Peak, y.Peak) })
	if c.Capacity != 980 || c.Max != 980 || !slices.Equal(c.Demands, []store.Demand{{Low: 2000, Mean: 2000, Peak: 2000}, {Low: math.Inf(1), Mean: math.Inf(1), Peak: math.Inf(1)}}) {
		t.Errorf("step 1: claim on tenant=x %+v, want capacity 980, max 980 (no replica seen yet), demands [2000 +Inf]", c)
	}
	// Two live replicas, x not claimed yet: a first claim takes at most half.
	s.mu.Lock()
	s.live = 2
	s.mu.Unlock()
	if local, _, _ = s.measure(at(2)); local[x.key].Max != 490 {
		t.Errorf("step 2: a first claim with 2 live replicas has max %v, want 490", local[x.key].Max)
	}
	// Claimed, then its proxies leave: given back at the next measure.
	s.mu.Lock()
	s.applyGrants(at(2), store.Grants{Granted: map[string]float64{x.key: 490}, Live: 2}, []*group{x})
	s.mu.Unlock()
	a.Close()
	b.Close()
	// tenant=idle had no traffic for 10 s: abandoned, and not claimed.
	local, release, _ = s.measure(at(10))
	if len(local) != 0 || !slices.Equal(release, []string{x.key}) {
		t.Errorf("step 3: claims %v, released %v; want none, [%s]", local, release, x.key)
	}
	if as := idle.Pending(); len(as) != 1 || as[0].Kind != Abandon {
		t.Errorf("step 3: idle bucket got %+v, want abandon", as)
	}
	if local, release, _ = s.measure(at(11)); len(local) != 0 || len(release) != 0 {
		t.Errorf("step 4: claims %v, released %v; want nothing", local, release)
	}
}

// TestExchange: the second phase runs the Fleet's Exchange without the
// Service's lock, for at most one interval, and counts the failed claims.
func TestExchange(t *testing.T) {
	s, _ := newTestService(t, Options{})
	if g, err := s.exchange(context.Background(), at(0), nil, nil); err != nil || g.Granted != nil || g.Live != 0 {
		t.Errorf("without a fleet: %+v, %v; want nothing", g, err)
	}

	s, f := newFleetService(t, Options{Interval: time.Hour})
	f.fail = "g2"
	local := map[string]store.Claim{"g1": {Capacity: 10, Max: 5}, "g2": {Capacity: 10, Max: 5}, "g3": {Capacity: 10, Max: 4}}
	start := time.Now()
	g, err := s.exchange(context.Background(), at(0), local, []string{"gone"})
	if err == nil || !maps.Equal(g.Granted, map[string]float64{"g1": 5, "g3": 4}) || g.Live != 2 {
		t.Errorf("one claim failing: %+v, %v; want g1 and g3 granted, the error", g, err)
	}
	if !slices.Equal(f.release, []string{"gone"}) || len(f.local) != 3 {
		t.Errorf("the fleet got %d claims, released %v; want 3, [gone]", len(f.local), f.release)
	}
	if f.deadline.IsZero() || f.deadline.Before(start) || f.deadline.After(time.Now().Add(time.Hour)) {
		t.Errorf("the exchange's deadline is %v from its start, want at most the interval (1h)", f.deadline.Sub(start))
	}
	if st := s.Stats(); st.FleetErrors != 1 || st.ClaimErrors != 1 {
		t.Errorf("%d fleet errors, %d claim errors; want 1 and 1", st.FleetErrors, st.ClaimErrors)
	}
}

// TestDivide: the third phase divides each group's limit, or the part
// this replica may give, max-min fairly among its proxies (a proxy with
// one report wants an equal share), and queues nothing.
func TestDivide(t *testing.T) {
	cases := []struct {
		name   string
		fleet  bool
		grants *store.Grants // applied before dividing, if any
		// want is the three proxies' shares, assigned what the group
		// counts as held.
		want     []uint64
		assigned float64
	}{
		// 980 of 1000: the reserve is 2 %.
		{"alone", false, nil, []uint64{100, 300, 580}, 980},
		// Nothing exchanged yet: only the reserve, 20.
		{"uncertain", true, nil, []uint64{7, 7, 6}, 20},
		// 490 claimed of 2 replicas: the others hold 1000 - 490 - 10.
		{"shared", true, &store.Grants{Live: 2}, []uint64{100, 195, 195}, 990},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var s *Service
			if c.fleet {
				s, _ = newFleetService(t, Options{})
			} else {
				s, _ = newTestService(t, Options{})
			}
			var sts []*Stream
			for _, n := range []uint64{100, 300, 9000} {
				st, _ := s.Open()
				mustReport(t, st, at(0), use("tenant", "x", n, 0))
				if n != 9000 {
					mustReport(t, st, at(0.5), use("tenant", "x", n, 0))
				}
				st.Pending()
				sts = append(sts, st)
			}
			s.mu.Lock()
			g := theGroup(t, s)
			if c.grants != nil {
				c.grants.Granted = map[string]float64{g.key: 490}
				s.applyGrants(at(1), *c.grants, []*group{g})
			}
			s.divide(at(1))
			var got []uint64
			for _, st := range sts {
				got = append(got, theSub(t, st).share)
			}
			wanted := theSub(t, sts[1]).wanted
			assigned := g.assigned
			s.mu.Unlock()
			if !slices.Equal(got, c.want) || assigned != c.assigned {
				t.Errorf("shares %v, assigned %v; want %v, %v", got, assigned, c.want, c.assigned)
			}
			if wanted != 300 {
				t.Errorf("the second proxy wants %v, want 300", wanted)
			}
			for i, st := range sts {
				if as := st.Pending(); len(as) != 0 {
					t.Errorf("proxy %d: divide queued %+v", i, as)
				}
			}
		})
	}
}

// TestPush: the last phase sends a bucket its share only when due: a fall
// at once, a rise past the threshold or while the proxy wants more than
// it holds, and before the TTL runs out; a token bucket only when its
// share moves past the threshold; a bucket without a limit its answer
// again before the TTL runs out.
func TestPush(t *testing.T) {
	s, _ := newTestService(t, Options{Reserve: -1})
	fw, _ := s.Open()
	tb, _ := s.Open()
	free, _ := s.Open()
	mustReport(t, fw, at(0), use("tenant", "x", 1, 0)) // answered 500 at once
	mustReport(t, tb, at(0), use("api", "x", 1, 0))    // answered 300 at once
	mustReport(t, free, at(0), use("free", "x", 1, 0)) // allowed at once
	for _, st := range []*Stream{fw, tb, free} {
		st.Pending()
	}
	steps := []struct {
		at       float64
		fwShare  uint64 // tenant=x's, a fixed window: requests per unit
		wanted   float64
		tbShare  uint64 // api=x's, a token bucket
		fw, tb   bool   // pushed
		answered bool   // free=x
	}{
		{1, 500, 400, 300, false, false, false}, // nothing changed
		{2, 510, 400, 310, false, false, false}, // +2 % wanting less than it holds; +3 %
		{3, 510, 600, 290, true, false, false},  // wants more than it holds; -3 %
		{4, 500, 600, 320, true, true, false},   // falls: at once; +7 %
		{5, 530, 600, 320, true, false, false},  // +6 %
		// free=x was answered at 0: its answer expires at 10, re-sent
		// two intervals before.
		{9.5, 530, 600, 320, false, false, true},
		{12.5, 530, 600, 320, false, true, false}, // api=x expires at 14
		{13.5, 530, 600, 320, true, false, false}, // tenant=x at 15
	}
	for i, c := range steps {
		s.mu.Lock()
		b := theSub(t, fw)
		b.share, b.wanted = c.fwShare, c.wanted
		theSub(t, tb).share = c.tbShare
		s.push(at(c.at))
		s.mu.Unlock()
		for _, p := range []struct {
			name string
			st   *Stream
			want bool
		}{{"tenant=x", fw, c.fw}, {"api=x", tb, c.tb}, {"free=x", free, c.answered}} {
			as := p.st.Pending()
			if got := len(as) == 1; got != p.want || len(as) > 1 {
				t.Errorf("step %d (at %vs; tenant=x %d wanting %v, api=x %d): %s got %+v, want pushed %v",
					i, c.at, c.fwShare, c.wanted, c.tbShare, p.name, as, p.want)
			}
		}
	}
}
