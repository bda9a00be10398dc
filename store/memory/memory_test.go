package memory

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/storetest"
)

const t0 = storetest.T0

func TestStore(t *testing.T) {
	storetest.Run(t, func(*testing.T) store.Store { return New(Options{}) })
}

// The suite's concurrency cases scale down (as for Redis) and still hold.
func TestStoreSmall(t *testing.T) {
	storetest.RunOptions(t, func(*testing.T) store.Store { return New(Options{}) },
		storetest.Options{Goroutines: 3, Takes: 20, Budget: 2})
}

// take1 takes cost from key at now and reports the decision.
func take1(t testing.TB, s *Store, now int64, key string, r *store.Rule, cost uint64) store.Decision {
	t.Helper()
	out := make([]store.Decision, 1)
	if err := s.Take(context.Background(), now, []store.Hit{{Key: key, Rule: r, Cost: cost, Veto: true}}, out); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

func TestSweep(t *testing.T) {
	s := New(Options{})
	w := storetest.Window(t, 10, time.Minute)
	b := storetest.Bucket(t, 1, time.Second, 10)
	take1(t, s, t0, "w", w, 1)
	take1(t, s, t0, "b", b, 4)
	take1(t, s, t0, "check", w, 0)
	if s.Len() != 2 {
		t.Fatalf("Len = %d after two takes and a check, want 2", s.Len())
	}
	// Fresh only a second or more ago counts: the bucket is full at
	// t0+4s, the window ends at t0+1m.
	for _, c := range []struct {
		at        time.Duration
		removed   int
		remaining int
	}{{4 * time.Second, 0, 2}, {5 * time.Second, 1, 1}, {time.Minute, 0, 1}, {time.Minute + time.Second, 1, 0}} {
		if n := s.Sweep(t0 + int64(c.at)); n != c.removed || s.Len() != c.remaining {
			t.Fatalf("Sweep(t0+%v) removed %d, left %d; want %d, %d", c.at, n, s.Len(), c.removed, c.remaining)
		}
	}
	if st := s.Stats(); st != (Stats{Keys: 0, Inserts: 2, Swept: 2}) {
		t.Fatalf("Stats = %+v", st)
	}
	// A swept key starts fresh, as it would have been.
	if d := take1(t, s, t0+int64(2*time.Minute), "w", w, 10); !d.Allowed {
		t.Fatalf("take after sweep: %+v", d)
	}
}

// Sweeps racing takes lose no update: each window of each key grants
// exactly its limit while the previous windows' states are swept.
func TestSweepRacingTake(t *testing.T) {
	const (
		steps   = 40
		keys    = 8
		limit   = 16
		workers = 8
		takes   = 64 // per worker per step: more than keys*limit/workers
	)
	s := New(Options{})
	r := storetest.Window(t, limit, time.Second)
	var granted [steps][keys]atomic.Int64
	for step := range steps {
		// Two seconds per step: the last step's states are fresh (a
		// second past their window's end) and get swept while the
		// takers fill the new window.
		now := t0 + int64(step)*int64(2*time.Second)
		var done atomic.Bool
		var sweeper sync.WaitGroup
		started := make(chan struct{})
		sweeper.Go(func() {
			close(started)
			for !done.Load() {
				s.Sweep(now)
			}
		})
		<-started
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				hit := []store.Hit{{Rule: r, Cost: 1, Veto: true}}
				out := make([]store.Decision, 1)
				for i := range takes {
					k := (w + i) % keys
					hit[0].Key = fmt.Sprint("k", k)
					if err := s.Take(context.Background(), now, hit, out); err != nil {
						t.Error(err)
						return
					}
					if out[0].Allowed {
						granted[step][k].Add(1)
					}
				}
			})
		}
		wg.Wait()
		done.Store(true)
		sweeper.Wait()
	}
	for step := range steps {
		for k := range keys {
			if g := granted[step][k].Load(); g != limit {
				t.Errorf("step %d key %d: granted %d, want exactly %d", step, k, g, limit)
			}
		}
	}
	if st := s.Stats(); st.Swept == 0 {
		t.Fatalf("no state was swept: %+v", st)
	}
}

