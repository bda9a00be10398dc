package loadgen

import (
	"context"
	"errors"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/quota"
	"github.com/sluicehq/sluice/server"
)

func assignment(s *typepb.RateLimitStrategy, ttl time.Duration) *rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{RateLimitStrategy: s, AssignmentTimeToLive: durationpb.New(ttl)}
}

func tokenBucket(max, per uint32, fill time.Duration) *typepb.RateLimitStrategy {
	return &typepb.RateLimitStrategy{Strategy: &typepb.RateLimitStrategy_TokenBucket{TokenBucket: &typepb.TokenBucket{
		MaxTokens: max, TokensPerFill: wrapperspb.UInt32(per), FillInterval: durationpb.New(fill)}}}
}

func perUnit(n uint64, u typepb.RateLimitUnit) *typepb.RateLimitStrategy {
	return &typepb.RateLimitStrategy{Strategy: &typepb.RateLimitStrategy_RequestsPerTimeUnit_{
		RequestsPerTimeUnit: &typepb.RateLimitStrategy_RequestsPerTimeUnit{RequestsPerTimeUnit: n, TimeUnit: u}}}
}

// count is how many of n requests at now b allows.
func count(b *localBucket, now time.Time, n int) int {
	ok := 0
	for range n {
		if b.allow(now) {
			ok++
		}
	}
	return ok
}

func TestLocalBucket(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

	b := localBucket{noAssign: FallbackDeny, onExpired: FallbackReuse}
	if got := count(&b, at(0), 5); got != 0 {
		t.Errorf("no assignment, deny: %d allowed", got)
	}
	b.apply(at(0), assignment(tokenBucket(10, 1, 100*time.Millisecond), time.Second))
	steps := []struct {
		ms, n, want int
	}{
		{0, 20, 10},  // starts full
		{250, 5, 2},  // two fills in 250 ms
		{1500, 5, 5}, // expired: reuse keeps the bucket, refilled by then
	}
	for i, s := range steps {
		if got := count(&b, at(s.ms), s.n); got != s.want {
			t.Errorf("token bucket step %d: %d of %d allowed at %d ms, want %d", i, got, s.n, s.ms, s.want)
		}
	}
	// The same bucket re-sent keeps its tokens; a changed one starts full.
	b.apply(at(1500), assignment(tokenBucket(10, 1, 100*time.Millisecond), time.Second))
	if got := count(&b, at(1500), 5); got != 5 {
		t.Errorf("same assignment re-sent: %d allowed, want the 5 left", got)
	}
	b.apply(at(1500), assignment(tokenBucket(3, 1, time.Second), time.Second))
	if got := count(&b, at(1500), 5); got != 3 {
		t.Errorf("new assignment: %d allowed, want a full bucket of 3", got)
	}

	w := localBucket{onExpired: FallbackDeny}
	w.apply(at(0), assignment(perUnit(3, typepb.RateLimitUnit_SECOND), 2*time.Second))
	for i, s := range []struct{ ms, n, want int }{{0, 5, 3}, {900, 5, 0}, {1000, 5, 3}, {2500, 5, 0}} {
		if got := count(&w, at(s.ms), s.n); got != s.want {
			t.Errorf("requests per unit step %d: %d of %d allowed at %d ms, want %d", i, got, s.n, s.ms, s.want)
		}
	}
}

type staticTables struct{ t *config.Table }

func (s staticTables) Current() *config.Table { return s.t }

// serveRLQS serves RLQS with the limit tenant: 200/s on loopback until
// the test ends.
func serveRLQS(t *testing.T) (*quota.Service, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(p, []byte("domain: rlqs\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 200}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tbl, err := config.Load(p, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	q := quota.New(staticTables{tbl}, quota.Options{Interval: 100 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	rlqspb.RegisterRateLimitQuotaServiceServer(s, server.NewRLQS(q))
	done := make(chan struct{}, 2)
	go func() { q.Run(ctx); done <- struct{}{} }()
	go func() { s.Serve(lis); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); s.Stop(); <-done; <-done })
	return q, lis.Addr().String()
}

