package quota

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// burstSim is a fleet of proxies on one or more replicas (Services),
// stepping through time with a fake clock: each proxy enforces the
// requests_per_time_unit share it was last sent in windows of one second,
// as the filter does, and reports its allowed and denied requests every
// second; each replica ticks once a second, at its own phase.
type burstSim struct {
	t        *testing.T
	replicas []*Service
	proxies  []*burstProxy
	// rate is proxy i's demand in second sec, per second.
	rate func(i, sec int) float64
	// phase is the step of each second at which the proxies report.
	phase int
}

type burstProxy struct {
	st              *Stream
	share           uint64
	has             bool
	used            uint64 // in the current window
	allowed, denied uint64 // since the last report
	acc             float64
}

const burstSteps = 100 // per second

func newBurstSim(t *testing.T, replicas []*Service, n int, rate func(i, sec int) float64) *burstSim {
	b := &burstSim{t: t, replicas: replicas, rate: rate}
	for i := range n {
		st, err := replicas[i%len(replicas)].Open()
		if err != nil {
			t.Fatal(err)
		}
		b.proxies = append(b.proxies, &burstProxy{st: st})
	}
	return b
}

// second runs second sec and returns what the fleet admitted in it. Each
// proxy reports at the start of the second, replica r ticks at (r+1)/(n+1)
// of it.
func (b *burstSim) second(sec int) float64 {
	var admitted float64
	for step := range burstSteps {
		now := at(float64(sec) + float64(step)/burstSteps)
		for i, p := range b.proxies {
			if step == b.phase {
				mustReport(b.t, p.st, now, use("tenant", "x", p.allowed, p.denied))
				p.allowed, p.denied = 0, 0
			}
			if step == 0 {
				p.used = 0
			}
			p.take()
			p.acc += b.rate(i, sec) / burstSteps
			for ; p.acc >= 1; p.acc-- {
				if !p.has || p.used < p.share {
					p.used++
					p.allowed++
					admitted++
				} else {
					p.denied++
				}
			}
		}
		for r, s := range b.replicas {
			if step == (r+1)*burstSteps/(len(b.replicas)+1) {
				_ = s.Tick(context.Background(), now)
			}
		}
	}
	return admitted
}

// take applies the proxy's pending assignments.
func (p *burstProxy) take() {
	for _, a := range p.st.Pending() {
		switch a.Kind {
		case RequestsPerUnit:
			p.share, p.has = a.Requests, true
		case DenyAll:
			p.share, p.has = 0, true
		}
	}
}

// bursty is the rotation of sluice bench --rlqs-demand bursty: proxy i
// at 160/s in the seconds s with s%4 == i%4, 10/s otherwise.
func bursty(i, sec int) float64 {
	if sec%4 == i%4 {
		return 160
	}
	return 10
}

// TestService_BurstyDemand: 50 proxies whose demand moves between them
// every second (a quarter of them at 160/s, the others at 10/s: 2.4 ×
// the limit of 1000/s in all) admit at least 0.9 × the limit every
// second once settled, and never more than 1.05 ×. Shares cut from the
// last report's demand admitted about 0.6 ×: the proxies holding the
// large shares were those whose burst had just ended.
func TestService_BurstyDemand(t *testing.T) {
	s, _ := newTestService(t, Options{})
	b := newBurstSim(t, []*Service{s}, 50, bursty)
	b.phase = 30
	for sec := range 20 {
		got := b.second(sec) / 1000
		fmt.Println(sec, got)
		if sec >= 6 && (got < 0.9 || got > 1.05) {
			t.Errorf("second %d admitted %.3f × the limit, want within [0.9, 1.05]", sec, got)
		}
	}
}

var _ = time.Second
