package memcache

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/internal/testcert"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memcache/memcachetest"
	"github.com/sluicehq/sluice/store/storetest"
)

func must(r *store.Rule, err error) *store.Rule {
	if err != nil {
		panic(err)
	}
	return r
}

func take(t testing.TB, s *Store, now int64, hits ...store.Hit) []store.Decision {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := make([]store.Decision, len(hits))
	if err := s.Take(ctx, now, hits, out); err != nil {
		t.Fatalf("Take: %v", err)
	}
	return out
}

// rules are one of each kind: an epoch window, a wide window, a calendar
// window, a token bucket, a sliding window.
func rules(t *testing.T) map[string]*store.Rule {
	return map[string]*store.Rule{
		"window":   storetest.Window(t, 10, time.Minute),
		"wide":     storetest.Window(t, 1<<40, time.Hour),
		"calendar": storetest.CalendarWindow(t, 10, storetest.Calendar(t, store.CalendarMonth, 1, "UTC")),
		"bucket":   storetest.Bucket(t, 1, time.Second, 10),
		"sliding":  storetest.Sliding(t, 10, time.Minute),
	}
}

// casIDs reads the raw items of keys: their CAS ids change on every write.
func casIDs(t *testing.T, c *memcache.Client, keys []string) map[string]uint64 {
	t.Helper()
	items, err := c.GetMulti(keys)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]uint64{}
	for k, it := range items {
		ids[k] = it.CasID
	}
	return ids
}

// TestPeek_ChangesNothing: a take of cost 0 (Envoy Gateway's peek before
// a charge) writes nothing, on a fresh key and on a counted one, alone or
// in a denied batch: the item's CAS id stays. (A denied take of a fixed
// window is counted and given back, INCR then DECR: its count stays, its
// CAS id does not.)
func TestPeek_ChangesNothing(t *testing.T) {
	srv := memcachetest.Start(t)
	s := open(t, Options{Servers: []string{srv.Addr}, Timeout: suiteTimeout})
	raw := memcache.New(srv.Addr)
	now := storetest.T0
	for name, r := range rules(t) {
		t.Run(name, func(t *testing.T) {
			h := store.Hit{Key: t.Name(), Rule: r, Veto: true}
			var keys []string
			key := func() string {
				if r.Algorithm() == store.FixedWindow {
					return s.key(h.Key, r.WindowEnd(now))
				}
				return s.key(h.Key, 0)
			}
			keys = append(keys, key())
			take(t, s, now, h) // fresh: must not create the key
			if ids := casIDs(t, raw, keys); len(ids) != 0 {
				t.Fatalf("a peek on a fresh key created it: %v", ids)
			}
			h.Cost = 4
			take(t, s, now, h)
			before := casIDs(t, raw, keys)
			if len(before) != 1 {
				t.Fatalf("a take of 4 left no item: %v", before)
			}
			h.Cost = 0
			for i := range 3 {
				if d := take(t, s, now, h)[0]; !d.Allowed || d.Remaining != r.Capacity()-4 {
					t.Fatalf("peek %d: %+v, want allowed with %d remaining", i, d, r.Capacity()-4)
				}
			}
			// Later, when a bucket has refilled some or a sliding window's
			// buckets have moved on, a peek still writes nothing.
			take(t, s, now+int64(2*time.Second), h)
			// In a batch denied by another hit.
			other := store.Hit{Key: t.Name() + "/other", Rule: r, Cost: r.Capacity() + 1, Veto: true}
			if d := take(t, s, now, h, other); !d[0].Allowed || d[1].Allowed {
				t.Fatalf("a peek with a take that never fits: %+v, want allowed then denied", d)
			}
			if after := casIDs(t, raw, keys); after[keys[0]] != before[keys[0]] {
				t.Fatalf("peeks changed the item: CAS id %d, was %d", after[keys[0]], before[keys[0]])
			}
			// A denied take, then a peek in its batch, leave the count.
			h.Cost = r.Capacity() - 3
			if d := take(t, s, now, h, store.Hit{Key: h.Key, Rule: r, Veto: true}); d[0].Allowed || !d[1].Allowed || d[1].Remaining != r.Capacity()-4 {
				t.Fatalf("a take of %d then a peek: %+v, want denied, then allowed with %d remaining", h.Cost, d, r.Capacity()-4)
			}
			h.Cost = 0
			if d := take(t, s, now, h)[0]; d.Remaining != r.Capacity()-4 {
				t.Fatalf("after a denied take: %+v, want %d remaining", d, r.Capacity()-4)
			}
		})
	}
}

