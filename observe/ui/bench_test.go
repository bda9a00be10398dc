package ui_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/observe/ui"
)

// BenchmarkTraffic measures a sample and a view of 1,000 rules with a full
// minute of samples: the sampler's cost per second and the traffic
// endpoint's per poll.
func BenchmarkTraffic(b *testing.B) {
	c := newCounts()
	tr := ui.NewTraffic(c, time.Second, ui.DefaultWindow)
	for i := range 1000 {
		c.add("web", fmt.Sprintf("rule%d", i), "", uint64(i), 1, 0, 0)
	}
	for s := range ui.DefaultWindow + 1 {
		c.add("web", "rule1", "", 1, 0, 0, 0)
		tr.Sample(at(float64(s)))
	}
	b.Run("Sample", func(b *testing.B) {
		b.ReportAllocs()
		s := float64(ui.DefaultWindow + 1)
		for b.Loop() {
			tr.Sample(at(s))
			s++
		}
	})
	b.Run("View", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			tr.View()
		}
	})
}
