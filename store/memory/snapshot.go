package memory

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/sluicehq/sluice/store"
)

// A snapshot is the store's live states in one byte stream, format 1 (all
// integers little-endian):
//
//	header  "SLUICEMS" | version uint32 (1) | now int64 | wall int64
//	entry   kind byte (1 narrow, 2 wide) | key length uvarint | key
//	        | Word uint64 | High uint64 (wide only)
//	end     kind byte 0 | count uint64 (entries) | CRC-32C uint32
//
// now is the store's clock when the snapshot began (the time base of the
// states), wall the system's wall clock at the same instant; the CRC
// (Castagnoli) covers every byte before it. Entries are written while
// takes go on, so the count is known only at the end.

const (
	snapshotMagic   = "SLUICEMS"
	snapshotVersion = 1
	headerLen       = len(snapshotMagic) + 4 + 8 + 8
	trailerLen      = 1 + 8 + 4

	snapshotBlock = 64 << 10 // bytes written at once

	kindEnd    = 0
	kindNarrow = 1
	kindWide   = 2

	// MaxSnapshotKey bounds a key's length in a snapshot, far above any
	// key Sluice makes (hashed parts keep keys short).
	MaxSnapshotKey = 1 << 16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrSnapshot is wrapped by every error ReadSnapshot returns for a file it
// refuses: corrupt, truncated or of an unknown version.
var ErrSnapshot = errors.New("memory: bad snapshot")

// ErrForeign is returned by Restore when none of a snapshot's counters has
// a rule: the snapshot was taken under another config.
var ErrForeign = errors.New("memory: snapshot of another config: no counter has a rule")

// SnapshotStats describe a written snapshot.
type SnapshotStats struct {
	Counters int   // states written
	Bytes    int64 // bytes written
}

// WriteSnapshot writes the store's live states to w as a snapshot taken at
// now (the store's clock) and wall (the system's wall clock, Unix
// nanoseconds), skipping states that are fresh at now. It runs while takes
// go on and never blocks them: it walks the maps without locks and reads
// each state with one atomic load, so each counter is written as it was at
// some instant during the walk (a key removed and inserted again during
// the walk may be written twice; Restore keeps the more used state). w is
// written in blocks of 64 KiB.
func (s *Store) WriteSnapshot(w io.Writer, now, wall int64) (SnapshotStats, error) {
	sw := snapshotWriter{w: w, buf: make([]byte, 0, snapshotBlock+1<<10)}
	sw.buf = append(sw.buf, snapshotMagic...)
	sw.buf = binary.LittleEndian.AppendUint32(sw.buf, snapshotVersion)
	sw.buf = binary.LittleEndian.AppendUint64(sw.buf, uint64(now))
	sw.buf = binary.LittleEndian.AppendUint64(sw.buf, uint64(wall))
	s.m.RangeRelaxed(func(key string, c *cell) bool {
		if st := c.state.Load(); st != store.Tombstone && !store.Fresh(store.State{Word: st}, c.rule.Load(), now) {
			sw.entry(kindNarrow, key, store.State{Word: st})
		}
		return sw.err == nil
	})
	s.wm.RangeRelaxed(func(key string, c *wideCell) bool {
		if p := c.state.Load(); p != dead && !store.Fresh(*p, c.rule.Load(), now) {
			sw.entry(kindWide, key, *p)
		}
		return sw.err == nil
	})
	sw.buf = append(sw.buf, kindEnd)
	sw.buf = binary.LittleEndian.AppendUint64(sw.buf, uint64(sw.count))
	sw.crc = crc32.Update(sw.crc, castagnoli, sw.buf)
	sw.buf = binary.LittleEndian.AppendUint32(sw.buf, sw.crc)
	sw.flush()
	return SnapshotStats{Counters: sw.count, Bytes: sw.n}, sw.err
}

// snapshotWriter buffers a snapshot's bytes and keeps their CRC.
type snapshotWriter struct {
	w     io.Writer
	buf   []byte
	crc   uint32
	count int
	n     int64
	err   error
}

func (sw *snapshotWriter) entry(kind byte, key string, st store.State) {
	if len(key) > MaxSnapshotKey {
		return // (no key is this long; a reader would refuse it)
	}
	sw.buf = append(sw.buf, kind)
	sw.buf = binary.AppendUvarint(sw.buf, uint64(len(key)))
	sw.buf = append(sw.buf, key...)
	sw.buf = binary.LittleEndian.AppendUint64(sw.buf, st.Word)
	if kind == kindWide {
		sw.buf = binary.LittleEndian.AppendUint64(sw.buf, st.High)
	}
	sw.count++
	if len(sw.buf) >= snapshotBlock {
		sw.crc = crc32.Update(sw.crc, castagnoli, sw.buf)
		sw.flush()
	}
}

func (sw *snapshotWriter) flush() {
	if sw.err != nil {
		return
	}
	n, err := sw.w.Write(sw.buf)
	sw.n += int64(n)
	sw.err = err
	sw.buf = sw.buf[:0]
}

// Snapshot is a decoded, verified snapshot, ready for Restore.
type Snapshot struct {
	// Now and Wall are the store's clock and the system's wall clock
	// (Unix nanoseconds) when the snapshot was taken.
	Now, Wall int64
	entries   []snapEntry
}

type snapEntry struct {
	key   string
	state store.State
	wide  bool
}

// Len is the number of counters in the snapshot.
func (sn *Snapshot) Len() int { return len(sn.entries) }

// ReadSnapshot decodes a snapshot written by WriteSnapshot. It checks the
// magic, the version and the checksum before it decodes an entry, and
// every entry before it returns: any fault (a wrong checksum, a truncated
// or overlong file, a count that does not match, a narrow state that is
// a tombstone, an overlong key) returns an error wrapping ErrSnapshot and
// no snapshot. It holds a copy of b and 40 bytes per entry (an entry
// takes at least 10 bytes of b).
func ReadSnapshot(b []byte) (*Snapshot, error) {
	if len(b) < headerLen+trailerLen {
		return nil, fmt.Errorf("%w: truncated: %d bytes", ErrSnapshot, len(b))
	}
	if string(b[:len(snapshotMagic)]) != snapshotMagic {
		return nil, fmt.Errorf("%w: not a snapshot (magic %q)", ErrSnapshot, b[:len(snapshotMagic)])
	}
	if v := binary.LittleEndian.Uint32(b[len(snapshotMagic):]); v != snapshotVersion {
		return nil, fmt.Errorf("%w: unknown format version %d (this build reads %d)", ErrSnapshot, v, snapshotVersion)
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return nil, fmt.Errorf("%w: checksum %08x, want %08x (truncated or corrupt)", ErrSnapshot, got, sum)
	}
	sn := &Snapshot{
		Now:  int64(binary.LittleEndian.Uint64(b[len(snapshotMagic)+4:])),
		Wall: int64(binary.LittleEndian.Uint64(b[len(snapshotMagic)+12:])),
	}
	// One string holds every key: a key is a slice of it until Restore
	// copies it into the store.
	keys := string(body)
	p, off := body[headerLen:], headerLen
	for {
		if len(p) == 0 {
			return nil, fmt.Errorf("%w: truncated after %d entries", ErrSnapshot, len(sn.entries))
		}
		kind := p[0]
		p, off = p[1:], off+1
		if kind == kindEnd {
			break
		}
		if kind != kindNarrow && kind != kindWide {
			return nil, fmt.Errorf("%w: entry %d: unknown kind %d", ErrSnapshot, len(sn.entries), kind)
		}
		n, k := binary.Uvarint(p)
		words := 1
		if kind == kindWide {
			words = 2
		}
		if k <= 0 || n > MaxSnapshotKey || uint64(len(p)-k) < n+uint64(8*words) {
			return nil, fmt.Errorf("%w: entry %d: truncated or overlong key", ErrSnapshot, len(sn.entries))
		}
		p, off = p[k:], off+k
		e := snapEntry{key: keys[off : off+int(n)], wide: kind == kindWide}
		p, off = p[n:], off+int(n)
		e.state.Word = binary.LittleEndian.Uint64(p)
		if e.wide {
			e.state.High = binary.LittleEndian.Uint64(p[8:])
		} else if e.state.Word == store.Tombstone {
			return nil, fmt.Errorf("%w: entry %d: a removed state", ErrSnapshot, len(sn.entries))
		}
		p, off = p[8*words:], off+8*words
		sn.entries = append(sn.entries, e)
	}
	if len(p) != 8 {
		return nil, fmt.Errorf("%w: %d bytes after the entries, want the 8 of the count", ErrSnapshot, len(p))
	}
	if c := binary.LittleEndian.Uint64(p); c != uint64(len(sn.entries)) {
		return nil, fmt.Errorf("%w: count %d, but %d entries", ErrSnapshot, c, len(sn.entries))
	}
	return sn, nil
}

// RestoreStats count what Restore did with a snapshot's counters.
type RestoreStats struct {
	Restored int // states put in the store
	Lapsed   int // no use left at now: their window ended, their bucket refilled
	NoRule   int // no rule now, or one whose state takes another form (narrow, wide)
	Full     int // dropped because the store was at MaxKeys
}

// Restore puts a snapshot's states into the store, as of now (the store's
// clock). rule returns the current rule of a key, or nil if no rule makes
// that key any more; counters without a rule, and those whose rule is
// wide where the state is narrow or the reverse, are dropped, as are
// states that leave as much as a fresh one at now (a window that ended, a
// bucket that refilled). If the snapshot has counters and none has a rule,
// Restore changes nothing and returns ErrForeign. A key the store holds
// already (a take came first, or the snapshot holds it twice) keeps
// whichever state leaves less remaining at now. Restore stops inserting
// at MaxKeys. It is safe to run concurrently with Take.
func (s *Store) Restore(sn *Snapshot, now int64, rule func(key string) *store.Rule) (RestoreStats, error) {
	var st RestoreStats
	rules := make([]*store.Rule, len(sn.entries))
	for i, e := range sn.entries {
		if r := rule(e.key); r != nil && r.Wide() == e.wide {
			rules[i] = r
		} else {
			st.NoRule++
		}
	}
	if len(sn.entries) > 0 && st.NoRule == len(sn.entries) {
		return st, ErrForeign
	}
	for i, e := range sn.entries {
		r := rules[i]
		switch {
		case r == nil:
		case store.Fresh(e.state, r, now) || !usedMore(e.state, store.State{}, r, now):
			st.Lapsed++
		case s.keys.Load() >= s.maxKeys:
			st.Full++
		case e.wide:
			w := insert(s, s.wm, e.key, now, func() *wideCell {
				w := new(wideCell)
				w.state.Store(fresh)
				w.rule.Store(r)
				return w
			})
			mergeWide(w, e.state, r, now)
			st.Restored++
		default:
			c := insert(s, s.m, e.key, now, func() *cell {
				c := new(cell)
				c.rule.Store(r)
				return c
			})
			mergeNarrow(c, e.state, r, now)
			st.Restored++
		}
	}
	return st, nil
}

// usedMore reports whether state a leaves less remaining at now than b
// (or as much, but for longer).
func usedMore(a, b store.State, r *store.Rule, now int64) bool {
	va, vb := store.View(a, r, now), store.View(b, r, now)
	return va.Remaining < vb.Remaining || va.Remaining == vb.Remaining && va.ResetAfter > vb.ResetAfter
}

// mergeNarrow sets c's state to st unless it holds a more used one. A
// cell removed meanwhile (swept) is left removed: st was fresh enough to
// sweep, or a take will insert the key again.
func mergeNarrow(c *cell, st store.State, r *store.Rule, now int64) {
	for {
		w := c.state.Load()
		if w == store.Tombstone || !usedMore(st, store.State{Word: w}, r, now) || c.state.CompareAndSwap(w, st.Word) {
			return
		}
	}
}

// mergeWide is mergeNarrow for a wide rule's cell.
func mergeWide(c *wideCell, st store.State, r *store.Rule, now int64) {
	n := new(store.State)
	*n = st
	for {
		p := c.state.Load()
		if p == dead || !usedMore(st, *p, r, now) || c.state.CompareAndSwap(p, n) {
			return
		}
	}
}