// TestRunRLQS runs a short simulation against a real RLQS server on
// loopback and checks its bookkeeping (not its timing).
func TestRunRLQS(t *testing.T) {
	ctx := context.Background()
	q, addr := serveRLQS(t)

	var seen int
	res, err := RunRLQS(ctx, RLQSOptions{Targets: []string{addr}, Proxies: 10, Buckets: 3, Demand: DemandChurn,
		Limit: 200, ReportInterval: 200 * time.Millisecond, Duration: 3 * time.Second, Every: func(Second) { seen++ }})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Seconds) != 3 || seen != 3 {
		t.Fatalf("%d seconds, %d callbacks; want 3", len(res.Seconds), seen)
	}
	// Churn: 8 proxies, then 10 in the middle second, then 8.
	for i, want := range []int{8, 10, 8} {
		s := res.Seconds[i]
		if s.Active != want || s.Admitted > s.Offered || s.Offered == 0 {
			t.Errorf("second %d: %+v, want %d proxies and admitted ≤ offered", i+1, s, want)
		}
	}
	if st := q.Stats(); st.Usages == 0 || st.Pushed[quota.RequestsPerUnit] == 0 {
		t.Errorf("server stats %+v: no reports or assignments", st)
	}
}

// TestFleetWatch_WaitsForLateProxies: a second is read once every proxy
// has stepped past it, however late a proxy's steps run (on a busy
// machine, a goroutine can wait its turn for a second): the late proxy's
// requests are in the second's figures. (Reading the second a fixed 30 ms
// after it ended missed them: TestRunRLQS once saw a second with nothing
// offered.)
func TestFleetWatch_WaitsForLateProxies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &RLQSOptions{Targets: []string{"x"}, Limit: 100, Proxies: 2, Duration: 2 * time.Second}
		if err := o.defaults(); err != nil {
			t.Fatal(err)
		}
		seconds := make(chan Second, 2)
		o.Every = func(s Second) { seconds <- s }
		f := &simFleet{o: o, start: time.Now(), secs: 2}
		for i := range o.Proxies {
			f.proxies = append(f.proxies, newSimProxy(o, i, f.secs))
		}
		done := make(chan error, 1)
		go func() {
			_, err := f.watch(t.Context())
			done <- err
		}()

		// Proxy 0 steps past the first second on time, proxy 1 a second late.
		f.proxies[0].offered[0].Add(40)
		f.proxies[0].admitted[0].Add(40)
		time.Sleep(time.Second + o.Step)
		f.proxies[0].past.Store(time.Now().UnixNano())
		time.Sleep(time.Second)
		synctest.Wait()
		select {
		case s := <-seconds:
			t.Fatalf("second 1 read before proxy 1 stepped past it: %+v", s)
		default:
		}
		f.proxies[1].offered[0].Add(40)
		f.proxies[1].admitted[0].Add(30)
		f.proxies[1].past.Store(time.Now().UnixNano())
		time.Sleep(o.Step)
		synctest.Wait()
		select {
		case s := <-seconds:
			if s.T != 1 || s.Active != 2 || s.Offered != 80 || s.Admitted != 70 {
				t.Errorf("second 1: %+v, want 2 proxies, 80 offered, 70 admitted", s)
			}
		default:
			t.Fatal("second 1 not read once both proxies stepped past it")
		}

		// Proxy 0 has not stepped past the second second: it stops.
		f.proxies[0].past.Store(math.MaxInt64)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if s := <-seconds; s.T != 2 {
			t.Errorf("then %+v, want second 2", s)
		}
	})
}

