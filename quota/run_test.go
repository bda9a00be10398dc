package quota

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// downFleet fails every exchange, as a fleet whose Redis is down.
type downFleet struct{}

func (downFleet) Exchange(context.Context, time.Time, map[string]Claim, []string) (Remote, error) {
	return Remote{}, errors.New("redis: dial tcp 127.0.0.1:6379: connection refused")
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

// TestRun_FleetFailuresLoggedOncePerMinute: with the fleet down for 150
// intervals of 1 s, Run logs three lines (at 0 s, 60 s, 120 s), the later
// ones counting the failures in between; every failure is counted.
func TestRun_FleetFailuresLoggedOncePerMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs lockedLog
		tb := &tables{}
		tb.p.Store(loadTable(t, testLimits))
		s := New(tb, Options{Interval: time.Second, Fleet: downFleet{}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- s.Run(ctx) }()
		time.Sleep(150*time.Second + time.Millisecond)
		synctest.Wait()
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
		if len(lines) != 3 || !strings.Contains(lines[0], "connection refused") || !strings.Contains(lines[1], "failures_not_logged=59") {
			t.Fatalf("%d lines for 151 failed exchanges in 150 s, want 3, the second counting 59 not logged:\n%s", len(lines), logs.String())
		}
		if n := s.Stats().FleetErrors; n != 151 {
			t.Errorf("%d fleet errors counted, want 151", n)
		}
	})
}
