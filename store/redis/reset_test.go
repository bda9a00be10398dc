package redis

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
	"github.com/sluicehq/sluice/store/storetest"
)

// peekRules are a rule of every key form the store writes: narrow and
// wide fixed windows, a calendar window, sliding windows (calendar too)
// and a token bucket.
func peekRules(t *testing.T) map[string]*store.Rule {
	month := storetest.Calendar(t, store.CalendarMonth, 1, "UTC")
	return map[string]*store.Rule{
		"fixed":            storetest.Window(t, 3, time.Minute),
		"wide":             storetest.Window(t, 10_000_000_000, time.Hour),
		"calendar":         storetest.CalendarWindow(t, 3, month),
		"sliding":          storetest.Sliding(t, 3, time.Minute),
		"calendar-sliding": storetest.CalendarSliding(t, 3, month),
		// (refilled in 3 minutes, so its key, whose TTL runs on Redis's
		// clock, outlives a slow run: at 1/s it expired after ~4 s)
		"bucket": storetest.Bucket(t, 1, time.Minute, 3),
	}
}

var setStat = regexp.MustCompile(`cmdstat_set:calls=(\d+)`)

// setCalls returns how many SETs the server has run.
func setCalls(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	m := setStat.FindStringSubmatch(srv.CLI("INFO", "commandstats"))
	if m == nil {
		return 0
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPeek_NeverWrites: a hit of cost 0 (what a lookup sends) writes
// nothing to Redis for any key form, alone or in a batch, denied or not,
// with or without the local cache: no SET is sent, the values stay, and a
// missing key is not created.
func TestPeek_NeverWrites(t *testing.T) {
	srv := redistest.Start(t)
	for _, noCache := range []bool{false, true} {
		s := open(t, Options{URL: "redis://" + srv.Addr, NoLocalCache: noCache})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		now := storetest.T0
		var peeks []store.Hit
		for name, r := range peekRules(t) {
			out := make([]store.Decision, 1)
			// Used up: the peeks are denied (and cached as over).
			if err := s.Take(ctx, now, []store.Hit{{Key: name, Rule: r, Cost: 3, Veto: true}}, out); err != nil {
				t.Fatal(err)
			}
			peeks = append(peeks, store.Hit{Key: name, Rule: r, Veto: true}, store.Hit{Key: name + "/missing", Rule: r})
		}
		before := setCalls(t, srv)
		if before == 0 {
			t.Fatal("no SET counted after the takes: the statistic is misread")
		}
		values := map[string]string{}
		for _, h := range peeks {
			values[h.Key] = srv.CLI("GET", s.opt.KeyPrefix+h.Key)
		}
		out := make([]store.Decision, len(peeks))
		for i := range 5 {
			at := now + int64(i)*int64(100*time.Millisecond)
			if err := s.Take(ctx, at, peeks, out); err != nil {
				t.Fatal(err)
			}
			for j := range peeks {
				if err := s.Take(ctx, at, peeks[j:j+1], out[:1]); err != nil {
					t.Fatal(err)
				}
				peeks[j].Veto = !peeks[j].Veto
				if err := s.Take(ctx, at, peeks[j:j+1], out[:1]); err != nil {
					t.Fatal(err)
				}
			}
		}
		if after := setCalls(t, srv); after != before {
			t.Errorf("local cache %v: peeks sent %d SETs, want none", !noCache, after-before)
		}
		for _, h := range peeks {
			if v := srv.CLI("GET", s.opt.KeyPrefix+h.Key); v != values[h.Key] {
				t.Errorf("local cache %v: %s holds %q after the peeks, want %q", !noCache, h.Key, v, values[h.Key])
			}
		}
	}
}

// TestReset_DeletesEveryKeyForm: Reset deletes the Redis key of every
// key form (and only those), with the prefix.
func TestReset_DeletesEveryKeyForm(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, Options{URL: "redis://" + srv.Addr})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var hits []store.Hit
	for name, r := range peekRules(t) {
		for _, k := range []string{name, name + "/kept"} {
			if err := s.Take(ctx, storetest.T0, []store.Hit{{Key: k, Rule: r, Cost: 1, Veto: true}}, make([]store.Decision, 1)); err != nil {
				t.Fatal(err)
			}
		}
		hits = append(hits, store.Hit{Key: name, Rule: r})
	}
	if err := s.Reset(ctx, storetest.T0, hits); err != nil {
		t.Fatal(err)
	}
	for _, h := range hits {
		if n := srv.CLI("EXISTS", s.opt.KeyPrefix+h.Key); n != "0" {
			t.Errorf("%s: EXISTS = %s after the reset, want 0", h.Key, n)
		}
		if n := srv.CLI("EXISTS", s.opt.KeyPrefix+h.Key+"/kept"); n != "1" {
			t.Errorf("%s/kept: EXISTS = %s after another key's reset, want 1", h.Key, n)
		}
	}
}

// TestReset_Sentinel: through Sentinel the reset reaches the master (and
// the replica follows), and the next lookup finds every key form fresh.
func TestReset_Sentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Sentinel deployment")
	}
	sn := redistest.StartSentinel(t)
	s := open(t, Options{SentinelAddrs: []string{sn.Sentinel.Addr}, SentinelMaster: sn.MasterSet, Timeout: 5 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var hits []store.Hit
	for name, r := range peekRules(t) {
		if err := s.Take(ctx, storetest.T0, []store.Hit{{Key: name, Rule: r, Cost: 3, Veto: true}}, make([]store.Decision, 1)); err != nil {
			t.Fatal(err)
		}
		hits = append(hits, store.Hit{Key: name, Rule: r})
	}
	if err := s.Reset(ctx, storetest.T0, hits); err != nil {
		t.Fatal(err)
	}
	out := make([]store.Decision, len(hits))
	if err := s.Take(ctx, storetest.T0, hits, out); err != nil {
		t.Fatal(err)
	}
	for i, h := range hits {
		if want := store.View(store.State{}, h.Rule, storetest.T0); out[i] != want {
			t.Errorf("%s after the reset: %+v, want fresh %+v", h.Key, out[i], want)
		}
	}
	waitFor(t, 5*time.Second, "the replica follows the reset", func() bool {
		for _, h := range hits {
			if n, _ := sn.Replica.Run("exists", s.opt.KeyPrefix+h.Key); n != "0" {
				return false
			}
		}
		return true
	})
}
