package split_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/split"
	"github.com/sluicehq/sluice/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// shortPeriod is cmd/sluice's route: periods under a minute.
func shortPeriod(h *store.Hit) bool { return h.Rule.Period() < time.Minute }

// byKey sends a key to a store by its last byte's parity, whatever its
// rule, so that the suite's batches of keys "a", "b", "c" or "0" to "3"
// (its concurrent batches) span both stores.
func byKey(h *store.Hit) bool { return h.Key[len(h.Key)-1]%2 == 1 }

func TestSplit_Suite(t *testing.T) {
	for name, route := range map[string]func(*store.Hit) bool{"period": shortPeriod, "key": byKey} {
		t.Run(name, func(t *testing.T) {
			storetest.RunOptions(t, func(*testing.T) store.Store {
				return split.New(memory.New(memory.Options{}), memory.New(memory.Options{}), route, split.Options{})
			}, storetest.Options{Takes: 2_000})
		})
	}
}

// keys is a store.Store that records the keys it was asked about, and
// fails when err is set.
type keys struct {
	store.Store
	seen        []string
	err         error
	failRefunds bool
}

func (k *keys) Take(ctx context.Context, now int64, hits []store.Hit, out []store.Decision) error {
	for _, h := range hits {
		k.seen = append(k.seen, h.Mode.String()+" "+h.Key)
	}
	if k.err != nil {
		return k.err
	}
	if k.failRefunds && hits[0].Mode == store.ModeRefund {
		return errors.New("refund failed")
	}
	return k.Store.Take(ctx, now, hits, out)
}

func rules(t *testing.T) (perSecond, perMinute *store.Rule) {
	return storetest.Window(t, 2, time.Second), storetest.Window(t, 3, time.Minute)
}

func hit(key string, r *store.Rule) store.Hit {
	return store.Hit{Key: key, Rule: r, Cost: 1, Veto: true}
}

func take(t *testing.T, st store.Store, hits ...store.Hit) ([]store.Decision, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := make([]store.Decision, len(hits))
	return out, st.Take(ctx, storetest.T0, hits, out)
}

