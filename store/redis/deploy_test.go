package redis

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testcert"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// takeN takes cost 1 at key n times at now and returns how many were
// allowed.
func takeN(t *testing.T, s *Store, key string, r *store.Rule, now int64, n int) int {
	t.Helper()
	out := make([]store.Decision, 1)
	allowed := 0
	for range n {
		if err := s.Take(context.Background(), now, []store.Hit{{Key: key, Rule: r, Cost: 1, Veto: true}}, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Allowed {
			allowed++
		}
	}
	return allowed
}

func TestNew_Auth(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "s3cret")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if s, err := New(ctx, Options{URL: "redis://" + srv.Addr}); err == nil {
		s.Close()
		t.Fatal("New without the password: no error")
	}
	r := must(store.NewFixedWindow(3, time.Minute))
	for _, opt := range []Options{
		{URL: "redis://:s3cret@" + srv.Addr},
		{URL: "redis://" + srv.Addr, Password: "s3cret"},
	} {
		s := open(t, opt)
		if got := takeN(t, s, "k", r, time.Now().UnixNano(), 5); got != 3 {
			t.Errorf("%+v: %d allowed of 5, want 3", opt, got)
		}
	}
}

func TestNew_TLS(t *testing.T) {
	ca, dir := testcert.NewCA(t), t.TempDir()
	cert, key := ca.Server(t).WriteFiles(t, dir, "server")
	srv := redistest.StartTLS(t, cert, key, ca.WriteFile(t, dir))
	client := ca.ClientConfig(t)
	s := open(t, Options{URL: "rediss://" + srv.Addr, TLS: client})
	r := must(store.NewTokenBucket(1, time.Hour, 2))
	if got := takeN(t, s, "k", r, time.Now().UnixNano(), 4); got != 2 {
		t.Errorf("%d allowed of 4, want 2", got)
	}
	// Without the client certificate the server refuses the handshake.
	noCert := client.Clone()
	noCert.Certificates = nil
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if s, err := New(ctx, Options{URL: "rediss://" + srv.Addr, TLS: noCert}); err == nil {
		s.Close()
		t.Fatalf("New without a client certificate: no error; status %+v", s.Status())
	}
}

// TestSentinel_Failover: the master dies mid-run; the sentinel promotes
// the replica and takes resume on it without a new store. Writes the
// replica had not received are lost: that over-grant is bounded by the
// replication lag (here the replica is in sync, so none). The takes
// before and after the failover must succeed: they have open's minute (a
// busy machine stalls this process past 200 ms now and then); only the
// poll for the promoted replica gives each of its calls 2 s, so that
// they bound the poll (a call that fails there is made again). The waits
// for what must happen allow a minute: a sentinel starved on a busy
// machine elects late (once seen past 20 s).
func TestSentinel_Failover(t *testing.T) {
	if testing.Short() {
		t.Skip("fails over a Sentinel setup")
	}
	sn := redistest.StartSentinel(t)
	s := open(t, Options{SentinelAddrs: []string{sn.Sentinel.Addr}, SentinelMaster: sn.MasterSet})
	r := must(store.NewFixedWindow(100, time.Hour))
	now := time.Now().UnixNano()
	if got := takeN(t, s, "k", r, now, 60); got != 60 {
		t.Fatalf("%d of 60 allowed before the failover", got)
	}
	// Let the replica receive the writes, then kill the master.
	waitFor(t, 30*time.Second, "replica has the writes", func() bool {
		out, _ := sn.Replica.Run("get", s.opt.KeyPrefix+"k")
		return out == endOf(r, now)+":60"
	})
	sn.Master.Kill()
	out := make([]store.Decision, 1)
	hits := []store.Hit{{Key: "k", Rule: r, Cost: 1, Veto: true}}
	var err error
	defer func() {
		if t.Failed() && err != nil {
			t.Logf("the poll's last take: %v", err)
		}
	}()
	waitFor(t, time.Minute, "takes succeed on the promoted replica", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err = s.Take(ctx, now, hits, out)
		return err == nil
	})
	if got := takeN(t, s, "k", r, now, 60); got != 39 {
		t.Errorf("%d of 60 allowed after the failover, want the 39 left of 100", got)
	}
}

func endOf(r *store.Rule, now int64) string {
	return strconv.FormatUint(windowEnd(r, now), 10)
}

func TestNew_UnixSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "redis.sock")
	redistest.Start(t, "--unixsocket", sock, "--unixsocketperm", "700")
	s := open(t, Options{URL: "unix://" + sock})
	r := must(store.NewFixedWindow(2, time.Minute))
	if got := takeN(t, s, "k", r, time.Now().UnixNano(), 3); got != 2 {
		t.Errorf("%d allowed of 3, want 2", got)
	}
}

