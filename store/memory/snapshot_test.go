package memory

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/storetest"
)

// snapshotOf writes s's snapshot at now (wall = now) and returns its bytes.
func snapshotOf(t testing.TB, s *Store, now int64) []byte {
	t.Helper()
	var b bytes.Buffer
	st, err := s.WriteSnapshot(&b, now, now)
	if err != nil {
		t.Fatal(err)
	}
	if st.Bytes != int64(b.Len()) {
		t.Fatalf("WriteSnapshot reports %d bytes, wrote %d", st.Bytes, b.Len())
	}
	return b.Bytes()
}

// reload decodes b and restores it into a new store at now, rules
// resolving keys.
func reload(t testing.TB, b []byte, now int64, rules map[string]*store.Rule) (*Store, RestoreStats) {
	t.Helper()
	sn, err := ReadSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	s := New(Options{})
	st, err := s.Restore(sn, now, func(key string) *store.Rule { return rules[key] })
	if err != nil {
		t.Fatal(err)
	}
	return s, st
}

// ruleSet is one rule of each form, by key.
func ruleSet(t testing.TB) map[string]*store.Rule {
	return map[string]*store.Rule{
		"day":    storetest.Window(t, 5, 24*time.Hour),
		"wide":   storetest.Window(t, 1<<40, time.Hour),
		"bucket": storetest.Bucket(t, 10, time.Minute, 10),
		"slide":  storetest.Sliding(t, 100, time.Minute),
		"month":  storetest.CalendarWindow(t, 100, storetest.Calendar(t, store.CalendarMonth, 1, "Europe/Berlin")),
	}
}

// A restored store decides exactly as the original at every later
// instant: the snapshot is the whole state.
func TestSnapshot_RoundTrip(t *testing.T) {
	rules := ruleSet(t)
	s := New(Options{})
	costs := map[string]uint64{"day": 3, "wide": 1 << 35, "bucket": 7, "slide": 60, "month": 42}
	for k, c := range costs {
		take1(t, s, t0, k, rules[k], c)
	}
	b := snapshotOf(t, s, t0)
	r, st := reload(t, b, t0, rules)
	if st != (RestoreStats{Restored: 5}) {
		t.Fatalf("Restore = %+v, want 5 restored", st)
	}
	for _, at := range []time.Duration{0, time.Second, 30 * time.Second, 59 * time.Second, time.Hour} {
		for k := range costs {
			want := take1(t, s, t0+int64(at), k, rules[k], 1)
			if got := take1(t, r, t0+int64(at), k, rules[k], 1); got != want {
				t.Errorf("t0+%v %s: restored %+v, original %+v", at, k, got, want)
			}
		}
	}
}

// Across the gap between the snapshot and the restore, windows that ended
// are dropped and buckets refill by the time that passed (the fake
// instants stand for the store's clock, which serve continues across the
// restart).
func TestSnapshot_Gap(t *testing.T) {
	rules := ruleSet(t)
	day, bucket, slide := rules["day"], rules["bucket"], rules["slide"]
	s := New(Options{})
	take1(t, s, t0, "day", day, 3)        // 2 left until the day ends
	take1(t, s, t0, "bucket", bucket, 10) // empty; 1 token per 6 s
	take1(t, s, t0, "slide", slide, 100)  // full for a minute and a bucket
	b := snapshotOf(t, s, t0)
	dayEnd := int64(day.WindowEnd(t0)) * int64(time.Second)

	for _, c := range []struct {
		name                 string
		at                   int64
		restored, lapsed     int
		day, bucket, sliding uint64 // remaining after a check
	}{
		{"no gap", t0, 3, 0, 2, 0, 0},
		{"30 s", t0 + int64(30*time.Second), 3, 0, 2, 5, 0},
		{"61 s", t0 + int64(61*time.Second), 2, 1, 2, 10, 0},
		{"2 min", t0 + int64(2*time.Minute), 1, 2, 2, 10, 100},
		{"next day", dayEnd, 0, 3, 5, 10, 100},
	} {
		r, st := reload(t, b, c.at, rules)
		if st.Restored != c.restored || st.Lapsed != c.lapsed {
			t.Errorf("%s: Restore = %+v, want %d restored, %d lapsed", c.name, st, c.restored, c.lapsed)
		}
		for k, want := range map[string]uint64{"day": c.day, "bucket": c.bucket, "slide": c.sliding} {
			if d := take1(t, r, c.at, k, rules[k], 0); d.Remaining != want {
				t.Errorf("%s: %s remaining %d, want %d", c.name, k, d.Remaining, want)
			}
		}
	}
}

