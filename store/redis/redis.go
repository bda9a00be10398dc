package redis

import (
	"context"
	"crypto/sha1"
	"crypto/tls"
	"crypto/x509"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/internal/redact"
	"github.com/sluicehq/sluice/store"
)

// script is a Lua script and its SHA-1, for EVALSHA.
type script struct{ src, sha string }

func newScript(src string) script {
	sum := sha1.Sum([]byte(src))
	return script{src: src, sha: hex.EncodeToString(sum[:])}
}

var (
	//go:embed take.lua
	takeLua string
	//go:embed window.lua
	windowLua string

	// takeScript runs any batch; windowScript the usual one faster (see
	// windowBatch).
	takeScript, windowScript = newScript(takeLua), newScript(windowLua)
)

// fieldsPerHit is the number of script arguments describing one hit.
const fieldsPerHit = 8

// ErrOpen is returned (wrapped) while the circuit breaker is open: Redis
// failed repeatedly and is not asked until a probe succeeds.
var ErrOpen = errors.New("redis: circuit breaker open")

// Store is a store.Store on Redis: single, Sentinel or Cluster. Safe for
// concurrent use.
type Store struct {
	cl      atomic.Pointer[rueidis.Client] // nil until Redis first answered (see New)
	co      rueidis.ClientOption           // what connect dials
	up      chan struct{}                  // closed once cl is set
	cluster bool
	addr    string // Redis's (or the sentinels' or seeds') addresses, for logs
	opt     Options
	plain   store.PlainKeys // Plain hits' keys
	breaker *breaker
	cache   *overCache // nil when disabled
	comb    combiner   // window.lua's calls on a single Redis
	incr    combiner   // runIncr's
	// slots holds window.lua's combiners on Cluster, one per hash slot
	// (see combinerFor); nil on a single Redis.
	slots *[16384]atomic.Pointer[combiner]
	kick  chan struct{} // wakes Run to probe now (buffered, 1)

	refundFailures atomic.Uint64
	localAnswers   atomic.Uint64
	failed         atomic.Uint64 // Takes that returned an error
	probes         atomic.Uint64 // Run's pings
	lastLatency    atomic.Int64  // ns of the latest probe Redis answered
	lastTimeout    atomic.Int64  // unix ns of the latest Take that ran out of time
	lastErr        atomic.Pointer[error]

	// probeWait measures how long a probe waited, after it (time.Since;
	// a test stands for a stalled process there). Read by Run only.
	probeWait func(start time.Time) time.Duration
}

// Stats are the store's counters and state, for metrics.
type Stats struct {
	Healthy        bool   // see Healthy
	LocalAnswers   uint64 // requests the local cache answered without Redis
	LocalKeys      int    // keys in the local cache now
	RefundFailures uint64 // refunds that failed (see Take and runIncr)
	Failed         uint64 // Takes that returned an error (answered by the failure mode)
	Opens, Closes  uint64 // transitions of the circuit breaker
	Probes         uint64 // health probes (pings) Run sent
}

// State is Redis's state as the store sees it.
type State string

const (
	// StateUp: Redis answers calls and probes in time.
	StateUp State = "up"
	// StateSlow: Redis answers probes, but a Take ran out of its time
	// within the last probe interval (a slow Redis, a starved process, or
	// callers with short deadlines).
	StateSlow State = "slow"
	// StateDown: the breaker is open; Takes fail at once.
	StateDown State = "down"
)

// Status is a snapshot of the store's view of Redis, for a status page.
type Status struct {
	Addr  string // addresses the store connects to (no credentials)
	State State
	// Breaker is "closed", "open" (failing Takes at once) or "probing"
	// (open, past its cooldown: the next call goes to Redis).
	Breaker string
	// LastLatency is the round trip of the latest health probe (PING)
	// that Redis answered: every ProbeInterval, so a status page reads
	// Redis's latency without a cost per request (request latencies are
	// in the OnCall metric).
	LastLatency time.Duration
	// OutageStart is when the breaker opened; zero while closed.
	OutageStart time.Time
	// LastError is the latest error that counted against Redis (a
	// connection failure, a failed probe), "" if none yet.
	LastError string
}