// TestReset: Reset empties the hits' counters at now, for every kind of
// rule, and leaves other keys alone.
func TestReset(t *testing.T) {
	srv := memcachetest.Start(t)
	s := open(t, Options{Servers: []string{srv.Addr}, Timeout: suiteTimeout})
	now := storetest.T0 + int64(30*time.Second)
	for name, r := range rules(t) {
		t.Run(name, func(t *testing.T) {
			a := store.Hit{Key: t.Name() + "/a", Rule: r, Cost: 7, Veto: true}
			b := store.Hit{Key: t.Name() + "/b", Rule: r, Cost: 7, Veto: true}
			take(t, s, now, a, b)
			if err := s.Reset(context.Background(), now, []store.Hit{a}); err != nil {
				t.Fatal(err)
			}
			a.Cost, b.Cost = 0, 0
			got := take(t, s, now, a, b)
			if got[0].Remaining != r.Capacity() {
				t.Errorf("reset key: %d remaining, want %d", got[0].Remaining, r.Capacity())
			}
			if got[1].Remaining != r.Capacity()-7 {
				t.Errorf("other key: %d remaining, want %d", got[1].Remaining, r.Capacity()-7)
			}
			// Resetting a key with no counter is no error.
			if err := s.Reset(context.Background(), now, []store.Hit{a}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestKeys_LongAndIllegal: keys memcached refuses (too long, spaces,
// control characters) are hashed and still count apart.
func TestKeys_LongAndIllegal(t *testing.T) {
	srv := memcachetest.Start(t)
	s := open(t, Options{Servers: []string{srv.Addr}, KeyPrefix: "p:", Timeout: suiteTimeout})
	r := storetest.Window(t, 2, time.Minute)
	long := strings.Repeat("x", 300)
	for _, k := range []string{long, long + "y", "with space", "with\nnewline", "#hash-like", "plain"} {
		for i, want := range []bool{true, true, false} {
			if d := take(t, s, storetest.T0, store.Hit{Key: k, Rule: r, Cost: 1, Veto: true})[0]; d.Allowed != want {
				t.Errorf("key %.20q take %d: allowed %v, want %v", k, i, d.Allowed, want)
			}
		}
		if mk := s.key(k, 1); len(mk) > maxKeyLen || !legal(strings.TrimPrefix(mk, "p:")) && !strings.HasPrefix(mk, "p:#") {
			t.Errorf("key %.20q maps to %q", k, mk)
		}
	}
	if got := s.key("plain", 0); got != "p:plain" {
		t.Errorf("a legal key maps to %q, want p:plain", got)
	}
	for _, p := range []string{"with space", "#x", strings.Repeat("p", 200)} {
		if _, err := New(context.Background(), Options{Servers: []string{srv.Addr}, KeyPrefix: p}); err == nil {
			t.Errorf("key prefix %.20q: accepted", p)
		}
	}
}

// TestBatch_RollbackAcrossAlgorithms: a batch whose last hit denies gives
// back what its other hits took, INCR windows and CAS states alike.
func TestBatch_RollbackAcrossAlgorithms(t *testing.T) {
	srv := memcachetest.Start(t)
	s := open(t, Options{Servers: []string{srv.Addr}, Timeout: suiteTimeout})
	rs := rules(t)
	var hits []store.Hit
	for _, name := range []string{"window", "wide", "calendar", "bucket", "sliding"} {
		hits = append(hits, store.Hit{Key: name, Rule: rs[name], Cost: 3, Veto: true})
	}
	hits = append(hits, store.Hit{Key: "deny", Rule: storetest.Window(t, 1, time.Minute), Cost: 2, Veto: true})
	got := take(t, s, storetest.T0, hits...)
	if got[len(got)-1].Allowed {
		t.Fatal("the last hit was allowed")
	}
	for i := range hits[:len(hits)-1] {
		if !got[i].Allowed || got[i].Remaining != hits[i].Rule.Capacity() {
			t.Errorf("%s: %+v, want allowed with all %d remaining", hits[i].Key, got[i], hits[i].Rule.Capacity())
		}
		hits[i].Cost = 0
	}
	for i, d := range take(t, s, storetest.T0, hits[:len(hits)-1]...) {
		if d.Remaining != hits[i].Rule.Capacity() {
			t.Errorf("%s after the batch: %d remaining, want %d", hits[i].Key, d.Remaining, hits[i].Rule.Capacity())
		}
	}
}

// TestStoreSuite_ThreeServers: the suite on keys spread over three
// servers, each of which ends up holding some.
func TestStoreSuite_ThreeServers(t *testing.T) {
	var addrs []string
	var raws []*memcache.Client
	for range 3 {
		srv := memcachetest.Start(t)
		addrs = append(addrs, srv.Addr)
		raws = append(raws, memcache.New(srv.Addr))
	}
	storetest.RunOptions(t, func(t *testing.T) store.Store {
		return open(t, Options{Servers: addrs, Timeout: suiteTimeout, CASAttempts: 1000})
	}, suiteSizes)
	s := open(t, Options{Servers: addrs, Timeout: suiteTimeout})
	r := storetest.Window(t, 5, time.Minute)
	var keys []string
	for i := range 30 {
		h := store.Hit{Key: fmt.Sprintf("spread/%d", i), Rule: r, Cost: 1, Veto: true}
		take(t, s, storetest.T0, h)
		keys = append(keys, s.key(h.Key, r.WindowEnd(storetest.T0)))
	}
	total := 0
	for i, c := range raws {
		ids := casIDs(t, c, keys)
		if len(ids) == 0 {
			t.Errorf("server %d holds none of 30 keys: keys not spread", i)
		}
		total += len(ids)
	}
	if total != len(keys) {
		t.Errorf("the servers hold %d of the %d keys, want each on one", total, len(keys))
	}
}

// TestSelector_MovesFewKeys: adding a fourth server moves about a quarter
// of the keys, all to the new server; the order servers are listed in
// does not matter.
func TestSelector_MovesFewKeys(t *testing.T) {
	three := []string{"10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"}
	var a, b, c selector
	ctx := context.Background()
	if err := a.set(ctx, nil, three); err != nil {
		t.Fatal(err)
	}
	if err := b.set(ctx, nil, append([]string{"10.0.0.4:11211"}, three...)); err != nil {
		t.Fatal(err)
	}
	if err := c.set(ctx, nil, []string{three[2], three[0], three[1]}); err != nil {
		t.Fatal(err)
	}
	const n = 20000
	moved, per := 0, map[string]int{}
	for i := range n {
		k := fmt.Sprintf("domain/key_%d/fixed_window/60", i)
		x, _ := a.PickServer(k)
		y, _ := b.PickServer(k)
		z, _ := c.PickServer(k)
		if x.String() != z.String() {
			t.Fatalf("key %q: %v, or %v with the servers in another order", k, x, z)
		}
		per[x.String()]++
		if x.String() != y.String() {
			moved++
			if y.String() != "10.0.0.4:11211" {
				t.Fatalf("key %q moved from %v to %v, not to the new server", k, x, y)
			}
		}
	}
	if moved < n/5 || moved > n*3/10 {
		t.Errorf("%d of %d keys moved, want about a quarter", moved, n)
	}
	for s, k := range per {
		if k < n/4 || k > n*5/12 {
			t.Errorf("server %s holds %d of %d keys, want about a third", s, k, n)
		}
	}
}

// TestSelector_Modulo: with modulo every key goes to the server that
// gomemcache's ServerList, envoyproxy/ratelimit's client, picks for the
// same list in the same order (src/memcached/cache_impl.go,
// newMemcacheFromSettings: memcache.New(MEMCACHE_HOST_PORT...)).
func TestSelector_Modulo(t *testing.T) {
	names := []string{"10.0.0.3:11211", "10.0.0.1:11211", "10.0.0.2:11211"}
	sel := selector{modulo: true}
	if err := sel.set(context.Background(), nil, names); err != nil {
		t.Fatal(err)
	}
	var ref memcache.ServerList
	if err := ref.SetServers(names...); err != nil {
		t.Fatal(err)
	}
	for i := range 5000 {
		k := fmt.Sprintf("rl:api_user_u%d_1795930020", i)
		got, _ := sel.PickServer(k)
		want, _ := ref.PickServer(k)
		if got.String() != want.String() {
			t.Fatalf("key %q: %v, the reference's client picks %v", k, got, want)
		}
	}
}

// twoOnSRV starts two memcached, m1 and m2, named mc1 and mc2 (their
// host:port), and a DNS server whose SRV name targets mc1.
func twoOnSRV(t *testing.T, name string) (m1, m2 *memcachetest.Server, mc1, mc2 string, dns *memcachetest.DNS) {
	m1, m2 = memcachetest.Start(t), memcachetest.Start(t)
	dns = memcachetest.StartDNS(t)
	mc1, mc2 = hostPort("mc1.sluice.test", m1), hostPort("mc2.sluice.test", m2)
	dns.SetA("mc1.sluice.test", "127.0.0.1")
	dns.SetA("mc2.sluice.test", "127.0.0.1")
	dns.SetSRV(name, mc1)
	return m1, m2, mc1, mc2, dns
}

// TestSRV: the servers come from an SRV name served by a DNS server on
// loopback; a refresh follows a change of its targets, and a failed
// lookup keeps the servers.
func TestSRV(t *testing.T) {
	const name = "_memcache._tcp.sluice.test"
	m1, _, mc1, mc2, dns := twoOnSRV(t, name)
	s := open(t, Options{SRV: name, Resolver: dns.Resolver(), SRVRefresh: time.Hour, Timeout: suiteTimeout})
	if got := s.Stats().Servers; len(got) != 1 || got[0] != mc1 {
		t.Fatalf("servers %v, want [%s]", got, mc1)
	}
	r := storetest.Window(t, 5, time.Minute)
	h := store.Hit{Key: "k", Rule: r, Cost: 2, Veto: true}
	take(t, s, storetest.T0, h)
	m1.Kill() // from now on only m2 can answer

	dns.SetSRV(name, mc2)
	s.refresh(context.Background())
	if got := s.Stats().Servers; len(got) != 1 || got[0] != mc2 {
		t.Fatalf("after the refresh: servers %v, want [%s]", got, mc2)
	}
	if d := take(t, s, storetest.T0, h)[0]; d.Remaining != 3 {
		t.Errorf("on the new server: %+v, want 3 remaining (a fresh count)", d)
	}
	dns.SetSRV(name)
	s.refresh(context.Background())
	if got := s.Stats().Servers; len(got) != 1 || got[0] != mc2 {
		t.Fatalf("after a failed lookup: servers %v, want [%s] kept", got, mc2)
	}
	// No targets yet is no error: not up until it has (TestConnect_NotResolvingYet).
	if st, err := New(context.Background(), Options{SRV: name, Resolver: dns.Resolver()}); err != nil {
		t.Errorf("New with an SRV name that has no targets yet: %v, want no error", err)
	} else if err := st.Connect(); err != nil || st.Healthy() {
		t.Errorf("Connect with an SRV name that has no targets yet: %v, healthy %v; want no error, not healthy", err, st.Healthy())
	}
	if _, err := New(context.Background(), Options{SRV: "memcache.sluice.test"}); err == nil {
		t.Error("New with a malformed SRV name: no error")
	}
}

// waitConns waits until srv counts want client connections.
func waitConns(t *testing.T, srv *memcachetest.Server, want int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		n := srv.Conns()
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("memcached %s: %d connections after 10 s, want %d", srv.Addr, n, want)
		}
	}
}

// TestSRV_ClosesIdleConnsOfDroppedServers: once an SRV refresh drops a
// server, no connection to it stays open, the idle ones (closed by that
// refresh) nor one a call held meanwhile (closed by the next refresh),
// while the servers in use keep serving.
func TestSRV_ClosesIdleConnsOfDroppedServers(t *testing.T) {
	const name = "_memcache._tcp.conns.sluice.test"
	m1, m2, mc1, mc2, dns := twoOnSRV(t, name)
	s := open(t, Options{SRV: name, Resolver: dns.Resolver(), SRVRefresh: time.Hour, Timeout: suiteTimeout})
	r := storetest.Window(t, 1000, time.Minute)

	// Idle connections: a few calls at once leave a few behind.
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() { take(t, s, storetest.T0, store.Hit{Key: fmt.Sprint("k", i), Rule: r, Cost: 1, Veto: true}) })
	}
	wg.Wait()
	if n := m1.Conns(); n == 0 {
		t.Fatal("no connection to memcached after four calls")
	}
	dns.SetSRV(name, mc1, mc2)
	s.refresh(context.Background()) // a server added: none dropped
	if n := m1.Conns(); n == 0 {
		t.Fatal("a refresh that only added a server closed the connections to the other")
	}
	dns.SetSRV(name, mc2)
	s.refresh(context.Background())
	waitConns(t, m1, 0)
	take(t, s, storetest.T0, store.Hit{Key: "k", Rule: r, Cost: 1, Veto: true})
	waitConns(t, m2, 1)

	// A call in flight to the dropped server when the servers change:
	// its connection goes back to the idle ones after the refresh.
	dns.SetSRV(name, mc1)
	s.refresh(context.Background())
	waitConns(t, m2, 0)
	on1 := func(addr string) bool { return addr != m1.Addr }
	m1.Pause()
	defer m1.Resume()
	got := make(chan error, 1)
	go func() { _, err := s.c.Get("k"); got <- err }()
	for deadline := time.Now().Add(10 * time.Second); !s.conns.outside(on1); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the call did not connect to memcached in 10 s")
		}
	}
	dns.SetSRV(name, mc2)
	s.refresh(context.Background())
	m1.Resume()
	if err := <-got; err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
		t.Fatalf("the call in flight: %v", err)
	}
	waitConns(t, m1, 1) // back with the idle ones
	s.refresh(context.Background())
	waitConns(t, m1, 0)
}