// Counters without a rule, or whose rule's state has the other form, are
// dropped; a snapshot none of whose counters has a rule is another
// config's and changes nothing.
func TestSnapshot_Rules(t *testing.T) {
	rules := ruleSet(t)
	s := New(Options{})
	for k, r := range rules {
		take1(t, s, t0, k, r, 1)
	}
	sn, err := ReadSnapshot(snapshotOf(t, s, t0))
	if err != nil {
		t.Fatal(err)
	}
	r := New(Options{})
	narrowHour := storetest.Window(t, 10, time.Hour)
	st, err := r.Restore(sn, t0, func(key string) *store.Rule {
		switch key {
		case "wide":
			return narrowHour // a wide rule's limit lowered below 2^32
		case "day", "bucket":
			return rules[key]
		}
		return nil
	})
	if err != nil || st != (RestoreStats{Restored: 2, NoRule: 3}) {
		t.Fatalf("Restore = %+v, %v; want 2 restored, 3 without a rule", st, err)
	}
	if r.Len() != 2 {
		t.Fatalf("Len = %d", r.Len())
	}

	foreign := New(Options{})
	st, err = foreign.Restore(sn, t0, func(string) *store.Rule { return nil })
	if !errors.Is(err, ErrForeign) || foreign.Len() != 0 || st.NoRule != 5 {
		t.Fatalf("Restore with no rules = %+v, %v, %d keys; want ErrForeign and nothing", st, err, foreign.Len())
	}
	// An empty snapshot is nobody's: restoring it is no error.
	empty, err := ReadSnapshot(snapshotOf(t, New(Options{}), t0))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := New(Options{}).Restore(empty, t0, func(string) *store.Rule { return nil }); err != nil || st != (RestoreStats{}) {
		t.Fatalf("empty snapshot: %+v, %v", st, err)
	}
}

// A key the store holds already keeps the more used state; a full store
// restores no more keys.
func TestSnapshot_MergeAndBound(t *testing.T) {
	w := storetest.Window(t, 10, time.Hour)
	rules := map[string]*store.Rule{"a": w, "b": w, "c": w}
	s := New(Options{})
	take1(t, s, t0, "a", w, 2)
	take1(t, s, t0, "b", w, 6)
	take1(t, s, t0, "c", w, 1)
	sn, err := ReadSnapshot(snapshotOf(t, s, t0))
	if err != nil {
		t.Fatal(err)
	}
	live := New(Options{})
	take1(t, live, t0, "a", w, 5) // more used than the snapshot's 2
	take1(t, live, t0, "b", w, 1) // less used than the snapshot's 6
	if _, err := live.Restore(sn, t0, func(k string) *store.Rule { return rules[k] }); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]uint64{"a": 5, "b": 4, "c": 9} {
		if d := take1(t, live, t0, k, w, 0); d.Remaining != want {
			t.Errorf("%s: remaining %d after the merge, want %d", k, d.Remaining, want)
		}
	}

	small := New(Options{MaxKeys: 2})
	st, err := small.Restore(sn, t0, func(k string) *store.Rule { return rules[k] })
	if err != nil || st.Restored != 2 || st.Full != 1 || small.Len() != 2 {
		t.Fatalf("Restore into MaxKeys 2: %+v, %v, %d keys", st, err, small.Len())
	}
}

