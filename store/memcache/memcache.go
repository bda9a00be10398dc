package memcache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluicehq/sluice/store"
)

// Store keeps rate-limit state in memcached. Safe for concurrent use.
type Store struct {
	c     *memcache.Client
	sel   *selector
	conns conns // the client's open connections, by server
	opt   Options

	up         chan struct{} // closed once every server first answered
	lookupErr  error         // why New found no servers (a name not resolving yet), or nil
	upOnce     sync.Once
	healthy    atomic.Bool
	srvFailing atomic.Bool   // the last SRV refresh failed
	retries    atomic.Uint64 // CAS round trips lost to a concurrent writer
	contended  atomic.Uint64 // hits that ran out of CAS attempts
	leaked     atomic.Uint64 // rollbacks that failed: takes left counted
	left       atomic.Int64  // takes whose caller's ctx ended while they waited for memcached, still running
}

// Stats are the store's cumulative counters.
type Stats struct {
	// Healthy reports whether the last probe reached every server.
	Healthy bool
	// Servers are the servers keys are spread over.
	Servers []string
	// CASRetries counts gets/cas round trips that lost to a concurrent
	// writer and went round again.
	CASRetries uint64
	// CASExhausted counts hits that ran out of CAS attempts (their Take
	// failed).
	CASExhausted uint64
	// RollbackFailures counts takes of a denied batch that could not be
	// given back: they stay counted until their window or bucket lets
	// them go (fewer grants, never more).
	RollbackFailures uint64
}

// New returns a Store on opt's servers, or on the targets of opt.SRV
// (resolved here). It does not connect: Ping does. A malformed name is
// an error; a name that does not resolve yet is not: the store then has
// no servers until Run resolves it (see Connect).
func New(ctx context.Context, opt Options) (*Store, error) {
	opt = opt.withDefaults()
	s := &Store{sel: &selector{modulo: opt.ModuloServers}, opt: opt, up: make(chan struct{})}
	switch {
	case opt.KeyPrefix != "" && (!legal(opt.KeyPrefix) || len(opt.KeyPrefix) > maxKeyLen/2):
		return nil, fmt.Errorf("memcache: key prefix %q: at most %d bytes, no spaces or control characters, not starting with #", opt.KeyPrefix, maxKeyLen/2)
	case opt.SRV != "" && len(opt.Servers) > 0:
		return nil, errors.New("memcache: give servers or an SRV name, not both")
	}
	if err := s.resolve(ctx); err != nil {
		var le *lookupError
		if !errors.As(err, &le) {
			return nil, err
		}
		s.lookupErr = err
	}
	s.c = memcache.NewFromSelector(s.sel)
	s.c.Timeout, s.c.MaxIdleConns = opt.Timeout, opt.MaxIdleConns
	dial := (&net.Dialer{Timeout: opt.Timeout}).DialContext // as the library's own
	if opt.TLS != nil {
		dial = (&tls.Dialer{Config: opt.TLS}).DialContext
	}
	s.c.DialContext = s.conns.dial(dial)
	s.healthy.Store(true)
	return s, nil
}

// resolve looks up the servers (opt.Servers' names, or opt.SRV's
// targets) and uses them; on an error it changes nothing.
func (s *Store) resolve(ctx context.Context) error {
	names := s.opt.Servers
	if s.opt.SRV != "" {
		var err error
		if names, err = lookupSRV(ctx, s.opt.Resolver, s.opt.SRV); err != nil {
			return err
		}
	}
	return s.sel.set(ctx, s.opt.Resolver, names)
}

var errUnresolved = errors.New("memcache: ping: the servers' names do not resolve yet")

// Ping reaches every server, reporting the first that fails. Once every
// server answered, Connected is closed.
func (s *Store) Ping() error {
	if s.sel.empty() {
		return errUnresolved
	}
	if err := s.c.Ping(); err != nil {
		return fmt.Errorf("memcache: ping: %w", err)
	}
	s.upOnce.Do(func() {
		s.healthy.Store(true)
		close(s.up)
	})
	return nil
}