// TestRun_RefreshesSRV: Run resolves the name again on its own.
func TestRun_RefreshesSRV(t *testing.T) {
	m1, m2 := memcachetest.Start(t), memcachetest.Start(t)
	dns := memcachetest.StartDNS(t)
	const name = "_memcache._tcp.run.sluice.test"
	dns.SetA("mc1.sluice.test", "127.0.0.1")
	dns.SetA("mc2.sluice.test", "127.0.0.1")
	dns.SetSRV(name, hostPort("mc1.sluice.test", m1))
	s := open(t, Options{SRV: name, Resolver: dns.Resolver(), SRVRefresh: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	dns.SetSRV(name, hostPort("mc1.sluice.test", m1), hostPort("mc2.sluice.test", m2))
	for deadline := time.Now().Add(10 * time.Second); len(s.Stats().Servers) != 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("servers %v after 10 s, want both", s.Stats().Servers)
		}
	}
}

// TestHealth: Run's probe marks the store unhealthy while its server
// does not answer, and healthy again once it does; a Take fails then.
func TestHealth(t *testing.T) {
	srv := memcachetest.Start(t)
	s := open(t, Options{Servers: []string{srv.Addr}, Timeout: 100 * time.Millisecond, ProbeInterval: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	waitHealth := func(want bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); s.Healthy() != want; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("Healthy() = %v after 10 s, want %v", !want, want)
			}
		}
	}
	srv.Pause()
	waitHealth(false)
	r := storetest.Window(t, 5, time.Minute)
	out := make([]store.Decision, 1)
	if err := s.Take(context.Background(), storetest.T0, []store.Hit{{Key: "k", Rule: r, Cost: 1, Veto: true}}, out); err == nil {
		t.Error("Take on a paused server: no error")
	}
	srv.Resume()
	waitHealth(true)
}