// Fresh states are not written; removed ones never are.
func TestSnapshot_SkipsFresh(t *testing.T) {
	w := storetest.Window(t, 10, time.Minute)
	s := New(Options{})
	take1(t, s, t0, "old", w, 1)
	take1(t, s, t0+int64(time.Minute), "new", w, 1)
	sn, err := ReadSnapshot(snapshotOf(t, s, t0+int64(time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	if sn.Len() != 1 || sn.entries[0].key != "new" {
		t.Fatalf("snapshot holds %+v, want only the live key", sn.entries)
	}
}

// withCRC recomputes b's checksum, so that a test reaches the decoding
// behind it.
func withCRC(b []byte) []byte {
	b = bytes.Clone(b)
	if len(b) >= 4 {
		binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], castagnoli))
	}
	return b
}

// Every truncation and every changed byte is refused, as is an unknown
// version or a count that does not match; nothing is half-read.
func TestReadSnapshot_Refuses(t *testing.T) {
	rules := ruleSet(t)
	s := New(Options{})
	for k, r := range rules {
		take1(t, s, t0, k, r, 1)
	}
	b := snapshotOf(t, s, t0)
	for n := range len(b) {
		if sn, err := ReadSnapshot(b[:n]); !errors.Is(err, ErrSnapshot) || sn != nil {
			t.Fatalf("truncated to %d of %d bytes: %v, %v", n, len(b), sn, err)
		}
	}
	for i := range b {
		c := bytes.Clone(b)
		c[i] ^= 0x5a
		if _, err := ReadSnapshot(c); !errors.Is(err, ErrSnapshot) {
			t.Fatalf("byte %d changed: %v", i, err)
		}
	}
	for name, c := range map[string]struct {
		b    []byte
		want string
	}{
		"version 2":      {withCRC(append(append([]byte(snapshotMagic), 2, 0, 0, 0), b[12:]...)), "unknown format version 2"},
		"another file":   {[]byte(strings.Repeat("{\"x\": 1}\n", 8)), "not a snapshot"},
		"count":          {withCRC(append(bytes.Clone(b[:len(b)-12]), 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)), "count 9, but 5 entries"},
		"trailing bytes": {withCRC(append(bytes.Clone(b[:len(b)-4]), 0, 0, 0, 0, 0, 0, 0)), "bytes after the entries"},
	} {
		if _, err := ReadSnapshot(c.b); !errors.Is(err, ErrSnapshot) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
	// A tombstone (never written) is refused even under a good checksum.
	var t1 bytes.Buffer
	t1.WriteString(snapshotMagic)
	t1.Write(make([]byte, 4+16))
	b = t1.Bytes()
	binary.LittleEndian.PutUint32(b[8:], snapshotVersion)
	b = append(b, kindNarrow, 1, 'k')
	b = binary.LittleEndian.AppendUint64(b, store.Tombstone)
	b = append(b, kindEnd, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
	if _, err := ReadSnapshot(withCRC(b)); err == nil || !strings.Contains(err.Error(), "removed state") {
		t.Errorf("tombstone: %v", err)
	}
}

// Snapshots written while takes go on never over-grant after a restore:
// a counter is written as it was at some instant of the write, so what a
// restored store grants, with what was granted before the write began,
// stays within the limit (and it grants at least what was left by the
// takes begun before the write ended: a take counted as granted only after
// its own Take returns, so one that the write saw may not be counted yet).
func TestSnapshot_ConcurrentWithTake(t *testing.T) {
	const (
		keys    = 64
		limit   = 200
		workers = 4
		rounds  = 6
	)
	w := storetest.Window(t, limit, time.Hour)
	rules := map[string]*store.Rule{}
	names := make([]string, keys)
	for i := range names {
		names[i] = "k" + string(rune('A'+i%26)) + string(rune('a'+i/26))
		rules[names[i]] = w
	}
	s := New(Options{})
	var granted, begun [keys]atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			for i := g; !stop.Load(); i++ {
				k := i % keys
				begun[k].Add(1)
				if take1(t, s, t0, names[k], w, 1).Allowed {
					granted[k].Add(1)
				}
			}
		})
	}
	for range rounds {
		var before, after [keys]int64
		for k := range keys {
			before[k] = granted[k].Load()
		}
		b := snapshotOf(t, s, t0)
		for k := range keys {
			after[k] = min(begun[k].Load(), limit)
		}
		r, _ := reload(t, b, t0, rules)
		for k, name := range names {
			more := int64(0)
			for take1(t, r, t0, name, w, 1).Allowed {
				more++
			}
			if before[k]+more > limit {
				t.Fatalf("%s: %d granted before the write, %d after the restore: over %d", name, before[k], more, limit)
			}
			if after[k]+more < limit {
				t.Fatalf("%s: %d takes begun by the end of the write, only %d granted after the restore, of %d", name, after[k], more, limit)
			}
		}
	}
	stop.Store(true)
	wg.Wait()
}

