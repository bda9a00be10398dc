package ui

import (
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/observe"
)

// listing is a Snapshotter that lists the rules the test sets, with
// counts that grow by one a snapshot.
type listing struct {
	rules []string
	n     uint64
}

func (l *listing) Snapshot(dst []observe.RuleCounts) []observe.RuleCounts {
	l.n++
	for _, r := range l.rules {
		dst = append(dst, observe.RuleCounts{Domain: "web", Rule: r, Counts: observe.Counts{Within: l.n}})
	}
	return dst
}

func (l *listing) set(gen, n int) {
	l.rules = l.rules[:0]
	for i := range n {
		l.rules = append(l.rules, fmt.Sprintf("g%d_r%d", gen, i))
	}
}

// held checks that t's samples hold the listed rules only: one slot each,
// and no frame longer than that.
func held(t *testing.T, tr *Traffic, live int, step string) {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.rules) != live || len(tr.ids) != live {
		t.Fatalf("%s: %d slots, %d ids; want %d, the rules listed now", step, len(tr.rules), len(tr.ids), live)
	}
	for i, f := range tr.frames {
		if len(f.counts) > live {
			t.Fatalf("%s: frame %d holds %d counts, want at most %d", step, i, len(f.counts), live)
		}
	}
}

// TestTraffic_HoldsListedRulesOnly: the samples of a minute hold the
// rules listed at the last sample only, however many were renamed
// within the window (issue 23: a push of renamed rules every second kept
// sixty configs' rules), and a config that shrank gives its memory back.
func TestTraffic_HoldsListedRulesOnly(t *testing.T) {
	src := &listing{}
	tr := NewTraffic(src, 0, 0)
	for gen := range 3 * DefaultWindow {
		src.set(gen, 100)
		tr.Sample(int64(gen + 1))
		held(t, tr, 100, fmt.Sprintf("generation %d", gen))
	}
	src.set(-1, 10000)
	for s := range DefaultWindow + 1 {
		tr.Sample(int64(1000 + s))
	}
	held(t, tr, 10000, "10,000 rules")
	src.set(-2, 10)
	tr.Sample(2000)
	held(t, tr, 10, "10 rules")
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for i, f := range tr.frames {
		if cap(f.counts) > 1024 {
			t.Errorf("frame %d keeps room for %d counts after the config shrank to 10 rules", i, cap(f.counts))
		}
	}
	if cap(tr.rules) > 1024 || cap(tr.buf) > 1024 {
		t.Errorf("room for %d rules, %d snapshot entries kept after the config shrank to 10 rules", cap(tr.rules), cap(tr.buf))
	}
}