// TestTake_CancelledContext: a cancelled ctx fails the Take before any
// round trip.
func TestTake_CancelledContext(t *testing.T) {
	srv := memcachetest.Start(t)
	// (The take after must succeed: not within the default 500 ms a busy
	// machine can stall past.)
	s := open(t, Options{Servers: []string{srv.Addr}, Timeout: suiteTimeout})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := storetest.Window(t, 5, time.Minute)
	out := make([]store.Decision, 1)
	if err := s.Take(ctx, storetest.T0, []store.Hit{{Key: "k", Rule: r, Cost: 1, Veto: true}}, out); err == nil {
		t.Fatal("no error")
	}
	if d := take(t, s, storetest.T0, store.Hit{Key: "k", Rule: r, Veto: true})[0]; d.Remaining != 5 {
		t.Errorf("%+v: the cancelled take counted", d)
	}
}

// TestTLS: a memcached that serves TLS and requires a client certificate.
func TestTLS(t *testing.T) {
	ca, dir := testcert.NewCA(t), t.TempDir()
	cert, key := ca.Server(t).WriteFiles(t, dir, "server")
	client := ca.ClientConfig(t)
	srv := memcachetest.StartTLS(t, cert, key, ca.WriteFile(t, dir), client)
	s := open(t, Options{Servers: []string{srv.Addr}, TLS: client, Timeout: suiteTimeout})
	r := storetest.Bucket(t, 1, time.Hour, 2)
	got := 0
	for range 4 {
		if take(t, s, storetest.T0, store.Hit{Key: "k", Rule: r, Cost: 1, Veto: true})[0].Allowed {
			got++
		}
	}
	if got != 2 {
		t.Errorf("%d allowed of 4, want 2", got)
	}
	noCert := client.Clone()
	noCert.Certificates = nil
	plain := open(t, Options{Servers: []string{srv.Addr}, TLS: noCert, Timeout: time.Second})
	if err := plain.Ping(); err == nil {
		t.Error("Ping without a client certificate: no error")
	}
}