var _ store.Store = (*Store)(nil)

// New connects to Redis as opt says. It fails on settings that cannot
// work (a bad URL) and on an answer that refuses them (a wrong password, a
// TLS handshake the server refuses). A Redis that cannot be reached yet (a
// refused or silent connection, a name that does not resolve yet) is not
// an error: the store starts with its breaker open, failing every Take at
// once (the caller's failure mode answers), and Run connects, retrying
// with back-off (Options.ConnectRetry); Connected says when it has.
func New(ctx context.Context, opt Options) (*Store, error) {
	opt = opt.withDefaults()
	co, err := clientOption(opt)
	if err != nil {
		return nil, err
	}
	s := &Store{co: co, up: make(chan struct{}), cluster: len(opt.ClusterAddrs) > 0, opt: opt,
		plain: store.PlainKeys{Prefix: opt.KeyPrefix, JitterMax: opt.PlainJitterMax},
		addr:  strings.Join(co.InitAddress, ","), kick: make(chan struct{}, 1), probeWait: time.Since}
	if co.Sentinel.MasterSet != "" {
		s.addr = "sentinel master " + co.Sentinel.MasterSet + " via " + s.addr
	}
	s.breaker = newBreaker(opt.BreakerFailures, opt.BreakerCooldown, opt.BreakerWindow, time.Now,
		func(bool) { s.wake() })
	s.comb.s = s
	s.incr.s, s.incr.incr = s, true
	if s.cluster {
		s.slots = new([16384]atomic.Pointer[combiner])
	}
	if !opt.NoLocalCache {
		// A request's calls end within Timeout, its refunds within
		// Timeout after (on Cluster RefundTimeout, at most Timeout).
		s.cache = newOverCache(2*opt.Timeout, s.cluster)
	}
	err = s.connect(ctx)
	switch {
	case err == nil:
	case !s.transient(err):
		return nil, err
	default:
		// Closed until connect succeeds: no Take goes to Redis, not even
		// as a probe.
		s.breaker.openUntil.Store(math.MaxInt64)
		s.breaker.openedAt.Store(time.Now().UnixNano())
		s.breaker.opens.Add(1)
		s.lastErr.Store(&err)
		if l := opt.Logger; l != nil {
			l.Warn("redis not reachable yet: answering by the failure mode and retrying", "addr", s.addr,
				"cause", err, "retry_in", opt.ConnectRetry, "failure_mode", opt.FailureMode)
		}
	}
	return s, nil
}

// connect dials Redis and pings it; once Redis answers, the store uses
// the new client.
func (s *Store) connect(ctx context.Context) error {
	client, err := rueidis.NewClient(s.co)
	if err != nil {
		if client != nil {
			client.Close()
		}
		return fmt.Errorf("redis: connect: %w", err)
	}
	// The first ping waits as long as a call or a probe may, whichever is
	// longer: a store opened on a busy machine is not a Redis down (with
	// Envoy's 20 ms as Timeout, a PONG that a busy machine delayed past it
	// failed the start).
	if err := s.pingWith(ctx, client, max(s.opt.Timeout, s.opt.ProbeTimeout)); err != nil {
		client.Close()
		return err
	}
	// Closed before Connected says so: a caller that waited for it finds
	// the store healthy.
	s.cl.Store(&client)
	s.breaker.success()
	close(s.up)
	return nil
}

// Connected is closed once Redis first answered (at once when it did in
// New).
func (s *Store) Connected() <-chan struct{} { return s.up }

// client is the store's rueidis client; nil until Redis first answered.
func (s *Store) client() rueidis.Client {
	if p := s.cl.Load(); p != nil {
		return *p
	}
	return nil
}

