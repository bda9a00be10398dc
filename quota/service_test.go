package quota

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/store"
)

const testLimits = `
domain: d
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000}
  - key: api
    rate_limit: {unit: minute, requests_per_unit: 600, algorithm: token_bucket, burst: 60}
  - key: free
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: closed
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: halfminute
    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 60}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: sliding_window}
  - key: calendar
    rate_limit: {unit: day, requests_per_unit: 86400, calendar: true, time_zone: Europe/Berlin}
`

// tables is a settable Tables.
type tables struct{ p atomic.Pointer[config.Table] }

func (t *tables) Current() *config.Table { return t.p.Load() }

func loadTable(t testing.TB, text string) *config.Table {
	t.Helper()
	p := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	tbl, err := config.Load(p, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

func newTestService(t testing.TB, o Options) (*Service, *tables) {
	tb := &tables{}
	tb.p.Store(loadTable(t, testLimits))
	return New(tb, o), tb
}

var t0 = time.Unix(1_800_000_000, 0)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

func use(k, v string, allowed, denied uint64) Usage {
	return Usage{Bucket: map[string]string{k: v}, Elapsed: time.Second, Allowed: allowed, Denied: denied}
}

// only returns the single pending action of st.
func only(t *testing.T, st *Stream, step string) Action {
	t.Helper()
	as := st.Pending()
	if len(as) != 1 {
		t.Fatalf("%s: %d actions pending, want 1: %+v", step, len(as), as)
	}
	return as[0]
}

func mustReport(t *testing.T, st *Stream, now time.Time, us ...Usage) {
	t.Helper()
	if err := st.Report(now, "d", us); err != nil {
		t.Fatalf("Report at %v: %v", now.Sub(t0), err)
	}
}

func TestService_FirstReportAnsweredAtOnce(t *testing.T) {
	s, _ := newTestService(t, Options{})
	st, err := s.Open()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		u    Usage
		want Kind
	}{
		{use("tenant", "a", 1, 0), RequestsPerUnit},
		{use("api", "x", 1, 0), TokenBucket},
		{use("free", "x", 1, 0), AllowAll},
		{use("shadow", "x", 1, 0), AllowAll},
		{use("closed", "x", 1, 0), DenyAll},
		{use("nomatch", "x", 1, 0), AllowAll},
		// Envoy names no period of several units, nor a sliding window,
		// nor a calendar period.
		{use("halfminute", "x", 1, 0), TokenBucket},
		{use("sliding", "x", 1, 0), TokenBucket},
		{use("calendar", "x", 1, 0), TokenBucket},
	}
	for i, c := range cases {
		mustReport(t, st, at(0), c.u)
		a := only(t, st, "first report")
		if a.Kind != c.want || a.TTL != DefaultTTL || !maps.Equal(a.Bucket, c.u.Bucket) {
			t.Errorf("case %d (%v): got %+v, want kind %v with TTL %v", i, c.u.Bucket, a, c.want, DefaultTTL)
		}
	}
	// The group's first proxy gets half the limit at once.
	mustReport(t, st, at(0.5), use("tenant", "b", 1, 0))
	if a := only(t, st, "tenant b"); a.Requests != 500 || a.Unit != config.Second {
		t.Errorf("first proxy of tenant=b: %+v, want 500/second", a)
	}
	// A second report of a known bucket queues nothing.
	mustReport(t, st, at(0.6), use("tenant", "b", 3, 0))
	if as := st.Pending(); len(as) != 0 {
		t.Errorf("second report queued %+v", as)
	}
}

func TestService_FairShares(t *testing.T) {
	s, _ := newTestService(t, Options{Reserve: 0.02})
	ctx := context.Background()
	var sts []*Stream
	for range 3 {
		st, _ := s.Open()
		sts = append(sts, st)
	}
	// Demands 100, 1000 and 2000 per second on a limit of 1000/s.
	demand := []uint64{100, 1000, 2000}
	for i, st := range sts {
		// The first report subscribes; the second measures demand.
		mustReport(t, st, at(0), use("tenant", "shared", 1, 0))
		mustReport(t, st, at(0.5), use("tenant", "shared", demand[i]/2, demand[i]/2))
		st.Pending()
	}
	if err := s.Tick(ctx, at(1)); err != nil {
		t.Fatal(err)
	}
	// 980 to divide: 100, then 440 each.
	want := []uint64{100, 440, 440}
	var sum uint64
	for i, st := range sts {
		a := only(t, st, "after the first tick")
		if a.Kind != RequestsPerUnit || a.Requests != want[i] {
			t.Errorf("stream %d: %+v, want %d/second", i, a, want[i])
		}
		sum += a.Requests
	}
	if sum > 1000 {
		t.Errorf("shares sum to %d > 1000", sum)
	}
	// Unchanged demand: nothing is pushed until the TTL nears.
	for step := 2; step <= 8; step++ {
		for i, st := range sts {
			mustReport(t, st, at(float64(step)), use("tenant", "shared", demand[i], 0))
		}
		if err := s.Tick(ctx, at(float64(step))); err != nil {
			t.Fatal(err)
		}
		for i, st := range sts {
			if as := st.Pending(); len(as) != 0 {
				t.Fatalf("step %d: stream %d got %+v with unchanged shares", step, i, as)
			}
		}
	}
	// At 9 s the 10 s TTL of the assignments sent at 1 s is two
	// intervals away: all are refreshed.
	if err := s.Tick(ctx, at(9.5)); err != nil {
		t.Fatal(err)
	}
	for i, st := range sts {
		if a := only(t, st, "refresh"); a.Requests != want[i] {
			t.Errorf("refresh of stream %d: %+v", i, a)
		}
	}
	// The third stream leaves: the second gets all but the first's 100.
	sts[2].Close()
	mustReport(t, sts[0], at(10), use("tenant", "shared", 100, 0))
	mustReport(t, sts[1], at(10), use("tenant", "shared", 1000, 0))
	if err := s.Tick(ctx, at(10)); err != nil {
		t.Fatal(err)
	}
	if a := only(t, sts[1], "after a leave"); a.Requests != 880 {
		t.Errorf("after the third stream left: %+v, want 880", a)
	}
	if as := sts[0].Pending(); len(as) != 0 {
		t.Errorf("stream 0's share did not change, yet got %+v", as)
	}
	if st := s.Stats(); st.Streams != 2 || st.Buckets != 2 {
		t.Errorf("stats %+v: want 2 streams, 2 buckets", st)
	}
}

func TestService_NewcomerFromReserve(t *testing.T) {
	s, _ := newTestService(t, Options{Reserve: 0.1})
	a, _ := s.Open()
	mustReport(t, a, at(0), use("tenant", "x", 5000, 0))
	a.Pending()
	s.Tick(context.Background(), at(1))
	if got := only(t, a, "alone"); got.Requests != 900 {
		t.Fatalf("a lone proxy: %+v, want 900 (limit less the reserve)", got)
	}
	b, _ := s.Open()
	mustReport(t, b, at(1.5), use("tenant", "x", 5000, 0))
	if got := only(t, b, "newcomer"); got.Requests != 50 {
		t.Fatalf("newcomer: %+v, want half the reserve (50)", got)
	}
	c, _ := s.Open()
	mustReport(t, c, at(1.6), use("tenant", "x", 5000, 0))
	if got := only(t, c, "second newcomer"); got.Requests != 25 {
		t.Fatalf("second newcomer: %+v, want 25", got)
	}
	s.Tick(context.Background(), at(2))
	for i, st := range []*Stream{a, b, c} {
		if got := only(t, st, "rebalanced"); got.Requests != 300 {
			t.Errorf("stream %d after the tick: %+v, want 300", i, got)
		}
	}
}

func TestService_FirstReportWantsAnEqualShare(t *testing.T) {
	s, _ := newTestService(t, Options{Reserve: -1})
	light, _ := s.Open()
	heavy, _ := s.Open()
	mustReport(t, heavy, at(0), use("tenant", "x", 1, 0))
	mustReport(t, heavy, at(0.5), use("tenant", "x", 5000, 0))
	// light's first report counts one request: not a rate of 1/s.
	mustReport(t, light, at(0.6), use("tenant", "x", 1, 0))
	light.Pending()
	heavy.Pending()
	s.Tick(context.Background(), at(1))
	if a := only(t, light, "light"); a.Requests != 500 {
		t.Errorf("a proxy with one report: %+v, want an equal share (500)", a)
	}
	mustReport(t, light, at(1.6), use("tenant", "x", 10, 0))
	s.Tick(context.Background(), at(2))
	if a := only(t, light, "light measured"); a.Requests != 10 {
		t.Errorf("light after its second report: %+v, want 10", a)
	}
}

func TestService_TokenBucketShares(t *testing.T) {
	s, _ := newTestService(t, Options{Reserve: -1})
	sts := []*Stream{}
	for range 2 {
		st, _ := s.Open()
		mustReport(t, st, at(0), use("api", "k", 100, 0)) // 6000/min each
		sts = append(sts, st)
	}
	s.Tick(context.Background(), at(1))
	for i, st := range sts {
		as := st.Pending()
		a := as[len(as)-1]
		// 300 per minute: one token every 200 ms, burst 30.
		if a.Kind != TokenBucket || a.TokensPerFill != 1 || a.FillInterval != 200*time.Millisecond || a.MaxTokens != 30 {
			t.Errorf("stream %d: %+v", i, a)
		}
	}
}

func TestService_IdleAbandon(t *testing.T) {
	s, _ := newTestService(t, Options{IdleAbandon: 30 * time.Second})
	st, _ := s.Open()
	mustReport(t, st, at(0), use("tenant", "x", 1, 0), use("tenant", "y", 1, 0))
	st.Pending()
	for sec := 1; sec <= 40; sec++ {
		us := []Usage{use("tenant", "y", 1, 0)}
		if sec <= 30 { // as Envoy, which forgets an abandoned bucket
			us = append(us, use("tenant", "x", 0, 0))
		}
		mustReport(t, st, at(float64(sec)), us...)
		s.Tick(context.Background(), at(float64(sec)))
		for _, a := range st.Pending() {
			if a.Kind == Abandon {
				if sec != 30 || a.Bucket["tenant"] != "x" {
					t.Fatalf("at %ds: abandoned %v; want x at 30s", sec, a.Bucket)
				}
			}
		}
	}
	if n := st.Buckets(); n != 1 {
		t.Errorf("%d buckets after abandoning x, want 1", n)
	}
	// x reported again: subscribed again and answered at once.
	mustReport(t, st, at(41), use("tenant", "x", 1, 0))
	if a := only(t, st, "resubscribe"); a.Kind != RequestsPerUnit {
		t.Errorf("resubscribed x: %+v", a)
	}
}

func TestService_ReloadReassigns(t *testing.T) {
	s, tb := newTestService(t, Options{Reserve: -1})
	st, _ := s.Open()
	mustReport(t, st, at(0), use("tenant", "x", 10, 0), use("free", "y", 10, 0))
	st.Pending()
	s.Tick(context.Background(), at(1))
	st.Pending()
	tb.p.Store(loadTable(t, `
domain: d
descriptors:
  - key: tenant
    rate_limit: {unlimited: true}
  - key: free
    rate_limit: {unit: minute, requests_per_unit: 60}
`))
	s.Tick(context.Background(), at(1.5))
	got := map[string]Action{}
	for _, a := range st.Pending() {
		for k := range a.Bucket {
			got[k] = a
		}
	}
	if got["tenant"].Kind != AllowAll || got["free"].Kind != RequestsPerUnit || got["free"].Requests != 60 || got["free"].Unit != config.Minute {
		t.Errorf("after the reload: %+v", got)
	}
}

// TestService_ReloadChangesSharedLimit: a reload that lowers a fixed
// window's limit (its counter key unchanged) reaches a group of two
// proxies: they share the new limit, not the old one.
func TestService_ReloadChangesSharedLimit(t *testing.T) {
	s, tb := newTestService(t, Options{Reserve: -1})
	a, _ := s.Open()
	b, _ := s.Open()
	for _, now := range []float64{0, 0.5} {
		mustReport(t, a, at(now), use("tenant", "x", 5000, 0))
		mustReport(t, b, at(now), use("tenant", "x", 5000, 0))
	}
	s.Tick(context.Background(), at(1))
	a.Pending()
	b.Pending()
	tb.p.Store(loadTable(t, "domain: d\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 100}\n"))
	s.Tick(context.Background(), at(1.5))
	for i, st := range []*Stream{a, b} {
		if got := only(t, st, "after the reload"); got.Kind != RequestsPerUnit || got.Requests != 50 {
			t.Errorf("proxy %d after the limit went from 1000 to 100 per second: %+v, want 50 per second", i, got)
		}
	}
}

func TestService_BadReports(t *testing.T) {
	s, _ := newTestService(t, Options{MaxBucketsPerStream: 3})
	st, _ := s.Open()
	if err := st.Report(at(0), "", []Usage{use("tenant", "ok", 1, 0)}); !errors.Is(err, ErrInvalid) {
		t.Errorf("a first report without a domain: %v, want ErrInvalid", err)
	}
	bad := []Usage{
		{Bucket: nil, Elapsed: time.Second},
		{Bucket: map[string]string{"": "v"}, Elapsed: time.Second},
		{Bucket: map[string]string{"k": "v"}, Elapsed: -time.Second},
		{Bucket: map[string]string{"k": "v"}, Elapsed: 25 * time.Hour},
		{Bucket: map[string]string{"k": "v"}, Elapsed: time.Second, Allowed: 1 << 41},
		{Bucket: map[string]string{"k": strings.Repeat("v", MaxValueBytes+1)}, Elapsed: time.Second},
		// Every value within its bound, the bucket id too large together.
		{Bucket: map[string]string{"a": strings.Repeat("v", MaxValueBytes), "b": strings.Repeat("v", MaxValueBytes), "c": "v"}, Elapsed: time.Second},
	}
	for i, u := range bad {
		if err := st.Report(at(0), "d", []Usage{use("tenant", "ok", 1, 0), u}); !errors.Is(err, ErrInvalid) {
			t.Errorf("case %d: Report(%+v) = %v, want ErrInvalid", i, u, err)
		}
	}
	if n := st.Buckets(); n != 0 {
		t.Errorf("rejected reports subscribed %d buckets", n)
	}
	mustReport(t, st, at(0), use("tenant", "1", 1, 0), use("tenant", "2", 1, 0))
	err := st.Report(at(0), "d", []Usage{use("tenant", "3", 1, 0), use("tenant", "4", 1, 0)})
	if !errors.Is(err, ErrTooManyBuckets) {
		t.Errorf("going over the cap: %v, want ErrTooManyBuckets", err)
	}
	if n := st.Buckets(); n != 2 {
		t.Errorf("%d buckets after the refused report, want 2", n)
	}
	if got := s.Stats().Rejected; got != uint64(len(bad))+2 {
		t.Errorf("Rejected = %d, want %d", got, len(bad)+2)
	}
}

// fakeFleet is a Fleet shared by services in one test, claiming parts
// as store/redis's demand.lua does: each publishes under its name, and
// every name that has published is live.
type fakeFleet struct {
	name string
	all  map[string]map[string]fakeEntry // replica → group → entry
	fail bool
}

type fakeEntry struct {
	held    float64
	demands []store.Demand
}

func (f *fakeFleet) Exchange(_ context.Context, _ time.Time, local map[string]store.Claim, _ []string) (store.Grants, error) {
	if f.fail {
		return store.Grants{}, errors.New("down")
	}
	mine := map[string]fakeEntry{}
	f.all[f.name] = mine
	remote := store.Grants{Granted: map[string]float64{}, Live: len(f.all)}
	for k, cl := range local {
		ds := slices.Clone(cl.Demands)
		var others float64
		for n, gs := range f.all {
			if e, ok := gs[k]; ok && n != f.name {
				others += e.held
				ds = append(ds, e.demands...)
			}
		}
		var d Divider
		level, extra := d.Level(ds, cl.Capacity)
		var fair float64
		for _, h := range cl.Demands {
			fair += ExpectedUse(h, level, extra, cl.Capacity)
		}
		grant := max(min(fair, cl.Max, cl.Capacity-others), 0)
		mine[k] = fakeEntry{held: grant, demands: cl.Demands}
		remote.Granted[k] = grant
	}
	return remote, nil
}

func TestService_FleetDividesGlobally(t *testing.T) {
	all := map[string]map[string]fakeEntry{}
	fa := &fakeFleet{name: "a", all: all}
	fb := &fakeFleet{name: "b", all: all}
	sa, _ := newTestService(t, Options{Reserve: -1, Fleet: fa})
	sb, _ := newTestService(t, Options{Reserve: -1, Fleet: fb})
	pa, _ := sa.Open()
	pb1, _ := sb.Open()
	pb2, _ := sb.Open()
	for _, st := range []*Stream{pa, pb1, pb2} {
		mustReport(t, st, at(0), use("tenant", "g", 2000, 0))
		st.Pending()
	}
	ctx := context.Background()
	for _, now := range []float64{1, 2} {
		sa.Tick(ctx, at(now))
		sb.Tick(ctx, at(now))
	}
	var sum uint64
	for i, st := range []*Stream{pa, pb1, pb2} {
		var last Action
		for _, a := range st.Pending() {
			last = a
		}
		if last.Requests < 333 || last.Requests > 334 {
			t.Errorf("proxy %d: %+v, want a third of 1000", i, last)
		}
		sum += last.Requests
	}
	if sum > 1000 {
		t.Errorf("fleet shares sum to %d > 1000", sum)
	}
	// The fleet fails: the last known demand holds until the TTL passes.
	fa.fail = true
	if err := sa.Tick(ctx, at(3)); err == nil {
		t.Error("Tick with a failing fleet returned no error")
	}
	if got := sa.Stats().FleetErrors; got != 1 {
		t.Errorf("FleetErrors = %d, want 1", got)
	}
}

func TestService_FixedWindowAsTokenBucket(t *testing.T) {
	s, _ := newTestService(t, Options{Reserve: -1, FixedWindowAsTokenBucket: true})
	st, _ := s.Open()
	mustReport(t, st, at(0), use("tenant", "x", 5000, 0))
	st.Pending()
	s.Tick(context.Background(), at(1))
	// 1000 per second: one token a millisecond, holding at most 100.
	if a := only(t, st, "fixed window as a token bucket"); a.Kind != TokenBucket || a.TokensPerFill != 1 ||
		a.FillInterval != time.Millisecond || a.MaxTokens != 100 {
		t.Errorf("got %+v", a)
	}
}

// TestService_RoundingIsStable: 40 proxies on 980 (1000 less 2 %) get 24
// or 25, the same ones every interval, and nothing is pushed while
// demands hold.
func TestService_RoundingIsStable(t *testing.T) {
	s, _ := newTestService(t, Options{})
	var sts []*Stream
	for range 40 {
		st, _ := s.Open()
		mustReport(t, st, at(0), use("tenant", "x", 1, 0))
		sts = append(sts, st)
	}
	held := make([]uint64, len(sts))
	for step := 1; step <= 6; step++ {
		now := at(float64(step))
		for _, st := range sts {
			mustReport(t, st, now, use("tenant", "x", 40, 0))
		}
		s.Tick(context.Background(), now)
		var sum uint64
		for i, st := range sts {
			for _, a := range st.Pending() {
				if step > 2 {
					t.Errorf("step %d: stream %d got %+v with steady demand", step, i, a)
				}
				held[i] = a.Requests
			}
			sum += held[i]
		}
		if step >= 2 && sum != 980 {
			t.Errorf("step %d: shares sum to %d, want 980", step, sum)
		}
	}
}

// TestService_ConcurrentStreams reports, opens, closes and ticks from
// many goroutines (run it with -race); after every tick the shares sent
// to the streams of one limit never sum above it with an overcommit of
// 1, nor above the overcommit times it by default.
func TestService_ConcurrentStreams(t *testing.T) {
	for _, overcommit := range []float64{1, DefaultOvercommit} {
		t.Run(fmt.Sprintf("overcommit=%v", overcommit), func(t *testing.T) {
			concurrentStreams(t, overcommit)
		})
	}
}

func concurrentStreams(t *testing.T, overcommit float64) {
	s, _ := newTestService(t, Options{Overcommit: overcommit})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				st, _ := s.Open()
				for j := range 5 {
					_ = st.Report(at(float64(j)/10), "d", []Usage{use("tenant", "x", uint64(10*g+j), 0), use("api", strconv.Itoa(i%3), 1, 0)})
					st.Pending()
				}
				st.Close()
			}
		})
	}
	for i := range 200 {
		s.Tick(context.Background(), at(float64(i)/100))
		s.mu.Lock()
		for _, g := range s.groups {
			var sum uint64
			for b := range g.subs {
				sum += b.sentShare
			}
			// Token buckets hold up to the threshold more (see due).
			bound := float64(g.rule.Limit.Limit())
			switch {
			case overcommit > 1 && g.rule.Algorithm == store.TokenBucket:
				bound *= overcommit * (1 + DefaultThreshold)
			case overcommit > 1:
				bound *= overcommit
			case g.rule.Algorithm == store.TokenBucket:
				bound *= (1 - DefaultReserve) * (1 + DefaultThreshold)
			}
			if float64(sum) > bound {
				t.Errorf("tick %d: group %s holds %d > %g", i, g.key, sum, bound)
			}
		}
		s.mu.Unlock()
	}
	close(stop)
	wg.Wait()
	if st := s.Stats(); st.Streams != 0 || st.Buckets != 0 {
		t.Errorf("after every stream closed: %+v", st)
	}
}

