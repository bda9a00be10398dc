package main

import (
	"context"
	"sync"
	"time"
)

// starvedLag is the soak's own scheduling delay above which a second
// counts as one in which the soak itself was starved of CPU: a request
// timed out then may have been answered in time, unread.
const starvedLag = 250 * time.Millisecond

// lagMonitor measures how late the soak's own goroutines run: a ticker
// every 100 ms, and for each wall-clock second the most a tick was read
// after it was due. Safe for concurrent use.
type lagMonitor struct {
	mu  sync.Mutex
	lag map[int64]time.Duration // by Unix second
}

func (l *lagMonitor) run(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case due := <-t.C:
			now := time.Now()
			l.mu.Lock()
			l.lag[now.Unix()] = max(l.lag[now.Unix()], now.Sub(due))
			l.mu.Unlock()
		}
	}
}

// result returns the lags recorded.
func (l *lagMonitor) result() map[int64]time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lag
}