// errNotConnected fails calls that need Redis before it first answered.
var errNotConnected = errors.New("redis: not connected yet")

// transient reports whether err, from connect, may go away by itself:
// Redis (or its sentinels, or seeds) not up yet, not answering yet, or
// still loading its data. A Redis that answered otherwise (NOAUTH,
// WRONGPASS), a TLS handshake that the server refused or whose
// certificate does not verify is not; nor, with TLS, a connection
// closed once accepted (TLS 1.3 servers refuse a client certificate after
// the handshake, and the client sees a reset).
func (s *Store) transient(err error) bool {
	if e, ok := rueidis.IsRedisErr(err); ok {
		return e.IsLoading() || e.IsClusterDown() || e.IsTryAgain() || strings.HasPrefix(e.Error(), "MASTERDOWN")
	}
	var ope *net.OpError
	if errors.As(err, &ope) && ope.Op == "remote error" {
		return false // a TLS alert the server sent
	}
	var (
		cv *tls.CertificateVerificationError
		ua x509.UnknownAuthorityError
		he x509.HostnameError
		ci x509.CertificateInvalidError
	)
	if errors.As(err, &cv) || errors.As(err, &ua) || errors.As(err, &he) || errors.As(err, &ci) {
		return false // (VerifyConnection's errors come as they are)
	}
	if s.co.TLSConfig != nil && !errors.Is(err, context.DeadlineExceeded) {
		var dns *net.DNSError
		if !(errors.As(err, &ope) && ope.Op == "dial") && !errors.As(err, &dns) {
			return false
		}
	}
	return errors.Is(err, context.DeadlineExceeded) || unreachable(err)
}