// fleetSim walks replicas sharing one fakeFleet through time, tracking
// what every proxy holds of the limit tenant=x (1000/s).
type fleetSim struct {
	t        *testing.T
	replicas []*Service
	proxies  [][]*Stream // by replica
	held     map[*Stream]uint64
	bound    uint64 // the most the proxies may hold
}

func newFleetSim(t *testing.T, n int) *fleetSim {
	all := map[string]map[string]fakeEntry{}
	f := &fleetSim{t: t, held: map[*Stream]uint64{}, proxies: make([][]*Stream, n), bound: 1000}
	for i := range n {
		s, _ := newTestService(t, Options{Fleet: &fakeFleet{name: strconv.Itoa(i), all: all}})
		f.replicas = append(f.replicas, s)
	}
	return f
}

// join opens k proxies on replica r, each reporting its first request.
func (f *fleetSim) join(now time.Time, r, k int) {
	for range k {
		st, _ := f.replicas[r].Open()
		mustReport(f.t, st, now, use("tenant", "x", 1, 0))
		f.proxies[r] = append(f.proxies[r], st)
	}
	f.check(now, "join")
}

// leave closes the last k proxies of replica r.
func (f *fleetSim) leave(r, k int) {
	ps := f.proxies[r]
	for _, st := range ps[len(ps)-k:] {
		st.Close()
		delete(f.held, st)
	}
	f.proxies[r] = ps[:len(ps)-k]
}

