package redis

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/logbuf"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestNew_NotUpYet: a Redis (single, Sentinel, Cluster) that is not up
// when the store is opened is no error. The store starts unhealthy,
// fails every Take at once with ErrOpen (the failure mode answers), logs
// the wait, and once Redis is up Run connects: Connected closes, the
// store turns healthy and counts exactly. Before, New failed with
// "connection refused".
func TestNew_NotUpYet(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) (Options, func(), func())
	}{
		{"single", func(t *testing.T) (Options, func(), func()) {
			srv := redistest.Start(t)
			return Options{URL: "redis://" + srv.Addr}, srv.Kill, srv.Restart
		}},
		{"sentinel", func(t *testing.T) (Options, func(), func()) {
			s := redistest.StartSentinel(t)
			return Options{SentinelMaster: s.MasterSet, SentinelAddrs: []string{s.Sentinel.Addr}}, s.Sentinel.Kill, s.Sentinel.Restart
		}},
		{"cluster", func(t *testing.T) (Options, func(), func()) {
			c := redistest.StartCluster(t, 3)
			all := func(f func(*redistest.Server)) func() {
				return func() {
					for _, n := range c.Nodes {
						f(n)
					}
				}
			}
			restart := func() {
				all((*redistest.Server).Restart)()
				// Redis answers before the cluster is up again: calls
				// then get CLUSTERDOWN (answered by the failure mode).
				deadline := time.Now().Add(time.Minute)
				for _, n := range c.Nodes {
					for !strings.Contains(n.CLI("cluster", "info"), "cluster_state:ok") {
						if time.Now().After(deadline) {
							t.Fatal("cluster not ok a minute after its restart")
						}
						time.Sleep(20 * time.Millisecond)
					}
				}
			}
			return Options{ClusterAddrs: c.Seeds()}, all((*redistest.Server).Kill), restart
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opt, kill, restart := tc.start(t)
			kill()
			var logs logbuf.Buffer
			opt.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			opt.FailureMode = "deny"
			s := open(t, opt)
			if s.Healthy() {
				t.Error("Healthy before Redis is up")
			}
			if st := s.Status(); st.State != StateDown || !strings.Contains(st.LastError, "connect") {
				t.Errorf("Status before Redis is up = %+v, want down with the connect error", st)
			}
			r := must(store.NewFixedWindow(2, time.Minute))
			out := make([]store.Decision, 1)
			hit := []store.Hit{{Key: "k", Rule: r, Cost: 1, Veto: true}}
			if err := s.Take(context.Background(), time.Now().UnixNano(), hit, out); !errors.Is(err, ErrOpen) {
				t.Fatalf("Take before Redis is up: %v, want ErrOpen", err)
			}
			if err := s.Reset(context.Background(), time.Now().UnixNano(), hit); err == nil {
				t.Error("Reset before Redis is up: no error")
			}
			if !strings.Contains(logs.String(), `msg="redis not reachable yet: answering by the failure mode and retrying"`) ||
				!strings.Contains(logs.String(), "failure_mode=deny") {
				t.Errorf("log before Redis is up:\n%s", logs.String())
			}
			ctx, cancel := context.WithCancel(context.Background())
			ran := make(chan error, 1)
			go func() { ran <- s.Run(ctx) }()
			defer func() {
				cancel()
				if err := <-ran; err != nil {
					t.Errorf("Run: %v", err)
				}
			}()
			restart()
			select {
			case <-s.Connected():
			case <-time.After(time.Minute):
				t.Fatalf("not connected a minute after Redis started; log:\n%s", logs.String())
			}
			if !s.Healthy() {
				t.Error("not Healthy once connected")
			}
			if got := takeN(t, s, "k", r, time.Now().UnixNano(), 3); got != 2 {
				t.Errorf("%d allowed of 3 once connected, want 2", got)
			}
			if !strings.Contains(logs.String(), `msg="redis reachable: connected"`) {
				t.Errorf("log once connected:\n%s", logs.String())
			}
			if st := s.Stats(); st.Opens != 1 || st.Closes != 1 {
				t.Errorf("transitions %d down, %d up; want 1 and 1", st.Opens, st.Closes)
			}
		})
	}
}

// TestRun_ConnectMaxWait: with ConnectMaxWait, Run gives up on a Redis
// that never comes up, naming the setting.
func TestRun_ConnectMaxWait(t *testing.T) {
	srv := redistest.Start(t)
	srv.Kill()
	s := open(t, Options{URL: "redis://" + srv.Addr, ConnectRetry: time.Millisecond, ConnectMaxWait: time.Millisecond})
	err := s.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "not reachable after 1ms") {
		t.Fatalf("Run = %v, want the wait's end", err)
	}
	select {
	case <-s.Connected():
		t.Error("Connected closed without Redis")
	default:
	}
}

// TestNew_FailsFast: settings that cannot work, and a Redis that refuses
// them, fail New at once, not after retries.
func TestNew_FailsFast(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "s3cret")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		opt  Options
		want string
	}{
		{Options{URL: "redis://" + srv.Addr}, "NOAUTH"},
		{Options{URL: "redis://:wrong@" + srv.Addr}, "WRONGPASS"},
		{Options{URL: "redis://" + srv.Addr, Username: "nobody", Password: "x"}, "WRONGPASS"},
		{Options{URL: "redis://" + srv.Addr + "/notadb"}, "redis: url"},
	} {
		s, err := New(ctx, tc.opt)
		if err == nil {
			s.Close()
			t.Errorf("New(%+v): no error", tc.opt)
		} else if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want %s", tc.opt, err, tc.want)
		}
	}
}

// TestNextRetry: the waits between attempts double from ConnectRetry up
// to ConnectRetryMax.
func TestNextRetry(t *testing.T) {
	o := Options{}.withDefaults()
	var got []time.Duration
	for w := o.ConnectRetry; len(got) < 9; w = nextRetry(w, o.ConnectRetryMax) {
		got = append(got, w)
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond,
		1600 * time.Millisecond, 3200 * time.Millisecond, 5 * time.Second, 5 * time.Second, 5 * time.Second}
	if !slices.Equal(got, want) {
		t.Errorf("waits %v, want %v", got, want)
	}
}