// awaitRedis connects to Redis, retrying with back-off: ConnectRetry,
// doubled after each attempt up to ConnectRetryMax. It fails once
// ConnectMaxWait has passed since start (when positive) and returns nil
// when ctx ends.
func (s *Store) awaitRedis(ctx context.Context, start time.Time) error {
	wait := s.opt.ConnectRetry
	for attempt := 2; ; attempt++ {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		err := s.connect(ctx)
		if err == nil {
			if l := s.opt.Logger; l != nil {
				l.Info("redis reachable: connected", "addr", s.addr, "attempts", attempt,
					"waited", time.Since(start).Round(time.Millisecond))
			}
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		if !s.transient(err) {
			return err
		}
		s.lastErr.Store(&err)
		if m := s.opt.ConnectMaxWait; m > 0 && time.Since(start) >= m {
			return fmt.Errorf("redis %s: not reachable after %v (--redis-connect-max-wait): %w", s.addr, m, err)
		}
		wait = nextRetry(wait, s.opt.ConnectRetryMax)
		if l := s.opt.Logger; l != nil {
			l.Warn("redis not reachable yet", "addr", s.addr, "cause", err, "attempts", attempt, "retry_in", wait)
		}
	}
}

// nextRetry is the wait after one of wait: twice as long, at most most.
func nextRetry(wait, most time.Duration) time.Duration { return min(2*wait, most) }

func clientOption(opt Options) (rueidis.ClientOption, error) {
	var co rueidis.ClientOption
	switch {
	case opt.URL != "" && (len(opt.ClusterAddrs) > 0 || len(opt.SentinelAddrs) > 0),
		len(opt.ClusterAddrs) > 0 && len(opt.SentinelAddrs) > 0:
		return co, errors.New("redis: give one of a URL, sentinels or cluster seeds")
	case opt.URL != "":
		var err error
		if co, err = rueidis.ParseURL(opt.URL); err != nil {
			// The parser's error quotes the URL, password and all.
			return co, fmt.Errorf("redis: url: %w", redact.Error(err, opt.URL))
		}
		co.ForceSingleClient = true
	case len(opt.SentinelAddrs) > 0:
		if opt.SentinelMaster == "" {
			return co, errors.New("redis: sentinels need the master's name")
		}
		co.InitAddress = opt.SentinelAddrs
		co.Sentinel = rueidis.SentinelOption{MasterSet: opt.SentinelMaster,
			Username: opt.Username, Password: opt.Password, TLSConfig: opt.TLS}
		if opt.SentinelPassword != "" {
			co.Sentinel.Username, co.Sentinel.Password = "", opt.SentinelPassword
		}
	case len(opt.ClusterAddrs) > 0:
		co.InitAddress = opt.ClusterAddrs
	default:
		return co, errors.New("redis: no address: give a URL, sentinels or cluster seeds")
	}
	if opt.Username != "" {
		co.Username = opt.Username
	}
	if opt.Password != "" {
		co.Password = opt.Password
	}
	if opt.TLS != nil {
		tc := opt.TLS.Clone()
		if tc.ServerName == "" && co.TLSConfig != nil {
			tc.ServerName = co.TLSConfig.ServerName
		}
		if tc.ServerName == "" && len(co.InitAddress) > 0 {
			if host, _, err := net.SplitHostPort(co.InitAddress[0]); err == nil {
				tc.ServerName = host
			}
		}
		co.TLSConfig = tc
	}
	co.DisableCache = true
	// Queue every command on the background pipeline, also when only one
	// is in flight: a call that reaches its deadline then just stops
	// waiting, where the synchronous path would drop the connection and
	// make the next calls wait for a reconnect.
	co.AlwaysPipelining = true
	co.MaxFlushDelay = max(opt.PipelineWindow, 0)
	co.Dialer.Timeout = time.Second
	// rueidis closes a connection that answers nothing for this long
	// (pending calls then fail as broken): not before a Take may wait.
	co.ConnWriteTimeout = max(time.Second, opt.Timeout)
	return co, nil
}

// Close releases the connections.
func (s *Store) Close() error {
	if c := s.client(); c != nil {
		c.Close()
	}
	return nil
}

// Stats returns the store's counters and state.
func (s *Store) Stats() Stats {
	st := Stats{Healthy: s.Healthy(), LocalAnswers: s.localAnswers.Load(), RefundFailures: s.refundFailures.Load(),
		Failed: s.failed.Load(), Opens: s.breaker.opens.Load(), Closes: s.breaker.closes.Load(), Probes: s.probes.Load()}
	if s.cache != nil {
		st.LocalKeys = s.cache.m.Size()
	}
	return st
}

// Status returns a snapshot of the store's view of Redis.
func (s *Store) Status() Status {
	st := Status{Addr: s.addr, State: StateUp, Breaker: "closed", LastLatency: time.Duration(s.lastLatency.Load())}
	if p := s.lastErr.Load(); p != nil {
		st.LastError = (*p).Error()
	}
	now := time.Now()
	if u := s.breaker.openUntil.Load(); u != 0 {
		st.State, st.Breaker = StateDown, "open"
		if now.UnixNano() >= u {
			st.Breaker = "probing"
		}
		st.OutageStart = time.Unix(0, s.breaker.openedAt.Load())
	} else if now.UnixNano()-s.lastTimeout.Load() < int64(s.opt.ProbeInterval) {
		st.State = StateSlow
	}
	return st
}

// Healthy reports whether Redis answered the last call or probe. It is
// false while the circuit breaker is open.
func (s *Store) Healthy() bool { return s.breaker.closed() }

// Run connects first if New could not (see New; it returns an error if
// ConnectMaxWait passes first). Then it probes Redis until ctx ends: every ProbeInterval while healthy, soon
// after a Take ran out of time (at most one probe per BreakerCooldown),
// every BreakerCooldown while the breaker is open, so it closes as soon as
// Redis is back. A probe that gets no PONG within ProbeTimeout is sent
// again at once (a process starved or frozen past the deadline misses it
// with Redis up), and the second failure in a row opens the breaker. Run logs the
// breaker's transitions (see Options.Logger) and drops expired entries of
// the local cache.
func (s *Store) Run(ctx context.Context) error {
	if s.client() == nil {
		if err := s.awaitRedis(ctx, time.Unix(0, s.breaker.openedAt.Load())); err != nil || ctx.Err() != nil {
			return err
		}
	}
	t := time.NewTimer(s.opt.ProbeInterval)
	defer t.Stop()
	var lg transitionLog
	var lastProbe time.Time
	suspect := false // the last probe failed with the breaker closed
	for {
		probe, again := true, false
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-s.kick:
			// Timeouts under load kick often: probes stay a cooldown
			// apart, a transition is reported at once.
			probe = time.Since(lastProbe) >= s.opt.BreakerCooldown
		}
		if probe {
			s.probes.Add(1)
			lastProbe = time.Now()
			err := s.ping(ctx, s.opt.ProbeTimeout)
			waited := s.probeWait(lastProbe)
			switch {
			case err == nil:
				suspect = false
				s.lastLatency.Store(int64(waited))
				s.breaker.success()
			case ctx.Err() != nil, s.breaker.lastOK.Load() >= lastProbe.UnixNano():
				// Stopping; or a call that Redis answered during the
				// probe outweighs it (on Cluster the probe also asks
				// replicas no call uses).
				suspect = false
			case s.breaker.closed() && !suspect:
				// One failed probe may be this process's stall (a
				// starved or frozen process misses its deadline with
				// the PONG unread), not Redis's silence: ask again at
				// once, and open the breaker only if that fails too.
				suspect, again = true, true
			default:
				suspect = false
				err = fmt.Errorf("%w (after %v, the probe before it failed too)", err, waited.Round(time.Millisecond))
				s.lastErr.Store(&err)
				s.breaker.trip()
			}
			if s.cache != nil {
				s.cache.sweep(time.Now().UnixNano())
			}
			// (Drain a kick the probe answered.)
			select {
			case <-s.kick:
			default:
			}
		}
		lg.report(s, time.Now())
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		switch {
		case again:
			t.Reset(0)
		case !probe:
			t.Reset(s.opt.BreakerCooldown - time.Since(lastProbe))
		case s.breaker.closed():
			t.Reset(s.opt.ProbeInterval)
		default:
			t.Reset(s.opt.BreakerCooldown)
		}
	}
}