// A key longer than a reader accepts is not written.
func TestSnapshot_OverlongKey(t *testing.T) {
	w := storetest.Window(t, 10, time.Hour)
	s := New(Options{})
	take1(t, s, t0, strings.Repeat("k", MaxSnapshotKey+1), w, 1)
	take1(t, s, t0, "k", w, 1)
	sn, err := ReadSnapshot(snapshotOf(t, s, t0))
	if err != nil || sn.Len() != 1 {
		t.Fatalf("snapshot with an overlong key: %v, %v", sn, err)
	}
}

// FuzzReadSnapshot: no input panics or is half-read; what reads restores,
// and a restored store's snapshot reads back with the same counters.
func FuzzReadSnapshot(f *testing.F) {
	rules := ruleSet(f)
	s := New(Options{})
	for k, r := range rules {
		take1(f, s, t0, k, r, 1)
	}
	f.Add(snapshotOf(f, s, t0))
	f.Add(snapshotOf(f, New(Options{}), t0))
	f.Add([]byte(snapshotMagic))
	narrow, wide := storetest.Window(f, 10, time.Hour), storetest.Window(f, 1<<40, time.Hour)
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, in := range [][]byte{b, withCRC(b)} {
			sn, err := ReadSnapshot(in)
			if err != nil {
				if !errors.Is(err, ErrSnapshot) || sn != nil {
					t.Fatalf("error %v not wrapping ErrSnapshot, or a snapshot with it", err)
				}
				continue
			}
			if sn.Len() > len(in)/10 {
				t.Fatalf("%d entries from %d bytes", sn.Len(), len(in))
			}
			r := New(Options{})
			st, err := r.Restore(sn, sn.Now, func(key string) *store.Rule {
				if strings.HasPrefix(key, "w") {
					return wide
				}
				return narrow
			})
			if err != nil && !errors.Is(err, ErrForeign) {
				t.Fatal(err)
			}
			if st.Restored+st.Lapsed+st.NoRule+st.Full != sn.Len() {
				t.Fatalf("Restore accounted for %+v of %d", st, sn.Len())
			}
			again, err := ReadSnapshot(snapshotOf(t, r, sn.Now))
			if err != nil || again.Len() != r.Len() {
				t.Fatalf("restored store's snapshot: %v, %d entries of %d keys", err, again.Len(), r.Len())
			}
		}
	})
}

// failAfter fails every write after its first n bytes.
type failAfter struct{ n int }

func (f *failAfter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		n := f.n
		f.n = 0
		return n, errors.New("disk full")
	}
	f.n -= len(p)
	return len(p), nil
}

// A write error ends the walk and is returned.
func TestSnapshot_WriteError(t *testing.T) {
	w := storetest.Window(t, 10, time.Hour)
	s := New(Options{})
	for i := range 20000 {
		take1(t, s, t0, fmt.Sprintf("key-%d", i), w, 1)
	}
	f := &failAfter{n: 100 << 10}
	st, err := s.WriteSnapshot(f, t0, t0)
	if err == nil || err.Error() != "disk full" || st.Bytes > 100<<10 {
		t.Fatalf("WriteSnapshot into a full disk: %+v, %v", st, err)
	}
}