// TestConcurrent_CASStress: many goroutines on one token bucket and one
// sliding window, with few CAS attempts and no backoff to spare: no
// over-grant, whatever fails.
func TestConcurrent_CASStress(t *testing.T) {
	srv := memcachetest.Start(t)
	s := open(t, Options{Servers: []string{srv.Addr}, Timeout: suiteTimeout, CASAttempts: 4})
	for _, r := range []*store.Rule{storetest.Bucket(t, 1, time.Hour, 100), storetest.Sliding(t, 100, time.Hour)} {
		var granted, failed atomicInt
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				out := make([]store.Decision, 1)
				for range 40 {
					err := s.Take(context.Background(), storetest.T0, []store.Hit{{Key: r.String(), Rule: r, Cost: 1, Veto: true}}, out)
					switch {
					case err != nil:
						failed.add(1)
					case out[0].Allowed:
						granted.add(1)
					}
				}
			})
		}
		wg.Wait()
		if g := granted.load(); g > 100 {
			t.Errorf("%v: granted %d, over the budget 100", r, g)
		}
		d := take(t, s, storetest.T0, store.Hit{Key: r.String(), Rule: r, Veto: true})[0]
		if d.Remaining != 100-uint64(granted.load()) {
			t.Errorf("%v: %d granted, %d remaining: want them to add up to 100", r, granted.load(), d.Remaining)
		}
		t.Logf("%v: %d granted, %d failed out of CAS attempts, %d CAS retries", r, granted.load(), failed.load(), s.Stats().CASRetries)
	}
}

func hostPort(host string, s *memcachetest.Server) string {
	return net.JoinHostPort(host, strconv.Itoa(s.Port))
}

type atomicInt struct {
	mu sync.Mutex
	n  int
}

func (a *atomicInt) add(d int) { a.mu.Lock(); a.n += d; a.mu.Unlock() }
func (a *atomicInt) load() int { a.mu.Lock(); defer a.mu.Unlock(); return a.n }
