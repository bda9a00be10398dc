package quota

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/store"
)

func TestService_StreamCap(t *testing.T) {
	s, _ := newTestService(t, Options{MaxStreams: 2})
	a, _ := s.Open()
	if _, err := s.Open(); err != nil {
		t.Fatal(err)
	}
	// A stream that has sent nothing yet holds its place.
	if _, err := s.Open(); !errors.Is(err, ErrTooManyStreams) || !errors.Is(err, ErrExhausted) {
		t.Fatalf("third stream: %v, want ErrTooManyStreams", err)
	}
	a.Close()
	c, err := s.Open()
	if err != nil {
		t.Fatalf("after a stream closed: %v", err)
	}
	mustReport(t, c, at(0), use("tenant", "x", 1, 0))
	if st := s.Stats(); st.Streams != 2 || st.Capped[CapStreams] != 1 || st.Rejected != 1 {
		t.Errorf("stats %+v, want 2 streams, 1 refused at the stream cap", st)
	}
}

func TestService_ReplicaBucketCap(t *testing.T) {
	s, _ := newTestService(t, Options{MaxBuckets: 3})
	a, _ := s.Open()
	b, _ := s.Open()
	// Buckets that match no rule count too: each is held and answered.
	mustReport(t, a, at(0), use("tenant", "1", 1, 0), use("nomatch", "x", 1, 0))
	mustReport(t, b, at(0), use("tenant", "1", 1, 0))
	err := b.Report(at(0.5), "d", []Usage{use("tenant", "1", 1, 0), use("tenant", "2", 1, 0)})
	if !errors.Is(err, ErrTooManyReplicaBuckets) || !errors.Is(err, ErrExhausted) {
		t.Fatalf("a fourth bucket on the replica: %v, want ErrTooManyReplicaBuckets", err)
	}
	if n := b.Buckets(); n != 1 {
		t.Errorf("the refused report left %d buckets on its stream, want 1", n)
	}
	// Known buckets still report; a bucket released makes room.
	mustReport(t, b, at(0.6), use("tenant", "1", 1, 0))
	a.Close()
	mustReport(t, b, at(0.7), use("tenant", "2", 1, 0), use("tenant", "3", 1, 0))
	if st := s.Stats(); st.Buckets != 3 || st.Capped[CapBuckets] != 1 {
		t.Errorf("stats %+v, want 3 buckets, 1 report refused at the replica's cap", st)
	}
}

// TestService_BucketKeysCap: a bucket id with more keys than any rule can
// match is refused, however small: 2,700 one-byte keys pass the 8 KiB
// bound on a bucket id's bytes but cost ~165 KB each as a map.
func TestService_BucketKeysCap(t *testing.T) {
	s, _ := newTestService(t, Options{})
	st, _ := s.Open()
	many := func(n int) map[string]string {
		m := make(map[string]string, n)
		for i := range n {
			m[strconv.Itoa(i)] = ""
		}
		return m
	}
	mustReport(t, st, at(0), Usage{Bucket: many(config.MaxBucketKeys), Elapsed: time.Second})
	for _, n := range []int{config.MaxBucketKeys + 1, 2700} {
		err := st.Report(at(0), "d", []Usage{use("tenant", "x", 1, 0), {Bucket: many(n), Elapsed: time.Second}})
		if !errors.Is(err, ErrTooManyKeys) || !errors.Is(err, ErrExhausted) {
			t.Errorf("a bucket id of %d keys: %v, want ErrTooManyKeys", n, err)
		}
	}
	if n, c := st.Buckets(), s.Stats().Capped[CapBucketKeys]; n != 1 || c != 2 {
		t.Errorf("%d buckets and %d refused at the key cap, want 1 and 2", n, c)
	}
}