func TestMaxKeys(t *testing.T) {
	s := New(Options{MaxKeys: 256}) // room is made 16 keys at a time
	b := storetest.Bucket(t, 1, time.Second, 10)
	for i := range 200 {
		take1(t, s, t0, fmt.Sprint("old", i), b, 1)
	}
	// A minute later the old buckets are full again: room comes from them
	// first, losslessly.
	later := t0 + int64(time.Minute)
	for i := range 100 {
		take1(t, s, later, fmt.Sprint("new", i), b, 1)
	}
	st := s.Stats()
	if st.Evictions != 0 || st.Swept != 200 || st.Keys > 256 {
		t.Fatalf("after 300 keys with 200 fresh: %+v, want no evictions", st)
	}
	for i := range 1000 {
		take1(t, s, later, fmt.Sprint("hostile", i), b, 1)
	}
	st = s.Stats()
	if st.Keys > 256 || st.Evictions == 0 || st.Inserts != 1300 || uint64(st.Keys)+st.Swept+st.Evictions != st.Inserts {
		t.Fatalf("after 1300 keys: %+v, want ≤256 keys and every insert accounted for", st)
	}
	// Evicted keys start fresh; kept keys keep their state.
	kept := 0
	for i := range 1000 {
		if d := take1(t, s, later, fmt.Sprint("hostile", i), b, 0); d.Remaining == 9 {
			kept++
		}
	}
	if kept == 0 || kept > 256 {
		t.Fatalf("%d hostile keys kept their state, want 1..256", kept)
	}
}

// A key aliasing a reused buffer is copied when stored.
func TestKeyIsCopied(t *testing.T) {
	s := New(Options{})
	w := storetest.Window(t, 1, time.Minute)
	buf := []byte("key-a")
	key := unsafe.String(&buf[0], len(buf))
	take1(t, s, t0, key, w, 1)
	copy(buf, "key-b")
	if d := take1(t, s, t0, "key-a", w, 1); d.Allowed {
		t.Fatal("key-a lost its state when the caller's buffer changed")
	}
	if d := take1(t, s, t0, "key-b", w, 1); !d.Allowed {
		t.Fatal("key-b shares key-a's state")
	}
}

func TestTakeAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	s := New(Options{})
	w := storetest.Window(t, 1<<30, time.Hour)
	b := storetest.Bucket(t, 1<<29, time.Second, 1<<30)
	hits := []store.Hit{
		{Key: "a", Rule: w, Cost: 1, Veto: true},
		{Key: "b", Rule: b, Cost: 1, Veto: true},
		{Key: "c", Rule: w, Cost: 1},
		{Key: "d", Rule: b, Cost: 1, Veto: true, Mode: store.ModeSaturate},
	}
	denied := append(hits[:2:2], store.Hit{Key: "e", Rule: storetest.Window(t, 0, time.Hour), Cost: 1, Veto: true})
	sw := storetest.Sliding(t, store.MaxSlidingWindowLimit, time.Hour)
	sliding := []store.Hit{{Key: "s", Rule: sw, Cost: 1, Veto: true}, {Key: "a", Rule: w, Cost: 1, Veto: true}}
	full := []store.Hit{{Key: "f", Rule: storetest.Sliding(t, 7, time.Second), Cost: 8, Veto: true}}
	// Charges and refunds: a fixed window past its limit, a sliding
	// window and a token bucket in debt, a refund.
	charges := []store.Hit{
		{Key: "g", Rule: storetest.Window(t, 5, time.Hour), Cost: 3, Veto: true, Mode: store.ModeCharge},
		{Key: "h", Rule: storetest.Sliding(t, 5, time.Hour), Cost: 3, Veto: true, Mode: store.ModeCharge},
		{Key: "i", Rule: storetest.Bucket(t, 1, time.Hour, 5), Cost: 3, Veto: true, Mode: store.ModeCharge},
		{Key: "b", Rule: b, Cost: 1, Mode: store.ModeRefund},
	}
	out := make([]store.Decision, len(hits))
	ctx := context.Background()
	s.Take(ctx, t0, hits, out)
	s.Take(ctx, t0, sliding, out[:2])
	s.Take(ctx, t0, charges, out[:4])
	for name, f := range map[string]func(){
		"one hit":                   func() { s.Take(ctx, t0, hits[:1], out[:1]) },
		"four hits":                 func() { s.Take(ctx, t0, hits, out) },
		"denied batch":              func() { s.Take(ctx, t0, denied, out[:3]) },
		"sliding window":            func() { s.Take(ctx, t0, sliding[:1], out[:1]) },
		"sliding window in a batch": func() { s.Take(ctx, t0, sliding, out[:2]) },
		"sliding window denied":     func() { s.Take(ctx, t0, full, out[:1]) },
		"charges and a refund":      func() { s.Take(ctx, t0, charges, out[:4]) },
	} {
		if n := testing.AllocsPerRun(1000, f); n != 0 {
			t.Errorf("%s: %v allocations per Take on existing keys", name, n)
		}
	}
}

