package quota

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/store"
)

// downFleet fails every exchange, as a fleet whose Redis is down.
type downFleet struct{}

func (downFleet) Exchange(context.Context, time.Time, map[string]store.Claim, []string) (store.Grants, error) {
	return store.Grants{}, errors.New("redis: dial tcp 127.0.0.1:6379: connection refused")
}

// lockedLog is a log buffer Run's goroutine writes and the test reads.
type lockedLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startRun runs s.Run until the returned stop is called.
func startRun(t *testing.T, s *Service) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestRun_FleetFailuresLoggedOncePerMinute: with the fleet down for 150
// intervals of 1 s, Run logs three lines (at 0 s, 60 s, 120 s), the later
// ones counting the failures in between; every failure is counted.
func TestRun_FleetFailuresLoggedOncePerMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs lockedLog
		tb := &tables{}
		tb.p.Store(loadTable(t, testLimits))
		s := New(tb, Options{Interval: time.Second, Fleet: downFleet{}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		stop := startRun(t, s)
		time.Sleep(150*time.Second + time.Millisecond)
		synctest.Wait()
		stop()
		lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
		if len(lines) != 3 || !strings.Contains(lines[0], "connection refused") || !strings.Contains(lines[1], "failures_not_logged=59") {
			t.Fatalf("%d lines for 151 failed exchanges in 150 s, want 3, the second counting 59 not logged:\n%s", len(lines), logs.String())
		}
		if n := s.Stats().FleetErrors; n != 151 {
			t.Errorf("%d fleet errors counted, want 151", n)
		}
	})
}

// panickyTables panics in Current while panics > 0, counting down, as a
// bug in request code would; then it gives the table.
type panickyTables struct {
	tables
	panics atomic.Int32
}

func (p *panickyTables) Current() *config.Table {
	if p.panics.Add(-1) >= 0 {
		panic("injected")
	}
	return p.tables.Current()
}

// TestRun_PanicRecovered: Tick panics for 90 intervals; Run recovers each
// (the process lives), counts them, logs two lines (at 1 s and 61 s, the
// second counting the 59 not logged), and divides again once the panics
// stop.
func TestRun_PanicRecovered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs lockedLog
		tb := &panickyTables{}
		tb.p.Store(loadTable(t, testLimits))
		s := New(tb, Options{Interval: time.Second, Reserve: -1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		st, _ := s.Open()
		mustReport(t, st, time.Now(), use("tenant", "x", 1, 0))
		st.Pending()
		tb.panics.Store(90)
		stop := startRun(t, s)
		time.Sleep(90*time.Second + time.Millisecond)
		synctest.Wait()
		if n := s.Stats().Panics; n != 90 {
			t.Errorf("%d panics counted, want 90", n)
		}
		mustReport(t, st, time.Now(), use("tenant", "x", 5000, 0))
		time.Sleep(time.Second)
		synctest.Wait()
		if as := st.Pending(); len(as) != 1 || as[0].Requests != 1000 {
			t.Errorf("after the panics stopped: %+v, want the whole limit of 1000", as)
		}
		stop()
		lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
		if len(lines) != 2 || !strings.Contains(lines[0], "level=ERROR") || !strings.Contains(lines[0], "injected") ||
			!strings.Contains(lines[0], "stack=") || !strings.Contains(lines[1], "panics_not_logged=59") {
			t.Errorf("%d lines for 90 panics, want 2 with the panic and its stack, the second counting 59 not logged:\n%.2000s", len(lines), logs.String())
		}
	})
}