// Connect pings every server, as serve does at startup. A server that
// cannot be reached yet (refused, silent, not resolving) is no error: the
// store is then unhealthy, its calls fail (answered by the caller's
// failure mode), and Run pings again with back-off (Options.ConnectRetry)
// until every server answered; Connected says when. A TLS handshake that
// a server refuses, or whose certificate does not verify, is an error.
func (s *Store) Connect() error {
	err := s.Ping()
	if err == nil {
		return nil
	}
	if !transient(err) {
		return err
	}
	if errors.Is(err, errUnresolved) && s.lookupErr != nil {
		err = s.lookupErr
	}
	s.healthy.Store(false)
	s.opt.Logger.Warn("memcached not reachable yet: answering by the failure mode and retrying",
		"servers", s.configured(), "cause", err, "retry_in", s.opt.ConnectRetry)
	return nil
}

// Connected is closed once every server first answered a ping.
func (s *Store) Connected() <-chan struct{} { return s.up }

// transient reports whether err, of a ping, may go away by itself: not a
// TLS handshake that a server refused or whose certificate does not
// verify.
func transient(err error) bool {
	var ope *net.OpError
	if errors.As(err, &ope) && ope.Op == "remote error" {
		return false
	}
	var cv *tls.CertificateVerificationError
	return !errors.As(err, &cv) && !badCertificate(err)
}

// badCertificate reports whether err says a certificate does not verify
// (what a VerifyConnection of the TLS settings returns as it is).
func badCertificate(err error) bool {
	var (
		ua x509.UnknownAuthorityError
		he x509.HostnameError
		ci x509.CertificateInvalidError
	)
	return errors.As(err, &ua) || errors.As(err, &he) || errors.As(err, &ci)
}

// configured names the servers for a log line: those in use, or while
// none resolved, the names given.
func (s *Store) configured() []string {
	if !s.sel.empty() {
		return s.sel.names()
	}
	if s.opt.SRV != "" {
		return []string{s.opt.SRV}
	}
	return s.opt.Servers
}

// awaitServers pings until every server answered: at once, then after
// ConnectRetry, then twice as long each time up to ConnectRetryMax. While
// the servers' names do not resolve, it looks them up again first. The
// store is unhealthy meanwhile. It returns false when ctx ends first.
func (s *Store) awaitServers(ctx context.Context) bool {
	wait := s.opt.ConnectRetry
	for attempt := 1; ; attempt++ {
		err := s.resolveOnce(ctx)
		if err == nil {
			err = s.Ping()
		}
		if err == nil {
			s.healthy.Store(true)
			if attempt > 1 {
				s.opt.Logger.Info("memcached reachable: connected", "servers", s.sel.names(), "attempts", attempt)
			}
			return true
		}
		s.healthy.Store(false)
		if attempt > 1 {
			wait = min(2*wait, s.opt.ConnectRetryMax)
			s.opt.Logger.Warn("memcached not reachable yet", "servers", s.configured(), "cause", err, "attempts", attempt, "retry_in", wait)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
	}
}

// resolveOnce resolves the servers if they have none yet, within
// lookupTimeout.
func (s *Store) resolveOnce(ctx context.Context) error {
	if !s.sel.empty() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	return s.resolve(ctx)
}

// lookupTimeout bounds the DNS lookups of one resolution by Run.
const lookupTimeout = 5 * time.Second

// Close closes the idle connections.
func (s *Store) Close() error { return s.c.Close() }

// Healthy reports whether the last probe (Run) reached every server.
func (s *Store) Healthy() bool { return s.healthy.Load() }

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	return Stats{Healthy: s.Healthy(), Servers: s.sel.names(), CASRetries: s.retries.Load(),
		CASExhausted: s.contended.Load(), RollbackFailures: s.leaked.Load()}
}

