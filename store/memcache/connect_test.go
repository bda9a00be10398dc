package memcache

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memcache/memcachetest"
)

// syncBuffer is a log sink safe for the store's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestConnect_NotUpYet: a memcached that is not up when the store
// connects is no error: the store is unhealthy, its calls fail (the
// failure mode answers), the wait is logged, and once memcached is up Run
// finds it: Connected closes, the store is healthy and counts. Before,
// serve's ping failed the start.
func TestConnect_NotUpYet(t *testing.T) {
	srv := memcachetest.Start(t)
	srv.Kill()
	var logs syncBuffer
	st := open(t, Options{Servers: []string{srv.Addr}, Timeout: suiteTimeout, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err := st.Connect(); err != nil {
		t.Fatalf("Connect to a memcached not up yet: %v, want no error", err)
	}
	if st.Healthy() {
		t.Error("Healthy before memcached is up")
	}
	select {
	case <-st.Connected():
		t.Fatal("Connected closed before memcached is up")
	default:
	}
	r, err := store.NewFixedWindow(2, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]store.Decision, 1)
	hit := []store.Hit{{Key: "k", Rule: r, Cost: 1, Veto: true}}
	if err := st.Take(context.Background(), time.Now().UnixNano(), hit, out); err == nil {
		t.Fatal("Take before memcached is up: no error")
	}
	if !strings.Contains(logs.String(), `msg="memcached not reachable yet: answering by the failure mode and retrying"`) {
		t.Errorf("log before memcached is up:\n%s", logs.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- st.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	srv.Restart()
	select {
	case <-st.Connected():
	case <-time.After(time.Minute):
		t.Fatalf("not connected a minute after memcached started; log:\n%s", logs.String())
	}
	if !st.Healthy() {
		t.Error("not Healthy once connected")
	}
	now := time.Now().UnixNano()
	allowed := 0
	for range 3 {
		if err := st.Take(context.Background(), now, hit, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Allowed {
			allowed++
		}
	}
	if allowed != 2 {
		t.Errorf("%d allowed of 3 once connected, want 2", allowed)
	}
	if !strings.Contains(logs.String(), `msg="memcached reachable: connected"`) {
		t.Errorf("log once connected:\n%s", logs.String())
	}
}