// second runs one second from now: every proxy reports 5000 requests, and
// replica i ticks at now + (i+1)/(n+1) s.
func (f *fleetSim) second(now time.Time) {
	for _, ps := range f.proxies {
		for _, st := range ps {
			mustReport(f.t, st, now, use("tenant", "x", 5000, 0))
		}
	}
	f.check(now, "reports")
	for i, s := range f.replicas {
		at := now.Add(time.Duration(i+1) * time.Second / time.Duration(len(f.replicas)+1))
		_ = s.Tick(context.Background(), at)
		f.check(at, "tick of replica "+strconv.Itoa(i))
	}
}

// check takes every pending action and fails if the proxies hold more
// than the limit.
func (f *fleetSim) check(now time.Time, step string) {
	f.t.Helper()
	var sum uint64
	for _, ps := range f.proxies {
		for _, st := range ps {
			for _, a := range st.Pending() {
				switch a.Kind {
				case RequestsPerUnit:
					f.held[st] = a.Requests
				case DenyAll:
					f.held[st] = 0
				default:
					f.t.Fatalf("%v %s: unexpected %+v", now.Sub(t0), step, a)
				}
			}
			sum += f.held[st]
		}
	}
	if sum > f.bound {
		f.t.Errorf("%v after %s: the fleet's proxies hold %d > %d", now.Sub(t0), step, sum, f.bound)
	}
}