// Run first waits for every server to answer if Connect found one that
// did not (see Connect). Then it pings every server each ProbeInterval for Healthy and, with an SRV
// name and SRVRefresh, resolves it again each SRVRefresh (a failed lookup
// keeps the servers it had). It returns when ctx ends.
func (s *Store) Run(ctx context.Context) error {
	select {
	case <-s.up:
	default:
		if !s.awaitServers(ctx) {
			return nil
		}
	}
	probe := time.NewTicker(s.opt.ProbeInterval)
	defer probe.Stop()
	var refresh <-chan time.Time
	if s.opt.SRV != "" && s.opt.SRVRefresh > 0 {
		t := time.NewTicker(s.opt.SRVRefresh)
		defer t.Stop()
		refresh = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-probe.C:
			err := s.Ping()
			if ok := err == nil; s.healthy.Swap(ok) != ok {
				if ok {
					s.opt.Logger.Info("memcached reachable again")
				} else {
					s.opt.Logger.Warn("memcached unreachable", "cause", err)
				}
			}
		case <-refresh:
			s.refresh(ctx)
		}
	}
}

// refresh resolves the SRV name again and uses its targets. While a
// connection stays open to a server no longer used (idle; or in a call
// when the servers changed, idle since), it closes the idle connections:
// the library keeps them per server and would never use nor close those.
// Calls in flight keep theirs; the servers in use re-dial.
func (s *Store) refresh(ctx context.Context) {
	defer func() {
		if s.conns.outside(s.sel.has) {
			_ = s.c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, min(max(s.opt.SRVRefresh, time.Second), lookupTimeout))
	defer cancel()
	err := s.resolve(ctx)
	// One line when lookups start failing, one when they work again.
	if failing := err != nil; s.srvFailing.Swap(failing) != failing {
		if failing {
			s.opt.Logger.Warn("memcached SRV refresh failed; keeping the servers", "srv", s.opt.SRV, "servers", s.sel.names(), "cause", err)
		} else {
			s.opt.Logger.Info("memcached SRV refresh works again", "srv", s.opt.SRV, "servers", s.sel.names())
		}
	}
}

// taken records what a hit consumed, to give back if its batch is denied.
type taken struct {
	key           string // "" when nothing was consumed
	inc           uint64 // a fixed window: what the take added to the count
	before, after store.State
}

// Take applies hits as one batch at now, per store.Store.
//
// Fixed windows count with INCR on one key per window (ADD on a window's
// first hit); token buckets and sliding windows run the algorithm in a
// gets/cas loop on one key. Vetoing hits are taken first, in order; once
// one is denied the rest are only evaluated, and the taken ones are given
// back (DECR, or a CAS of store.Rollback): the batch is all-or-nothing
// as seen once Take returns, not atomically (docs/MEMCACHED.md). On an
// error, what the batch took is given back too, except its charges,
// refunds and saturating hits already applied.
func (s *Store) Take(ctx context.Context, now int64, hits []store.Hit, out []store.Decision) error {
	if len(out) != len(hits) {
		return fmt.Errorf("memcache: %d decisions for %d hits", len(out), len(hits))
	}
	if ctx.Done() == nil {
		return s.take(ctx, now, hits, out)
	}
	// The client takes no context: each round trip may last up to
	// Timeout, whatever the caller's deadline. The take runs in its own
	// goroutine, on copies, and the caller returns when ctx ends; the
	// take then stops at its next round trip and gives back what it took
	// (see take). While MaxIdleConns takes left so are still waiting for
	// memcached (each holds a connection), a take fails at once: a silent
	// server would otherwise gather a connection per call.
	if n := s.left.Load(); n >= int64(s.opt.MaxIdleConns) {
		return fmt.Errorf("memcache: %d calls past their deadline still wait for memcached", n)
	}
	t := newDetached(hits)
	go func() {
		err := s.take(ctx, now, t.hits, t.out)
		if t.state.CompareAndSwap(detachedRunning, detachedDone) {
			t.done <- err
			return
		}
		s.left.Add(-1)
		t.release() // its caller has gone: nothing else holds t
	}()
	select {
	case err := <-t.done:
		return t.answer(out, err)
	case <-ctx.Done():
	}
	if !t.state.CompareAndSwap(detachedRunning, detachedLeft) {
		return t.answer(out, <-t.done)
	}
	s.left.Add(1)
	return fmt.Errorf("memcache: %w", ctx.Err())
}

// detached is a Take running in its own goroutine (see Take), on copies
// it owns: the hits, their keys (the caller's may alias a buffer it
// reuses once Take returns) and the decisions. Pooled: whoever finishes
// with it last (the caller that got its answer, or the take whose caller
// left) releases it.
type detached struct {
	hits  []store.Hit // their keys point into keys
	keys  []byte
	out   []store.Decision
	done  chan error   // the take's error, when it ended first
	state atomic.Int32 // detachedRunning, then detachedDone or detachedLeft
}

const (
	detachedRunning int32 = iota
	detachedDone          // the take ended first: its caller reads its result
	detachedLeft          // its caller's ctx ended first
)

var detachedPool = sync.Pool{New: func() any { return &detached{done: make(chan error, 1)} }}

// maxPooledKeys bounds the key bytes a pooled detached keeps.
const maxPooledKeys = 64 << 10

// newDetached copies hits, their keys included, into a pooled detached.
func newDetached(hits []store.Hit) *detached {
	t := detachedPool.Get().(*detached)
	t.state.Store(detachedRunning)
	n := 0
	for i := range hits {
		n += len(hits[i].Key)
	}
	t.keys = slices.Grow(t.keys[:0], n)
	t.hits = append(t.hits[:0], hits...)
	for i := range t.hits {
		k := hits[i].Key
		if k == "" {
			continue
		}
		at := len(t.keys)
		t.keys = append(t.keys, k...)
		// No string of its own: t.keys is not written again until t is
		// released, once the take is done with the keys.
		t.hits[i].Key = unsafe.String(&t.keys[at], len(k))
	}
	t.out = slices.Grow(t.out[:0], len(hits))[:len(hits)]
	clear(t.out)
	return t
}

// answer gives the caller the take's decisions and error, and releases t.
func (t *detached) answer(out []store.Decision, err error) error {
	copy(out, t.out)
	t.release()
	return err
}

// release returns t to the pool.
func (t *detached) release() {
	clear(t.hits) // drop the rules and keys
	if cap(t.keys) > maxPooledKeys {
		t.keys = nil
	}
	detachedPool.Put(t)
}

// take is Take on the caller's goroutine.
func (s *Store) take(ctx context.Context, now int64, hits []store.Hit, out []store.Decision) error {
	var buf [8]taken
	tk := buf[:]
	if len(hits) > len(buf) {
		tk = make([]taken, len(hits))
	}
	denied, err := false, error(nil)
	for pass := range 2 {
		for i := range hits {
			h := &hits[i]
			if h.Veto != (pass == 0) {
				continue
			}
			if err = ctx.Err(); err != nil {
				break
			}
			if denied && !h.Always() {
				out[i], err = s.peek(h, now)
			} else {
				tk[i], out[i], err = s.apply(ctx, h, now)
				if err == nil && h.Veto && !out[i].Allowed {
					denied = true
				}
			}
			if err != nil {
				err = &store.HitError{Index: i, Err: err}
				break
			}
		}
		if err != nil {
			break
		}
	}
	if !denied && err == nil {
		return nil
	}
	at := now
	if s.opt.Clock != nil {
		at = max(at, s.opt.Clock.Now())
	}
	for i := len(hits) - 1; i >= 0; i-- {
		if tk[i].key != "" {
			if rerr := s.rollback(tk[i], &hits[i], at); rerr != nil {
				s.leaked.Add(1)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("memcache: %w", err)
	}
	for i := range hits {
		if tk[i].key != "" {
			st, err := s.load(&hits[i], now)
			if err != nil {
				return fmt.Errorf("memcache: %w", &store.HitError{Index: i, Err: err})
			}
			out[i] = store.View(st, hits[i].Rule, now)
		}
	}
	return nil
}

// Reset sets the hits' counters back to empty at now: it deletes the key
// of each fixed window's current window, and each other rule's key.
func (s *Store) Reset(ctx context.Context, now int64, hits []store.Hit) error {
	for i := range hits {
		if err := ctx.Err(); err != nil {
			return err
		}
		h := &hits[i]
		key := s.key(h.Key, 0)
		if h.Rule.Algorithm() == store.FixedWindow {
			key = s.windowKey(h, h.Rule.WindowEnd(now), now)
		}
		if err := s.c.Delete(key); err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
			return fmt.Errorf("memcache: reset: %w", &store.HitError{Index: i, Err: err})
		}
	}
	return nil
}

// apply applies one hit, returning what to give back on a denial.
func (s *Store) apply(ctx context.Context, h *store.Hit, now int64) (taken, store.Decision, error) {
	if h.Rule.Algorithm() == store.FixedWindow {
		return s.applyWindow(h, now)
	}
	return s.applyCAS(ctx, h, now)
}

// peek decides a hit of a denied batch without consuming: a denial as
// Take reports it, or a fit reported as Allowed with what remains now.
func (s *Store) peek(h *store.Hit, now int64) (store.Decision, error) {
	st, err := s.load(h, now)
	if err != nil {
		return store.Decision{}, err
	}
	return h.Check(st, now), nil
}

// load reads the state of the hit's key at now, fresh if it has none.
func (s *Store) load(h *store.Hit, now int64) (store.State, error) {
	r := h.Rule
	if r.Algorithm() == store.FixedWindow {
		end := r.WindowEnd(now)
		n, err := s.count(s.windowKey(h, end, now))
		return windowState(r, end, n), err
	}
	it, err := s.c.Get(s.key(h.Key, 0))
	if errors.Is(err, memcache.ErrCacheMiss) {
		return store.State{}, nil
	}
	if err != nil {
		return store.State{}, err
	}
	return decodeState(it.Value)
}

// rollback gives back one take at now, the time of the rollback.
func (s *Store) rollback(t taken, h *store.Hit, now int64) error {
	if t.inc > 0 {
		return s.decr(t.key, t.inc)
	}
	for range s.opt.CASAttempts {
		it, err := s.c.Get(t.key)
		if errors.Is(err, memcache.ErrCacheMiss) {
			return nil // expired: nothing left to give back
		}
		if err != nil {
			return err
		}
		cur, err := decodeState(it.Value)
		if err != nil {
			return err
		}
		next := t.before
		if cur != t.after {
			next = store.Rollback(cur, t.after, h.Rule, now, h.Cost)
		}
		if next == cur {
			return nil
		}
		it.Value, it.Expiration = encodeState(next), expiry(h.Rule, next, now)
		if err = s.c.CompareAndSwap(it); !retry(err) {
			return err
		}
		s.retries.Add(1)
	}
	return errContended
}

var errContended = errors.New("contended: out of CAS attempts")

// retry reports whether a write lost to a concurrent writer (a CAS
// conflict, a key added or removed meanwhile).
func retry(err error) bool {
	return errors.Is(err, memcache.ErrCASConflict) || errors.Is(err, memcache.ErrNotStored) || errors.Is(err, memcache.ErrCacheMiss)
}

// applyCAS runs the hit's algorithm on its key's state in a gets/cas
// loop. A hit that leaves the state as it was (a check, a denial) writes
// nothing. It stops early when ctx ends.
func (s *Store) applyCAS(ctx context.Context, h *store.Hit, now int64) (taken, store.Decision, error) {
	key := s.key(h.Key, 0)
	for attempt := range s.opt.CASAttempts {
		if attempt > 0 {
			s.retries.Add(1)
			backoff(attempt)
			if err := ctx.Err(); err != nil {
				return taken{}, store.Decision{}, err
			}
		}
		it, err := s.c.Get(key)
		var before store.State
		switch {
		case errors.Is(err, memcache.ErrCacheMiss):
			it = nil
		case err != nil:
			return taken{}, store.Decision{}, err
		default:
			if before, err = decodeState(it.Value); err != nil {
				return taken{}, store.Decision{}, err
			}
		}
		after, d := h.Apply(before, now)
		if after == before {
			return taken{}, d, nil
		}
		v, exp := encodeState(after), expiry(h.Rule, after, now)
		if it == nil {
			err = s.c.Add(&memcache.Item{Key: key, Value: v, Expiration: exp})
		} else {
			it.Value, it.Expiration = v, exp
			err = s.c.CompareAndSwap(it)
		}
		switch {
		case err == nil && h.Mode == store.ModeTake:
			return taken{key: key, before: before, after: after}, d, nil
		case err == nil:
			return taken{}, d, nil
		case !retry(err):
			return taken{}, store.Decision{}, err
		}
	}
	s.contended.Add(1)
	return taken{}, store.Decision{}, errContended
}

// backoff waits before CAS attempt n (from 1): a random time up to
// 50µs·2^n, at most 5 ms, so contenders spread out.
func backoff(n int) {
	d := min(50*time.Microsecond<<min(n, 10), 5*time.Millisecond)
	time.Sleep(rand.N(d) + time.Microsecond)
}

// applyWindow counts a fixed-window hit with INCR on the key of the window
// holding now, then decides from the count before it with the pure
// algorithm and gives back (DECR) what the algorithm did not consume: a
// denied take, a saturating hit's part past the limit. A check, and a take
// that can never fit, only read.
func (s *Store) applyWindow(h *store.Hit, now int64) (taken, store.Decision, error) {
	r := h.Rule
	end := r.WindowEnd(now)
	key := s.windowKey(h, end, now)
	var inc uint64
	switch h.Mode {
	case store.ModeTake:
		if h.Cost <= r.Limit() {
			inc = h.Cost
		}
	case store.ModeSaturate:
		inc = min(h.Cost, r.Limit())
	case store.ModeCharge:
		inc = min(h.Cost, countBound(r))
	case store.ModeRefund:
		return s.refundWindow(h, end, key, now)
	}
	var before uint64
	if inc == 0 {
		n, err := s.count(key)
		if err != nil {
			return taken{}, store.Decision{}, err
		}
		before = n
	} else {
		exp := windowExpiry(end, now)
		if h.Plain {
			// (the reference writes this as is: a month's with jitter and
			// a year's, past 30 days, memcached reads as a time in 1970,
			// already past)
			exp = expiryIn(s.plainKeys().TTL(r))
		}
		n, err := s.incr(key, inc, exp)
		if err != nil {
			return taken{}, store.Decision{}, err
		}
		before = n - inc
	}
	bs := windowState(r, end, before)
	_, d := h.Apply(bs, now)
	var undo uint64
	switch h.Mode {
	case store.ModeTake:
		if !d.Allowed {
			undo = inc
		}
	case store.ModeSaturate:
		used := uint64(0)
		if before < r.Limit() {
			used = min(h.Cost, r.Limit()-before)
		}
		undo = inc - used
	case store.ModeCharge:
		if before >= chargeCeiling {
			undo = inc // saturated long ago: keep INCR far from wrapping
		}
	}
	if undo > 0 {
		if err := s.decr(key, undo); err != nil {
			return taken{}, store.Decision{}, err
		}
	}
	if h.Mode == store.ModeTake && d.Allowed && inc > 0 {
		return taken{key: key, inc: inc}, d, nil
	}
	return taken{}, d, nil
}

// chargeCeiling is the count past which a charge adds nothing: far above
// every count bound (2^53), far below INCR's wrap at 2^64.
const chargeCeiling = 1 << 62

// refundWindow takes cost off the window's count with DECR (which stops
// at 0); a count saturated past the rule's bound is left alone, as
// store.Refund does.
func (s *Store) refundWindow(h *store.Hit, end uint64, key string, now int64) (taken, store.Decision, error) {
	r := h.Rule
	n, err := s.count(key)
	if err != nil {
		return taken{}, store.Decision{}, err
	}
	if h.Cost > 0 && n > 0 && !(n >= countBound(r) && countBound(r) > r.Limit()) {
		if n, err = s.c.Decrement(key, h.Cost); errors.Is(err, memcache.ErrCacheMiss) {
			n, err = 0, nil
		}
		if err != nil {
			return taken{}, store.Decision{}, err
		}
	}
	return taken{}, store.View(windowState(r, end, n), r, now), nil
}

// incr adds inc to key's count, creating it with expiry exp when missing,
// and returns the new count.
func (s *Store) incr(key string, inc uint64, exp int32) (uint64, error) {
	// A key deleted between the steps (a reset, an eviction) starts over:
	// a few rounds, each a miss that another caller's delete caused.
	for range incrRounds {
		n, err := s.c.Increment(key, inc)
		if !errors.Is(err, memcache.ErrCacheMiss) {
			return n, err
		}
		err = s.c.Add(&memcache.Item{Key: key, Value: strconv.AppendUint(nil, inc, 10), Expiration: exp})
		if !errors.Is(err, memcache.ErrNotStored) {
			return inc, err
		}
		// Another caller added it first: count on it, unless it is
		// gone again.
	}
	return 0, fmt.Errorf("the count deleted while counted, %d times in a row", incrRounds)
}

// incrRounds bounds incr's rounds of increment and add. Each round past
// the first needs a delete of the key since the round before (a reset, an
// eviction): 4 ran out in the shared suite's ConcurrentResets (5 resets
// among the takes) on a busy machine, once.
const incrRounds = 8

// decr takes n off key's count; a missing key (expired) has nothing to
// give back.
func (s *Store) decr(key string, n uint64) error {
	if _, err := s.c.Decrement(key, n); err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
		return err
	}
	return nil
}

// count reads a window's count; a missing key counts 0.
func (s *Store) count(key string) (uint64, error) {
	it, err := s.c.Get(key)
	if errors.Is(err, memcache.ErrCacheMiss) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	// DECR keeps a value's length: it pads a shorter count with spaces.
	n, err := strconv.ParseUint(string(bytes.TrimRight(it.Value, " ")), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("the count's key holds %d bytes that are not a count", len(it.Value))
	}
	return n, nil
}

// countBound is the most a count of r's windows holds in a store.State
// (see store/fixedwindow.go): MaxFixedWindowLimit+1 for a narrow rule,
// MaxLimit for a wide one.
func countBound(r *store.Rule) uint64 {
	if r.Wide() {
		return store.MaxLimit
	}
	return store.MaxFixedWindowLimit + 1
}

// windowState is the fixed-window State of a count in the window ending
// at end (Unix seconds), the count clamped to the rule's bound: the
// encoding store.TakeWindow reads (store/fixedwindow.go).
func windowState(r *store.Rule, end, count uint64) store.State {
	count = min(count, countBound(r))
	return store.State{Word: end<<32 | count&0xffffffff, High: count >> 32}
}

// Memcached reads an expiry up to 30 days as seconds from now, beyond as
// a Unix time.
const relativeExpiryMax = 30 * 24 * 3600

// windowExpiry is the expiry of the key of the window ending at end:
// a few seconds after the window ends, so replicas whose clocks lag a
// little still find it.
func windowExpiry(end uint64, now int64) int32 {
	return expiryIn(int64(end) - now/int64(time.Second) + defaultExpiryGraceSec)
}

// expiry is the expiry of a token bucket's or sliding window's state
// st: once it is certainly fresh. A token bucket is fresh once full
// (View's ResetAfter); a sliding window once its debt is repaid (View's
// ResetAfter at most) and its last counts have left, a period and a
// bucket later (two nominal periods cover a calendar period's).
func expiry(r *store.Rule, st store.State, now int64) int32 {
	d := store.View(st, r, now).ResetAfter
	if r.Algorithm() == store.SlidingWindow {
		d += 2 * r.Period()
	}
	sec := int64(math.Ceil(d.Seconds()))
	if d >= time.Duration(math.MaxInt64/2) || sec < 0 {
		return 0
	}
	return expiryIn(sec + defaultExpiryGraceSec)
}

// expiryIn encodes an expiry sec seconds from now for memcached: relative
// up to 30 days, else absolute, a Unix time that memcached reads by its
// own clock, so it is taken from the wall clock here, not from the
// limiter's; 0 (never) past 2038.
func expiryIn(sec int64) int32 {
	if sec <= relativeExpiryMax {
		return int32(max(sec, 1))
	}
	abs := time.Now().Unix() + sec
	if abs > math.MaxInt32 {
		return 0
	}
	return int32(abs)
}

// encodeState is a one-word state's value: 8 bytes, big-endian. Only
// fixed windows have two-word (wide) states, and they are counts.
func encodeState(st store.State) []byte { return binary.BigEndian.AppendUint64(nil, st.Word) }

func decodeState(v []byte) (store.State, error) {
	if len(v) != 8 {
		return store.State{}, fmt.Errorf("a state of %d bytes, want 8", len(v))
	}
	return store.State{Word: binary.BigEndian.Uint64(v)}, nil
}

// maxKeyLen is memcached's longest key.
const maxKeyLen = 250

// key is the memcached key of a Sluice key: the prefix, the key and, for
// a fixed window, "@" and the window's end (end > 0). A key too long for
// memcached, holding bytes it refuses (spaces, control characters) or
// starting with "#" becomes "#" and its SHA-256 in hex instead.
func (s *Store) key(k string, end uint64) string {
	suffix := ""
	if end > 0 {
		suffix = "@" + strconv.FormatUint(end, 10)
	}
	if legal(k) && len(s.opt.KeyPrefix)+len(k)+len(suffix) <= maxKeyLen {
		return s.opt.KeyPrefix + k + suffix
	}
	sum := sha256.Sum256([]byte(k))
	return s.opt.KeyPrefix + "#" + hex.EncodeToString(sum[:]) + suffix
}

// windowKey is the key of the hit's fixed window ending at end: Sluice's,
// or for a Plain hit the reference's (store.PlainKeys), which memcached
// refuses where it holds a space or a control character or is longer
// than 250 bytes (as it refuses the reference's), and so is hashed as
// Sluice's keys are.
func (s *Store) windowKey(h *store.Hit, end uint64, now int64) string {
	if !h.Plain {
		return s.key(h.Key, end)
	}
	k := s.plainKeys().Append(nil, h.Key, h.Rule, now)
	if legal(string(k)) && len(k) <= maxKeyLen {
		return string(k)
	}
	return s.key(h.Key, end)
}

func (s *Store) plainKeys() store.PlainKeys {
	return store.PlainKeys{Prefix: s.opt.KeyPrefix, JitterMax: s.opt.PlainJitterMax}
}

func legal(k string) bool {
	if k == "" || k[0] == '#' {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c == 0x7f {
			return false
		}
	}
	return true
}