// TestService_NoAnswerBeforeFirstTable: before a limits table is in force
// (xDS before its first push) buckets are held but not answered, so that
// Envoy applies its no_assignment_behavior, as RLS answers UNAVAILABLE;
// the first table answers them with their rules.
func TestService_NoAnswerBeforeFirstTable(t *testing.T) {
	tb := &tables{}
	s := New(tb, Options{Reserve: -1})
	st, _ := s.Open()
	mustReport(t, st, at(0), use("tenant", "x", 10, 0), use("nomatch", "y", 1, 0))
	if err := s.Tick(context.Background(), at(1)); err != nil {
		t.Fatal(err)
	}
	if as := st.Pending(); len(as) != 0 {
		t.Fatalf("before any table: %+v, want no answer", as)
	}
	if st := s.Stats(); st.Buckets != 2 {
		t.Errorf("%d buckets held, want 2", st.Buckets)
	}
	tb.p.Store(loadTable(t, testLimits))
	// A report after the table comes, before the next Tick, is answered
	// with its rule at once; the other bucket at the Tick.
	mustReport(t, st, at(1.5), use("tenant", "x", 10, 0))
	if a := only(t, st, "report after the first table"); a.Kind != RequestsPerUnit {
		t.Errorf("tenant=x after the first table: %+v, want requests_per_time_unit", a)
	}
	if err := s.Tick(context.Background(), at(2)); err != nil {
		t.Fatal(err)
	}
	kinds := map[string]Kind{}
	for _, a := range st.Pending() {
		for k := range a.Bucket {
			kinds[k] = a.Kind
		}
	}
	if kinds["nomatch"] != AllowAll || kinds["tenant"] != RequestsPerUnit {
		t.Errorf("after the first Tick with a table: %v, want nomatch allowed, tenant its share", kinds)
	}
}

// splitFleet is a fakeFleet whose claims of the groups in failing fail,
// as a key of the wrong type or a Cluster shard that is down; it counts
// the claims and releases it is asked for.
type splitFleet struct {
	fakeFleet
	failing  func(group string) bool
	claims   []int // per Exchange
	released []string
}

func (f *splitFleet) Exchange(ctx context.Context, now time.Time, local map[string]store.Claim, release []string) (store.Grants, error) {
	f.claims = append(f.claims, len(local))
	f.released = append(f.released, release...)
	ok := map[string]store.Claim{}
	var failed []string
	for k, c := range local {
		if f.failing != nil && f.failing(k) {
			failed = append(failed, k)
			continue
		}
		ok[k] = c
	}
	r, err := f.fakeFleet.Exchange(ctx, now, ok, nil)
	if len(failed) > 0 {
		err = errors.Join(err, fmt.Errorf("claims of %v failed", failed))
	}
	return r, err
}

// TestService_ClaimsIsolated: two replicas, two limits; every claim of
// tenant=bad fails. tenant=good is divided over the fleet as usual, and
// only tenant=bad falls back to the cautious part once its last claim is
// stale.
func TestService_ClaimsIsolated(t *testing.T) {
	all := map[string]map[string]fakeEntry{}
	var fleets []*splitFleet
	var proxies [][2]*Stream // per replica: tenant=good, tenant=bad
	var replicas []*Service
	for i := range 2 {
		f := &splitFleet{fakeFleet: fakeFleet{name: strconv.Itoa(i), all: all}}
		s, _ := newTestService(t, Options{Fleet: f})
		fleets, replicas = append(fleets, f), append(replicas, s)
		var ps [2]*Stream
		for j := range ps {
			ps[j], _ = s.Open()
		}
		proxies = append(proxies, ps)
	}
	held := map[*Stream]uint64{}
	second := func(sec int) {
		for _, ps := range proxies {
			mustReport(t, ps[0], at(float64(sec)), use("tenant", "good", 5000, 0))
			mustReport(t, ps[1], at(float64(sec)), use("tenant", "bad", 5000, 0))
		}
		for r, s := range replicas {
			_ = s.Tick(context.Background(), at(float64(sec)+0.3*float64(r+1)))
		}
		for _, ps := range proxies {
			for _, st := range ps {
				for _, a := range st.Pending() {
					held[st] = a.Requests
				}
			}
		}
	}
	for sec := range 3 {
		second(sec)
	}
	for i, ps := range proxies {
		if held[ps[0]] != 490 || held[ps[1]] != 490 {
			t.Fatalf("replica %d before the failure: good %d, bad %d, want 490 each", i, held[ps[0]], held[ps[1]])
		}
	}
	for _, f := range fleets {
		f.failing = func(g string) bool { return strings.Contains(g, "bad") }
	}
	for sec := 3; sec < 8; sec++ {
		second(sec)
	}
	for i, ps := range proxies {
		// The cautious part: the reserve of 20 split between 2 replicas.
		if held[ps[0]] != 490 || held[ps[1]] != 10 {
			t.Errorf("replica %d after 5 s of failed claims of tenant=bad: good %d, want 490; bad %d, want 10", i, held[ps[0]], held[ps[1]])
		}
	}
	if st := replicas[0].Stats(); st.FleetErrors != 5 || st.ClaimErrors != 5 {
		t.Errorf("replica 0: %d fleet errors, %d claim errors, want 5 and 5", st.FleetErrors, st.ClaimErrors)
	}
}