// fair checks that every proxy holds an equal share of 980, give or take
// the rounding of each replica.
func (f *fleetSim) fair(step string) {
	f.t.Helper()
	n := 0
	for _, ps := range f.proxies {
		n += len(ps)
	}
	want := 980 / float64(n)
	for r, ps := range f.proxies {
		for i, st := range ps {
			if got := float64(f.held[st]); math.Abs(got-want) > 1 {
				f.t.Errorf("%s: proxy %d of replica %d holds %v, want %.1f", step, i, r, got, want)
			}
		}
	}
}

// TestService_FleetStart: three replicas start together with 1, 10 and
// 10 proxies that each want the whole limit. Until a replica has claimed
// its part of the limit it divides only its part of the reserve, so the
// fleet never holds more than the limit (plus, when the replicas have not
// seen each other yet, one reserve per other replica); from the third
// second every proxy holds its fair share.
func TestService_FleetStart(t *testing.T) {
	for _, registered := range []bool{true, false} {
		t.Run("registered="+strconv.FormatBool(registered), func(t *testing.T) {
			f := newFleetSim(t, 3)
			if registered { // as Run does when it starts, then each interval
				for _, s := range f.replicas {
					_ = s.Tick(context.Background(), at(-5))
				}
				for _, s := range f.replicas {
					_ = s.Tick(context.Background(), at(-4))
				}
			} else {
				f.bound += 2 * 20
			}
			for r, k := range []int{1, 10, 10} {
				f.join(at(0.1), r, k)
			}
			for sec := 1; sec <= 6; sec++ {
				f.second(at(float64(sec)))
				if sec >= 3 {
					f.fair("second " + strconv.Itoa(sec))
				}
			}
		})
	}
}