// wake makes Run probe (and report) now.
func (s *Store) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// transitionLog is Run's memory of what it logged.
type transitionLog struct {
	down       bool      // an outage was seen and not yet seen to end
	logged     bool      // and its WARN line was written
	lastWarn   time.Time // of the latest WARN line
	failedAt   uint64    // s.failed when the outage was seen
	suppressed int       // outages not logged since the latest WARN
}

// report logs a transition of s's breaker since the last report: at most
// one outage per LogInterval gets its lines.
func (lg *transitionLog) report(s *Store, now time.Time) {
	open := !s.breaker.closed()
	l := s.opt.Logger
	switch {
	case open && !lg.down:
		lg.down, lg.failedAt = true, s.failed.Load()
		lg.logged = lg.lastWarn.IsZero() || now.Sub(lg.lastWarn) >= s.opt.LogInterval
		if !lg.logged {
			lg.suppressed++
			return
		}
		lg.lastWarn = now
		if l == nil {
			return
		}
		cause := "unknown"
		if p := s.lastErr.Load(); p != nil {
			cause = (*p).Error()
		}
		attrs := []any{"addr", s.addr, "cause", cause, "failure_mode", s.opt.FailureMode}
		if lg.suppressed > 0 {
			attrs = append(attrs, "outages_not_logged", lg.suppressed)
			lg.suppressed = 0
		}
		l.Warn("redis unreachable: answering by the failure mode", attrs...)
	case !open && lg.down:
		lg.down = false
		if !lg.logged || l == nil {
			return
		}
		start := time.Unix(0, s.breaker.openedAt.Load())
		l.Info("redis reachable again", "addr", s.addr, "outage", now.Sub(start).Round(time.Millisecond),
			"answered_by_failure_mode", s.failed.Load()-lg.failedAt)
	}
}

