package memcache

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/logbuf"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memcache/memcachetest"
)

// TestConnect_NotUpYet: a memcached that is not up when the store
// connects is no error: the store is unhealthy, its calls fail (the
// failure mode answers), the wait is logged, and once memcached is up Run
// finds it: Connected closes, the store is healthy and counts. Before,
// serve's ping failed the start.
func TestConnect_NotUpYet(t *testing.T) {
	srv := memcachetest.Start(t)
	srv.Kill()
	var logs logbuf.Buffer
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

// TestConnect_NotResolvingYet: a server's name, or an SRV name, that does
// not resolve yet at startup (a headless Service with no ready pods) is
// no error, as a server not up yet: the store has no servers, is
// unhealthy and its calls fail, and Run looks the name up again until it
// resolves, then connects. Before, New failed, and serve with it. A
// malformed name still fails New.
func TestConnect_NotResolvingYet(t *testing.T) {
	r, err := store.NewFixedWindow(2, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, srvName := range []bool{false, true} {
		t.Run(map[bool]string{false: "servers", true: "srv"}[srvName], func(t *testing.T) {
			srv := memcachetest.Start(t)
			dns := memcachetest.StartDNS(t)
			const host, name = "later.sluice.test", "_memcache._tcp.later.sluice.test"
			addr := hostPort(host, srv)
			opt := Options{Servers: []string{addr}, Resolver: dns.Resolver(), Timeout: suiteTimeout, ConnectRetryMax: 200 * time.Millisecond}
			if srvName {
				opt.Servers, opt.SRV = nil, name
			}
			var logs logbuf.Buffer
			opt.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			st := open(t, opt)
			if err := st.Connect(); err != nil {
				t.Fatalf("Connect with a name not resolving yet: %v, want no error", err)
			}
			if st.Healthy() {
				t.Error("Healthy before the name resolves")
			}
			out := make([]store.Decision, 1)
			hit := []store.Hit{{Key: "k", Rule: r, Cost: 1, Veto: true}}
			if err := st.Take(context.Background(), time.Now().UnixNano(), hit, out); err == nil {
				t.Fatal("Take before the name resolves: no error")
			}
			if l := logs.String(); !strings.Contains(l, "memcached not reachable yet") || !strings.Contains(l, "later.sluice.test") {
				t.Errorf("log before the name resolves:\n%s", l)
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
			select {
			case <-st.Connected():
				t.Fatal("Connected before the name resolves")
			case <-time.After(300 * time.Millisecond):
			}
			dns.SetA(host, "127.0.0.1")
			if srvName {
				dns.SetSRV(name, addr)
			}
			select {
			case <-st.Connected():
			case <-time.After(time.Minute):
				t.Fatalf("not connected a minute after the name resolved; log:\n%s", logs.String())
			}
			if got := st.Stats().Servers; !st.Healthy() || len(got) != 1 || got[0] != addr {
				t.Errorf("once connected: healthy %v, servers %v; want healthy on [%s]", st.Healthy(), got, addr)
			}
			if err := st.Take(context.Background(), time.Now().UnixNano(), hit, out); err != nil || !out[0].Allowed {
				t.Errorf("Take once connected: %+v, %v; want allowed", out[0], err)
			}
		})
	}
	t.Run("system resolver", func(t *testing.T) {
		// .invalid never resolves (RFC 6761).
		st := open(t, Options{Servers: []string{"nonexistent.invalid:11211"}})
		if err := st.Connect(); err != nil || st.Healthy() {
			t.Errorf("Connect to nonexistent.invalid:11211: %v, healthy %v; want no error, not healthy", err, st.Healthy())
		}
	})
	for _, opt := range []Options{
		{Servers: []string{"nonexistent.invalid"}},
		{Servers: []string{"127.0.0.1:11211", "a:1:2"}},
		{SRV: "later.sluice.test"},
		{},
	} {
		if _, err := New(context.Background(), opt); err == nil {
			t.Errorf("New(%+v): no error, want one (malformed)", opt)
		}
	}
}