// TestService_FleetJoinAndLeave: proxies join on every replica at once,
// one of them on a replica that has no proxy of the limit yet, then
// leave; the fleet never holds more than the limit and is fair again two
// seconds after each change.
func TestService_FleetJoinAndLeave(t *testing.T) {
	f := newFleetSim(t, 3)
	for _, now := range []float64{-5, -4} {
		for _, s := range f.replicas {
			_ = s.Tick(context.Background(), at(now))
		}
	}
	f.join(at(0.1), 0, 8)
	f.join(at(0.1), 1, 8)
	for sec := 1; sec <= 4; sec++ {
		f.second(at(float64(sec)))
	}
	f.fair("before the join")
	for r := range 3 {
		f.join(at(4.9), r, 2)
	}
	for sec := 5; sec <= 8; sec++ {
		f.second(at(float64(sec)))
		if sec >= 7 {
			f.fair("after the join, second " + strconv.Itoa(sec))
		}
	}
	f.leave(0, 4)
	for sec := 9; sec <= 11; sec++ {
		f.second(at(float64(sec)))
	}
	f.fair("after the leave")
}

// TestService_FleetFailure: a replica cut off from the fleet keeps the
// part it claimed while the others still count it (3 intervals), then
// divides only its part of the reserve, and after a TTL the whole limit
// among its own proxies.
func TestService_FleetFailure(t *testing.T) {
	f := newFleetSim(t, 2)
	for _, now := range []float64{-5, -4} {
		for _, s := range f.replicas {
			_ = s.Tick(context.Background(), at(now))
		}
	}
	f.join(at(0.1), 0, 1)
	f.join(at(0.1), 1, 1)
	for sec := 1; sec <= 3; sec++ {
		f.second(at(float64(sec)))
	}
	f.fair("before the failure")
	f.replicas[0].o.Fleet.(*fakeFleet).fail = true
	a := f.proxies[0][0]
	// The last claim was at 3.33 s.
	want := map[int]uint64{4: 490, 6: 490, 7: 10, 13: 10, 14: 980}
	for sec := 4; sec <= 15; sec++ {
		mustReport(t, a, at(float64(sec)), use("tenant", "x", 5000, 0))
		_ = f.replicas[0].Tick(context.Background(), at(float64(sec)))
		for _, act := range a.Pending() {
			f.held[a] = act.Requests
		}
		if w, ok := want[sec]; ok && f.held[a] != w {
			t.Errorf("at %d s, after the last claim at 3.33 s, the proxy holds %d, want %d", sec, f.held[a], w)
		}
	}
}