// ping sends PING to Redis (to every node of a Cluster) and waits at most
// timeout for each PONG.
func (s *Store) ping(ctx context.Context, timeout time.Duration) error {
	return s.pingWith(ctx, s.client(), timeout)
}

// pingWith pings Redis as ping does, on client.
func (s *Store) pingWith(ctx context.Context, client rueidis.Client, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if s.cluster {
		for addr, n := range client.Nodes() {
			cmd := n.B().Ping().Build()
			if err := errors.Join(bounded(ctx, func() error { return n.Do(ctx, cmd).Error() })); err != nil {
				return fmt.Errorf("redis: ping %s: %w", addr, err)
			}
		}
		return nil
	}
	cmd := client.B().Ping().Build()
	if err := errors.Join(bounded(ctx, func() error { return client.Do(ctx, cmd).Error() })); err != nil {
		return fmt.Errorf("redis: ping: %w", err)
	}
	return nil
}

// unreachable reports whether err says that Redis could not be reached (a
// refused, reset, closed or silent connection), as opposed to a call that
// ran out of its time, a caller that gave up, or an answer Redis gave.
func unreachable(err error) bool {
	if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	if _, ok := rueidis.IsRedisErr(err); ok {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, rueidis.ErrClosing) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}

// windowEnd is the end, in Unix seconds, of the fixed window holding now
// (store.TakeWindow's windows, calendar periods included: before the epoch
// counts as the epoch).
func windowEnd(r *store.Rule, now int64) uint64 { return r.WindowEnd(now) }

// windowTTL is the expiry, in milliseconds from now, of a key counting the
// window that ends at end (Unix seconds): a second after the window. A late
// expiry changes nothing (a lapsed window counts 0), an early one would, and
// Redis expires by its own clock, not the caller's.
func windowTTL(end uint64, now int64) uint64 {
	return (end*uint64(time.Second)-clampNow(now))/uint64(time.Millisecond) + 1000
}

func clampNow(now int64) uint64 { return uint64(max(now, 0)) }

// quanta returns floor and ceil of now in the rule's time quanta:
// now*rk/period, in 128 bits, as store.TakeTokens counts them.
func quanta(r *store.Rule, now int64) (lo, hi uint64) {
	_, rk, _ := r.Quanta()
	h, l := bits.Mul64(clampNow(now), rk)
	q, rem := bits.Div64(h, l, uint64(r.Period())) // h < period as rk <= period
	if rem != 0 {
		return q, q + 1
	}
	return q, q
}