// TestTake_Expiry: keys expire a second after they are fresh again: a
// fixed window at its end, a sliding window when now's bucket has left it,
// a token bucket when full; alone (the script's fast paths) or in a batch.
func TestTake_Expiry(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, Options{URL: "redis://" + srv.Addr})
	fw := must(store.NewFixedWindow(5, time.Minute))
	tb := must(store.NewTokenBucket(1, time.Hour, 3))  // 2 taken: full in 2h
	sw := must(store.NewSlidingWindow(4, time.Minute)) // 8 buckets of 7.5 s
	now := int64(1_800_000_000)*int64(time.Second) + 15*int64(time.Second)
	out := make([]store.Decision, 3)
	// set is when the calls that set the expiries ran.
	var set [2]time.Time
	check := func(key string, want time.Duration) {
		t.Helper()
		checkExpiry(t, srv, s.opt.KeyPrefix+key, want, set[0], set[1])
	}
	set[0] = time.Now()
	for _, batch := range [][]store.Hit{
		{{Key: "fw1", Rule: fw, Cost: 1, Veto: true}},
		{{Key: "tb1", Rule: tb, Cost: 2, Veto: true}},
		{{Key: "fw2", Rule: fw, Cost: 1, Veto: true}, {Key: "tb2", Rule: tb, Cost: 2, Veto: true}},
		{{Key: "sw1", Rule: sw, Cost: 1, Veto: true}},
		{{Key: "fw3", Rule: fw, Cost: 1, Veto: true}, {Key: "sw2", Rule: sw, Cost: 2, Veto: true}, {Key: "tb3", Rule: tb, Cost: 2, Veto: true}},
	} {
		if err := s.Take(context.Background(), now, batch, out[:len(batch)]); err != nil {
			t.Fatal(err)
		}
	}
	set[1] = time.Now()
	first := set
	for _, k := range []string{"fw1", "fw2", "fw3"} {
		check(k, 45*time.Second+time.Second)
	}
	for _, k := range []string{"tb1", "tb2", "tb3"} {
		check(k, 2*time.Hour+time.Second)
	}
	// now is bucket 2's start; it leaves the window at bucket 11's.
	for _, k := range []string{"sw1", "sw2"} {
		check(k, 9*7500*time.Millisecond+time.Second)
	}
	// A write in a later bucket moves the expiry with it; one from a
	// clock stepped back into an earlier bucket keeps it.
	for _, c := range []struct {
		at   time.Duration
		sets bool
		want time.Duration // after the write that set it
	}{{10 * time.Second, true, 66 * time.Second}, {-20 * time.Second, false, 66 * time.Second}} {
		before := time.Now()
		if err := s.Take(context.Background(), now+int64(c.at), []store.Hit{{Key: "sw1", Rule: sw, Cost: 1, Veto: true}}, out[:1]); err != nil {
			t.Fatal(err)
		}
		if c.sets {
			set = [2]time.Time{before, time.Now()}
		}
		check("sw1", c.want)
	}
	// A later write in the same window keeps the expiry the window's first
	// write set (Redis's clock has not moved, the caller's has); the next
	// window's first write sets its own.
	set = first
	for _, c := range []struct {
		at   time.Duration
		sets bool
		want time.Duration
	}{{20 * time.Second, false, 46 * time.Second}, {65 * time.Second, true, 41 * time.Second}} {
		before := time.Now()
		if err := s.Take(context.Background(), now+int64(c.at), []store.Hit{{Key: "fw1", Rule: fw, Cost: 1, Veto: true}}, out[:1]); err != nil {
			t.Fatal(err)
		}
		if c.sets {
			set = [2]time.Time{before, time.Now()}
		}
		check("fw1", c.want)
	}
}

// checkExpiry checks that key expires want after a call that ran between
// before and after set its expiry: its PEXPIRETIME, on Redis's clock
// (this machine's), less want falls in that span. (A PTTL read later
// would count the time taken since, seconds on a busy machine.)
func checkExpiry(t *testing.T, srv *redistest.Server, key string, want time.Duration, before, after time.Time) {
	t.Helper()
	ms, err := strconv.ParseInt(srv.CLI("pexpiretime", key), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := before.Add(want).UnixMilli(), after.Add(want).UnixMilli()
	if ms < lo || ms > hi {
		t.Errorf("%s: expires at %v, want %v after the call that set it (ran %v to %v): off by %v",
			key, time.UnixMilli(ms).Format(time.StampMilli), want, before.Format(time.StampMilli), after.Format(time.StampMilli),
			time.Duration(ms-min(max(ms, lo), hi))*time.Millisecond)
	}
}