// TestRunRLQS_DistinctBuckets: with DistinctBuckets every proxy's extra
// buckets are its own limits, as a client inventing bucket ids makes
// them: 2 proxies with 3 buckets each make 1 + 2×2 groups, not 1 + 2.
func TestRunRLQS_DistinctBuckets(t *testing.T) {
	ctx := context.Background()
	q, addr := serveRLQS(t)
	groups := 0
	_, err := RunRLQS(ctx, RLQSOptions{Targets: []string{addr}, Proxies: 2, Buckets: 3, DistinctBuckets: true,
		Limit: 200, ReportInterval: 200 * time.Millisecond, Duration: time.Second, Every: func(Second) {
			for _, r := range q.Rules() {
				groups = r.Groups
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if groups != 5 {
		t.Errorf("%d groups, want 5", groups)
	}
}

// TestSimProxy_Arrivals walks a proxy at 100 requests/s through steps:
// the first brings none, fractions carry over, a late step brings the
// time's worth at once (spread over the time since the last step), and
// a gap longer than a second brings a second's worth.
func TestSimProxy_Arrivals(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	p := newSimProxy(&RLQSOptions{Key: "tenant", Buckets: 1}, 0, 1)
	for i, s := range []struct {
		ms, fromMS int
		el         time.Duration
		want       uint64
	}{
		{0, 0, 0, 0},
		{10, 0, 10 * time.Millisecond, 1},
		{15, 10, 5 * time.Millisecond, 0},
		{20, 15, 5 * time.Millisecond, 1},
		{520, 20, 500 * time.Millisecond, 50},
		{3520, 520, time.Second, 100},
		{3520, 3520, 0, 0}, // no time passed
	} {
		n, from, el := p.arrivals(at(s.ms), 100)
		if n != s.want || !from.Equal(at(s.fromMS)) || el != s.el {
			t.Errorf("step %d: arrivals(%d ms) = %d over [%v, +%v], want %d over [%d ms, +%v]",
				i, s.ms, n, from.Sub(t0), el, s.want, s.fromMS, s.el)
		}
	}
}

// TestFleetWatch_StuckProxy: a run that ends while a proxy has not
// stepped past a second says which proxy and which second.
func TestFleetWatch_StuckProxy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &RLQSOptions{Targets: []string{"x"}, Limit: 100, Proxies: 2, Duration: 2 * time.Second}
		if err := o.defaults(); err != nil {
			t.Fatal(err)
		}
		f := &simFleet{o: o, start: time.Now(), secs: 2}
		for i := range o.Proxies {
			f.proxies = append(f.proxies, newSimProxy(o, i, f.secs))
		}
		f.proxies[0].past.Store(math.MaxInt64)
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		if _, err := f.watch(ctx); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "proxy 1 has not stepped past second 1") {
			t.Errorf("watch: %v, want proxy 1 named, stuck before second 1 ends", err)
		}
	})
}

// TestSimProxy_LateFirstStep: a proxy whose first step runs 1.5 s after
// the start (a busy machine) still offers the first second's requests,
// each counted in the second it arrived in, not the step's; and a proxy
// whose demand is 0 for a while brings none of that time's requests when
// it joins.
func TestSimProxy_LateFirstStep(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	p := newSimProxy(&RLQSOptions{Key: "tenant", Buckets: 1}, 0, 3)
	p.lastStep = start // (as run sets it)
	n, from, el := p.arrivals(start.Add(1500*time.Millisecond), 100)
	p.admit(start, n, from, el)
	if o0, o1 := p.offered[0].Load(), p.offered[1].Load(); n != 100 || o0 != 99 || o1 != 1 || p.admitted[0].Load() != 99 {
		t.Errorf("first step 1.5 s late: %d arrivals, offered %d in second 1 and %d in second 2 (admitted %d), want 100: 99 and 1 (99)",
			n, o0, o1, p.admitted[0].Load())
	}

	// The last of 5 proxies under churn joins at a third of the run (1.5 s).
	idle := newSimProxy(&RLQSOptions{Key: "tenant", Buckets: 1, Proxies: 5, Rate: 100, Demand: DemandChurn,
		Duration: 4500 * time.Millisecond}, 4, 4)
	idle.lastStep = start
	if err := idle.step(t.Context(), nil, start, start.Add(1400*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if !idle.lastStep.Equal(start.Add(1400 * time.Millisecond)) {
		t.Errorf("an idle step left lastStep at %v, want 1.4 s", idle.lastStep.Sub(start))
	}
}

// TestRLQSResult_Summarize: the summary counts the settled seconds with
// demand above the limit that admitted at least 0.9 × it, and the most a
// second admitted, settled or not, whatever the demand.
func TestRLQSResult_Summarize(t *testing.T) {
	r := &RLQSResult{Settle: 2}
	for i, v := range [][2]float64{{2000, 1100}, {2000, 500}, {2000, 950}, {2000, 880}, {500, 1060}, {2000, 1000}} {
		r.Seconds = append(r.Seconds, Second{T: i + 1, Offered: v[0], Admitted: v[1], Limit: 1000})
	}
	r.summarize()
	if r.Above90 != 2.0/3 || r.MaxSecond != 1.1 || r.MaxSettled != 1.06 || r.MinRatio != 0.88 || r.MaxRatio != 1 {
		t.Errorf("summary %+v: want at least 0.9 in 2 of 3 seconds, most 1.1 (1.06 settled), range 0.88–1", r)
	}
}