// appendArgs appends the script arguments of one hit (see take.lua).
func (s *Store) appendArgs(args []string, h *store.Hit, now int64) []string {
	r := h.Rule
	// A check (cost 0) sends what it needs as its cost (store.Hit.Need).
	need := h.Need()
	flags := flagSets[b2i(h.Veto)|b2i(need > r.Capacity())<<1|int(h.Mode)<<2|b2i(h.Cost == 0)<<4]
	if r.Algorithm() == store.FixedWindow {
		// A cost above the limit never fits (the flags say so); above the
		// most a count holds it counts as that, which keeps the script's
		// sums exact.
		bound := windowBound(r)
		end := windowEnd(r, now)
		if h.Plain {
			return append(args, "f", flags, strconv.FormatUint(min(need, bound), 10), strconv.FormatUint(r.Limit(), 10),
				strconv.FormatUint(end, 10), strconv.FormatInt(s.plain.TTL(r)*1000, 10), strconv.FormatUint(bound, 10), "p")
		}
		return append(args, "f", flags, strconv.FormatUint(min(need, bound), 10), strconv.FormatUint(r.Limit(), 10),
			strconv.FormatUint(end, 10), strconv.FormatUint(windowTTL(end, now), 10), strconv.FormatUint(bound, 10), "")
	}
	if r.Algorithm() == store.SlidingWindow {
		g, bucket, bits := r.Buckets()
		j, leaves := r.SlidingBucket(now)
		// The key expires a second after now's bucket has left the
		// window, when a take at now counts in it (a later bucket the key
		// holds keeps the key's expiry; a debt, until it is repaid: bms is
		// a bucket's length, a tenth longer for a calendar's periods of
		// unequal length, since a late expiry changes nothing).
		ttl := uint64(leaves/time.Millisecond) + 1000
		bms := float64(bucket) / float64(time.Millisecond)
		if r.Calendar() != nil {
			bms *= 1.1
		}
		// (A sliding window's debt stays below 2^32: 2^33 stands for
		// every larger cost.)
		return append(args, "s", flags, strconv.FormatUint(min(need, 1<<33), 10), strconv.FormatUint(r.Limit(), 10),
			strconv.FormatUint(uint64(uint32(j)), 10), strconv.FormatUint(g, 10)+":"+strconv.FormatUint(bits, 10),
			strconv.FormatUint(ttl, 10), strconv.FormatFloat(bms, 'g', 17, 64))
	}
	k, rk, tol := r.Quanta()
	ck := strconv.FormatUint(tokenQuanta(h, k, tol), 10)
	ms := strconv.FormatFloat(float64(r.Period())/float64(rk)/float64(time.Millisecond), 'g', 17, 64)
	if s.opt.ServerClock {
		return append(args, "t", flags, ck, strconv.FormatUint(rk, 10),
			strconv.FormatInt(int64(r.Period()), 10), strconv.FormatUint(tol, 10), "", ms)
	}
	// nowC + tol < 2^63 + 2^62: no wrap.
	lo, hi := quanta(r, now)
	return append(args, "t", flags, ck, strconv.FormatUint(lo, 10), strconv.FormatUint(hi, 10),
		strconv.FormatUint(lo+tol, 10), strconv.FormatUint(hi+tol, 10), ms)
}

// tokenQuanta is a token-bucket hit's cost in quanta for the script: what
// a check needs (no token, or one under store.PeekStrict), at most the
// burst for a take or a saturating hit (a larger cost never fits), for a
// charge the cost up to the capacity, the debt bound and one quantum
// (every larger cost moves the state as far), and for a refund the cost
// up to 2^64-1. (A refund may meet a state further past now than the
// debt bound, charged before the clock stepped back; every state is less
// than 2^64-1 quanta past any now, so a larger refund empties the bucket
// as store.Refund does.)
func tokenQuanta(h *store.Hit, k, tol uint64) uint64 {
	switch {
	case h.Cost == 0:
		return h.Need() * k
	case h.Mode == store.ModeTake || h.Mode == store.ModeSaturate:
		return min(h.Cost, h.Rule.Burst()) * k // at most tol ≤ 2^62
	}
	hi, lo := bits.Mul64(h.Cost, k)
	switch {
	case h.Mode == store.ModeRefund && hi != 0:
		return math.MaxUint64
	case h.Mode == store.ModeRefund:
		return lo
	case hi != 0 || lo > tol+store.MaxDebt+1:
		return tol + store.MaxDebt + 1
	}
	return lo
}

// windowBound is the most a count of r's fixed windows holds (see
// store.TakeWindow): 2^32-2 for a narrow rule, store.MaxLimit for a wide
// one.
func windowBound(r *store.Rule) uint64 {
	if r.Wide() {
		return store.MaxLimit
	}
	return store.MaxFixedWindowLimit + 1
}

// flagSets are the script's hit flags indexed by veto | beyond capacity<<1
// | mode<<2 | cost 0<<4.
var flagSets = func() (f [32]string) {
	for i := range f {
		f[i] = strconv.Itoa(i)
	}
	return f
}()

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