// Batches over overlapping token buckets, with the clock moving and
// callers' readings interleaving (as a clock stepping back and forth),
// never grant a key more than its burst plus what refilled over the span
// of instants used, rollbacks included.
func TestBatchesUnderRefill(t *testing.T) {
	const (
		keys    = 4
		workers = 8
		batches = 4000
		rate    = 1000 // per second
		burst   = 10
	)
	s := New(Options{})
	r := storetest.Bucket(t, rate, time.Second, burst)
	clock := storetest.NewClock(t0)
	var committed [keys]atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			out := make([]store.Decision, 3)
			hits := make([]store.Hit, 3)
			for i := range batches {
				for j := range hits {
					hits[j] = store.Hit{Key: fmt.Sprint("k", (w+i*(j+1))%keys), Rule: r, Cost: uint64(1 + j%2), Veto: true}
				}
				now := clock.Now()
				if i%3 == 0 {
					clock.Advance(50 * time.Microsecond)
				}
				if err := s.Take(context.Background(), now, hits, out); err != nil {
					t.Error(err)
					return
				}
				if out[0].Allowed && out[1].Allowed && out[2].Allowed {
					for _, h := range hits {
						committed[h.Key[1]-'0'].Add(int64(h.Cost))
					}
				}
			}
		})
	}
	wg.Wait()
	span := time.Duration(clock.Now() - t0)
	bound := burst + int64(span)*rate/int64(time.Second)
	total := int64(0)
	for k := range keys {
		c := committed[k].Load()
		total += c
		if c > bound {
			t.Errorf("key %d: granted %d tokens over %v, bound %d", k, c, span, bound)
		}
	}
	if total == 0 {
		t.Fatal("nothing was granted")
	}
}

// interleavingClock stands for another caller: when the rollback reads
// the time, that caller takes from the same key at a later instant first.
type interleavingClock struct {
	st  *Store
	hit store.Hit
	at  int64
}

func (c *interleavingClock) Now() int64 {
	out := make([]store.Decision, 1)
	if err := c.st.Take(context.Background(), c.at, []store.Hit{c.hit}, out); err != nil || !out[0].Allowed {
		panic(fmt.Sprintf("interleaved take: %v %+v", err, out[0]))
	}
	return c.at
}

// A rollback that runs after the bucket refilled past the take returns
// nothing: the caller that took in between keeps its debt. (Rolled back as
// of the batch's own instant, the refund would erase that caller's take.)
func TestRollbackAtClockTime(t *testing.T) {
	tb := storetest.Bucket(t, 1, time.Second, 10)
	later := t0 + 5*int64(time.Second) // the take of 5 has refilled by then
	other := store.Hit{Key: "x", Rule: tb, Cost: 1, Veto: true}
	st := New(Options{})
	st.clock = &interleavingClock{st: st, hit: other, at: later}
	out := make([]store.Decision, 2)
	hits := []store.Hit{{Key: "x", Rule: tb, Cost: 5, Veto: true}, {Key: "y", Rule: storetest.Window(t, 0, time.Second), Cost: 1, Veto: true}}
	if err := st.Take(context.Background(), t0, hits, out); err != nil || out[1].Allowed {
		t.Fatalf("batch: %v %+v", err, out)
	}
	if err := st.Take(context.Background(), later, []store.Hit{{Key: "x", Rule: tb}}, out[:1]); err != nil {
		t.Fatal(err)
	}
	if out[0].Remaining != 9 {
		t.Fatalf("remaining %d after the rollback, want 9 (10 less the other caller's 1)", out[0].Remaining)
	}
}

func TestRangeKeys(t *testing.T) {
	st := New(Options{})
	r := storetest.Window(t, 10, time.Minute)
	out := make([]store.Decision, 1)
	for _, k := range []string{"a|x", "a|y", "b|x"} {
		if err := st.Take(context.Background(), t0, []store.Hit{{Key: k, Rule: r, Cost: 3, Veto: true}}, out); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]uint64{}
	st.RangeKeys("a|", t0, func(key string, d store.Decision) bool {
		got[key] = d.Remaining
		return true
	})
	if len(got) != 2 || got["a|x"] != 7 || got["a|y"] != 7 {
		t.Fatalf("RangeKeys(a|) = %v, want a|x and a|y with 7 remaining", got)
	}
	n := 0
	st.RangeKeys("", t0, func(string, store.Decision) bool { n++; return false })
	if n != 1 {
		t.Fatalf("RangeKeys went on after fn returned false: %d calls", n)
	}
	// Looking changes nothing.
	if err := st.Take(context.Background(), t0, []store.Hit{{Key: "a|x", Rule: r}}, out); err != nil || out[0].Remaining != 7 {
		t.Fatalf("after RangeKeys: %v %+v", err, out[0])
	}
}