// A request's hits go to the store of their rule's period, and one that
// touches a single store asks only that one.
func TestSplit_Routes(t *testing.T) {
	sec, min := rules(t)
	a, b := &keys{Store: memory.New(memory.Options{})}, &keys{Store: memory.New(memory.Options{})}
	st := split.New(a, b, shortPeriod, split.Options{})
	for _, hits := range [][]store.Hit{{hit("m", min)}, {hit("s", sec)}, {hit("m", min), hit("s", sec), hit("m2", min)}} {
		if _, err := take(t, st, hits...); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := strings.Join(a.seen, ","), "take m,take m,take m2"; got != want {
		t.Errorf("main store saw %q, want %q", got, want)
	}
	if got, want := strings.Join(b.seen, ","), "take s,take s"; got != want {
		t.Errorf("per-second store saw %q, want %q", got, want)
	}
}

// A batch that one store denies takes nothing from the other: the other's
// takes are refunded, and reported as the batch's contract says (allowed,
// with what was left before the batch).
func TestSplit_AllOrNothingAcrossStores(t *testing.T) {
	sec, min := rules(t)
	st := split.New(memory.New(memory.Options{}), memory.New(memory.Options{}), shortPeriod, split.Options{})
	steps := []struct {
		name string
		hits []store.Hit
		want []bool // allowed
		rem  []uint64
	}{
		{"both fit", []store.Hit{hit("s", sec), hit("m", min)}, []bool{true, true}, []uint64{1, 2}},
		{"use up s", []store.Hit{hit("s", sec)}, []bool{true}, []uint64{0}},
		// s (per-second store) denies: m's take in the main store is
		// given back.
		{"s denies", []store.Hit{hit("m", min), hit("s", sec)}, []bool{true, false}, []uint64{2, 0}},
		{"s denies again", []store.Hit{hit("m", min), hit("s", sec)}, []bool{true, false}, []uint64{2, 0}},
		// m has its 2 left: the refunds above landed.
		{"m alone", []store.Hit{hit("m", min), hit("m", min)}, []bool{true, true}, []uint64{1, 0}},
		// m (main) denies: the take of a fresh per-second key is given back.
		{"m denies", []store.Hit{hit("s2", sec), hit("m", min)}, []bool{true, false}, []uint64{2, 0}},
		{"s2 untouched", []store.Hit{hit("s2", sec), hit("s2", sec)}, []bool{true, true}, []uint64{1, 0}},
	}
	for i, s := range steps {
		got, err := take(t, st, s.hits...)
		if err != nil {
			t.Fatalf("step %d %s: %v", i, s.name, err)
		}
		for k := range got {
			if got[k].Allowed != s.want[k] || got[k].Remaining != s.rem[k] {
				t.Errorf("step %d %s: hit %d = %+v, want allowed %v remaining %d", i, s.name, k, got[k], s.want[k], s.rem[k])
			}
		}
	}
	if f := st.Stats().RefundFailures; f != 0 {
		t.Errorf("refund failures = %d", f)
	}
}

// When one store fails, the request fails (the limiter's failure mode
// answers it) and the other store's takes are given back; a request that
// touches only the healthy store is served.
func TestSplit_OneStoreDown(t *testing.T) {
	sec, min := rules(t)
	down := errors.New("per-second redis down")
	b := &keys{Store: memory.New(memory.Options{}), err: down}
	st := split.New(memory.New(memory.Options{}), b, shortPeriod, split.Options{})
	for range 5 {
		if _, err := take(t, st, hit("m", min), hit("s", sec)); !errors.Is(err, down) {
			t.Fatalf("mixed request: error %v, want %v", err, down)
		}
	}
	got, err := take(t, st, hit("m", min))
	if err != nil {
		t.Fatalf("per-minute request with the per-second store down: %v", err)
	}
	if !got[0].Allowed || got[0].Remaining != 2 {
		t.Errorf("per-minute request = %+v, want allowed with 2 left (the failed requests took nothing)", got[0])
	}
}

// A refund that fails is counted, and the take stays: never a grant more.
func TestSplit_RefundFails(t *testing.T) {
	sec, min := rules(t)
	a := &keys{Store: memory.New(memory.Options{}), failRefunds: true}
	b := &keys{Store: memory.New(memory.Options{}), err: errors.New("down")}
	st := split.New(a, b, shortPeriod, split.Options{})
	if _, err := take(t, st, hit("m", min), hit("s", sec)); err == nil {
		t.Fatal("no error with the per-second store down")
	}
	if got, want := strings.Join(a.seen, ","), "take m,refund m"; got != want {
		t.Errorf("main store saw %q, want %q", got, want)
	}
	if f := st.Stats().RefundFailures; f != 1 {
		t.Errorf("refund failures = %d, want 1", f)
	}
	a.failRefunds, b.err = false, nil
	got, err := take(t, st, hit("m", min))
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Remaining != 1 {
		t.Errorf("m after a failed refund = %+v, want 1 left (the failed request's take stays)", got[0])
	}
}

// hitFails fails the Take of a batch whose hit failKey it holds with a
// store.HitError naming that hit by its index in the batch it was given.
type hitFails struct {
	store.Store
	failKey string
}

func (f *hitFails) Take(ctx context.Context, now int64, hits []store.Hit, out []store.Decision) error {
	for i, h := range hits {
		if h.Key == f.failKey {
			return fmt.Errorf("store: %w", &store.HitError{Index: i, Err: errors.New("bad value")})
		}
	}
	return f.Store.Take(ctx, now, hits, out)
}

// A store.HitError from either store names the hit by its index in the
// whole batch, not in that store's share: the limiter names the hit's rule
// from it.
func TestSplit_HitErrorIndex(t *testing.T) {
	sec, min := rules(t)
	for _, c := range []struct {
		name, failKey string
		main          bool
		want          int
	}{{"per-second store", "s2", false, 3}, {"main store", "m2", true, 2}} {
		t.Run(c.name, func(t *testing.T) {
			var a, b store.Store = memory.New(memory.Options{}), memory.New(memory.Options{})
			if c.main {
				a = &hitFails{Store: a, failKey: c.failKey}
			} else {
				b = &hitFails{Store: b, failKey: c.failKey}
			}
			st := split.New(a, b, shortPeriod, split.Options{})
			_, err := take(t, st, hit("m1", min), hit("s1", sec), hit("m2", min), hit("s2", sec))
			var he *store.HitError
			if !errors.As(err, &he) || he.Index != c.want {
				t.Fatalf("error %v (%+v), want a HitError of index %d", err, he, c.want)
			}
		})
	}
}