// TestService_MaxClaims: a stream that invents 100 buckets (each its own
// limit) with demands above the cautious part, beside one with 2: at most
// MaxClaims groups are claimed an interval, the small stream's every
// interval, the inventor's in turn; the groups it drops are given back,
// at most MaxClaims an interval.
func TestService_MaxClaims(t *testing.T) {
	f := &splitFleet{fakeFleet: fakeFleet{name: "a", all: map[string]map[string]fakeEntry{}}}
	s, _ := newTestService(t, Options{Fleet: f, MaxClaims: 10})
	small, _ := s.Open()
	big, _ := s.Open()
	var invented []Usage
	for i := range 100 {
		invented = append(invented, use("tenant", "i"+strconv.Itoa(i), 100, 0))
	}
	claimedAt := map[string][]int{} // tenant → the intervals its group was claimed in
	for sec := range 14 {
		mustReport(t, small, at(float64(sec)), use("tenant", "s1", 5000, 0), use("tenant", "s2", 5000, 0))
		mustReport(t, big, at(float64(sec)), invented...)
		_ = s.Tick(context.Background(), at(float64(sec)+0.5))
		// fakeFleet holds the last Exchange's claims only.
		for g := range f.all["a"] {
			_, tenant, _ := strings.Cut(g, "tenant=")
			tenant, _, _ = strings.Cut(tenant, "|")
			claimedAt[tenant] = append(claimedAt[tenant], sec)
		}
	}
	for i, n := range f.claims {
		if n != 10 {
			t.Fatalf("exchange %d claimed %d groups, want 10", i, n)
		}
	}
	for _, g := range []string{"s1", "s2"} {
		if len(claimedAt[g]) != 14 {
			t.Errorf("%s claimed in intervals %v, want every one", g, claimedAt[g])
		}
	}
	// 8 places an interval for 100 groups: each within 13 intervals.
	for i := range 100 {
		if g := "i" + strconv.Itoa(i); len(claimedAt[g]) == 0 {
			t.Errorf("%s never claimed in 14 intervals", g)
		}
	}
	if got, want := s.Stats().ClaimsDeferred, uint64(14*92); got != want {
		t.Errorf("ClaimsDeferred = %d, want %d", got, want)
	}
	big.Close()
	_ = s.Tick(context.Background(), at(14.5))
	if len(f.released) != 10 || slices.ContainsFunc(f.released, func(g string) bool { return !strings.Contains(g, "tenant=i") }) {
		t.Errorf("after the inventor left, released %v, want 10 of its groups", f.released)
	}
}

// TestService_MaxClaimsSmallDemands: past MaxClaims, a group whose
// proxies want less than its cautious part (here 10 of 1000/s: the reserve
// of 20 split between two replicas) is divided without a claim: a stream
// inventing 100 buckets of 1 request a second costs the fleet no claim
// once their rates are known.
func TestService_MaxClaimsSmallDemands(t *testing.T) {
	all := map[string]map[string]fakeEntry{}
	f := &splitFleet{fakeFleet: fakeFleet{name: "a", all: all}}
	s, _ := newTestService(t, Options{Fleet: f, MaxClaims: 10})
	other, _ := newTestService(t, Options{Fleet: &fakeFleet{name: "b", all: all}})
	small, _ := s.Open()
	big, _ := s.Open()
	var invented []Usage
	for i := range 100 {
		invented = append(invented, use("tenant", "i"+strconv.Itoa(i), 1, 0))
	}
	for sec := range 4 {
		mustReport(t, small, at(float64(sec)), use("tenant", "s1", 5000, 0), use("tenant", "s2", 5000, 0))
		mustReport(t, big, at(float64(sec)), invented...)
		_ = other.Tick(context.Background(), at(float64(sec)+0.2))
		_ = s.Tick(context.Background(), at(float64(sec)+0.5))
	}
	// In the first interval no rate is known: every group wants a claim.
	if want := []int{10, 2, 2, 2}; !slices.Equal(f.claims, want) {
		t.Errorf("claims per interval %v, want %v", f.claims, want)
	}
	// Each has the cautious part: what it wants and headroom.
	for _, a := range big.Pending() {
		if a.Kind != RequestsPerUnit || a.Requests != 10 {
			t.Errorf("tenant=%s: %+v, want 10 per second", a.Bucket["tenant"], a)
		}
	}
}
