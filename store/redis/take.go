package redis

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/store"
)

// batch is one script call: hits of one request (on Cluster: those of one
// hash slot) with their keys and arguments.
type batch struct {
	idx  []int // indexes into the request's hits
	keys []string
	args []string
}

// reply is what the script answered for a batch.
type reply struct {
	committed bool
	now       []int64       // per hit, Redis TIME in ns with the server clock, else nil
	orig      []store.State // state of each hit's key before the batch, as the store package holds it
	final     []store.State // and after it
}

// call is the scratch of one Take: its keys and, for window.lua, its
// arguments are substrings of one string built per call, so a command
// that outlives its call (a deadline) holds no buffer a later call
// reuses; the slices below are only read while the call runs. Pooled.
type call struct {
	buf        []byte
	offs       []int
	keys, args []string
	orig, fin  []store.State
	sc         scratch
	job        job
	cmds       []rueidis.Completed // runIncr's commands
	incr       []incrHit           // and hits
	counts     []uint64            // and their counts before
}

var calls = sync.Pool{New: func() any { return &call{job: job{done: make(chan struct{}, 1)}} }}

// build sets c.keys to the hits' keys with pk's prefix (in pk's layout
// for a Plain hit) and, if window, c.args to window.lua's arguments at
// now.
func (c *call) build(pk store.PlainKeys, hits []store.Hit, window bool, now int64) {
	c.buf, c.offs = c.buf[:0], append(c.offs[:0], 0)
	for i := range hits {
		if hits[i].Plain {
			c.buf = pk.Append(c.buf, hits[i].Key, hits[i].Rule, now)
		} else {
			c.buf = append(append(c.buf, pk.Prefix...), hits[i].Key...)
		}
		c.offs = append(c.offs, len(c.buf))
	}
	nkeys := len(hits)
	if window {
		c.arg(strconv.AppendInt(c.buf, int64(len(hits)), 10))
		c.arg(strconv.AppendUint(c.buf, (clampNow(now)+uint64(time.Millisecond)-1)/uint64(time.Millisecond), 10))
		for i := range hits {
			c.arg(c.field(pk, hits, i, now))
		}
	}
	arena := string(c.buf)
	c.keys, c.args = c.keys[:0], c.args[:0]
	for i := 1; i < len(c.offs); i++ {
		part := arena[c.offs[i-1]:c.offs[i]]
		if i <= nkeys {
			c.keys = append(c.keys, part)
		} else {
			c.args = append(c.args, part)
		}
	}
}

// field appends window.lua's field of hits[i] to c.buf: the bytes of an
// earlier hit's field when that hit is alike (the same rule, cost and
// layout, and no expiry jitter drawn per key; a request's hits mostly
// are), so that the script reads it once.
func (c *call) field(pk store.PlainKeys, hits []store.Hit, i int, now int64) []byte {
	h := &hits[i]
	nkeys := len(hits)
	for j := range i {
		if o := &hits[j]; o.Rule == h.Rule && o.Cost == h.Cost && o.Plain == h.Plain && (!h.Plain || pk.JitterMax == 0) {
			// (args: n, m, then the fields; offs holds the start of each)
			f := nkeys + 2 + j
			return append(c.buf, c.buf[c.offs[f]:c.offs[f+1]]...)
		}
	}
	r := h.Rule
	b := strconv.AppendUint(c.buf, min(h.Cost, r.Limit()+1), 10)
	b = strconv.AppendUint(append(b, ':'), r.Limit(), 10)
	if h.Plain {
		// (the window is in the key's name; the reference's expiry)
		return strconv.AppendInt(append(b, ":p:"...), pk.TTL(r)*1000, 10)
	}
	return strconv.AppendUint(append(b, ':'), windowEnd(r, now), 10)
}

// arg ends an argument that buf, c.buf grown, holds at its end.
func (c *call) arg(buf []byte) {
	c.buf = buf
	c.offs = append(c.offs, len(buf))
}

// windowBatch reports whether window.lua can run hits: narrow fixed
// windows on distinct keys, every hit a vetoing take that needs no more
// than it costs (not a strict peek).
func windowBatch(hits []store.Hit) bool {
	for i := range hits {
		h := &hits[i]
		if h.Rule.Algorithm() != store.FixedWindow || h.Rule.Wide() || !h.Veto || h.Mode != store.ModeTake || h.Need() != h.Cost {
			return false
		}
		for j := range i {
			if hits[j].Key == h.Key {
				return false
			}
		}
	}
	return true
}

// Take applies hits as one all-or-nothing batch (see store.Store). On a
// single Redis (or Sentinel) that is one script call; on Cluster one call
// per hash slot, with refunds when a slot denies. Decisions come from the
// store package's algorithms replayed on the states the script read, and
// are checked against what the script wrote.
func (s *Store) Take(ctx context.Context, now int64, hits []store.Hit, out []store.Decision) error {
	if len(out) != len(hits) {
		return fmt.Errorf("redis: %d decisions for %d hits", len(out), len(hits))
	}
	if len(hits) == 0 {
		return nil
	}
	c := calls.Get().(*call)
	window := windowBatch(hits)
	incr := window && incrBatch(hits)
	window = window && !incr
	c.build(s.plain, hits, window, now)
	keys := c.keys
	var cb *combiner
	if window {
		if cb = s.combinerFor(keys); cb == nil {
			window = false
		}
	}
	if s.cache != nil && s.cache.answer(s, &c.sc, now, hits, keys, out) {
		s.localAnswers.Add(1)
		calls.Put(c)
		return nil
	}
	// The deadline first: a Take with no time left must not use up the
	// open breaker's one probe call.
	start := time.Now()
	deadline, ok := s.deadline(ctx, start)
	if !ok {
		calls.Put(c)
		s.failed.Add(1)
		return fmt.Errorf("redis: no time left to ask Redis: %w", context.DeadlineExceeded)
	}
	if !s.breaker.allow() {
		calls.Put(c)
		s.failed.Add(1)
		return ErrOpen
	}
	var (
		r         reply
		err       error
		later     = !window && !incr
		abandoned bool // c's job is still queued or in flight
	)
	if incr {
		r, abandoned, err = s.runIncr(ctx, deadline, c, hits, now)
	}
	if window {
		r, later, abandoned, err = s.runWindow(ctx, deadline, cb, c, hits, now)
	}
	if later {
		r, err = s.takeScript(ctx, deadline, now, hits, keys)
	}
	if s.opt.OnCall != nil {
		s.opt.OnCall(time.Since(start), err)
	}
	if !abandoned {
		defer calls.Put(c)
	}
	if err != nil {
		s.failed.Add(1)
		s.failedCall(ctx, deadline, err)
		return err
	}
	s.breaker.success()
	committed, final := s.decide(&c.sc, now, r.now, hits, keys, r.orig, out)
	// On Cluster the script's final states of a denied batch predate the
	// refunds.
	if (committed != r.committed || r.committed || !s.cluster) && !sameStates(final, r.final) {
		return errors.New("redis: script and store algorithms disagree on the batch")
	}
	if s.cache != nil {
		s.cache.update(now, r.now, hits, keys, final)
	}
	return nil
}

// deadline returns when a Take that starts at start must be done with
// Redis: Timeout after start, or earlier when ctx's deadline leaves less,
// minus the answer margin (see Options.Timeout). ok is false when no time
// is left.
func (s *Store) deadline(ctx context.Context, start time.Time) (deadline time.Time, ok bool) {
	deadline = start.Add(s.opt.Timeout)
	if d, has := ctx.Deadline(); has {
		left := d.Sub(start)
		if d = d.Add(-min(left/10, MaxAnswerMargin)); d.Before(deadline) {
			deadline = d
		}
	}
	return deadline, deadline.After(start)
}

// failedCall counts a failed call against Redis if it says Redis cannot
// be reached before the call's deadline. A call that ran out of time only
// makes Run probe now: on a starved machine that is this process being
// slow, not Redis being down. Whatever its error says: a dial that the
// deadline cut short fails as a network "i/o timeout", and the caller's
// ctx, a margin later, has not ended yet. A caller that gave up says
// nothing.
func (s *Store) failedCall(ctx context.Context, deadline time.Time, err error) {
	switch {
	case ctx.Err() != nil:
	case errors.Is(err, context.DeadlineExceeded), !time.Now().Before(deadline):
		s.lastTimeout.Store(time.Now().UnixNano())
		s.wake()
	case unreachable(err):
		s.lastErr.Store(&err)
		s.breaker.failure()
	}
}

// takeScript runs hits through take.lua: one call, or on Cluster one per
// slot.
func (s *Store) takeScript(ctx context.Context, deadline time.Time, now int64, hits []store.Hit, keys []string) (reply, error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if s.cluster {
		return s.takeCluster(ctx, now, hits, keys)
	}
	return s.run(ctx, hits, batch{keys: keys, args: s.args(hits, nil, now)})
}

// combinerFor returns the combiner of keys' window.lua calls: the store's
// on a single Redis (or Sentinel); on Cluster that of their hash slot,
// made on first use, if every key is in one (a script's keys must be),
// else nil.
func (s *Store) combinerFor(keys []string) *combiner {
	if !s.cluster {
		return &s.comb
	}
	sl := slot(keys[0])
	for _, k := range keys[1:] {
		if slot(k) != sl {
			return nil
		}
	}
	p := &s.slots[sl]
	if cb := p.Load(); cb != nil {
		return cb
	}
	p.CompareAndSwap(nil, &combiner{s: s})
	return p.Load()
}

// runWindow runs window.lua on c's batch, through cb. later
// reports that a key holds a later window than now's: nothing was written,
// take.lua must run the batch. abandoned reports that ctx ended or the
// deadline passed while c's job was still queued or in flight: c must not
// be reused.
func (s *Store) runWindow(ctx context.Context, deadline time.Time, cb *combiner, c *call, hits []store.Hit, now int64) (r reply, later, abandoned bool, err error) {
	n := len(hits)
	c.job.keys, c.job.args, c.job.deadline = c.keys, c.args, deadline
	abandoned, err = cb.do(ctx, &c.job)
	if err != nil {
		return r, false, abandoned, err
	}
	a := c.job.res
	c.job.res = nil // a slice of the whole call's reply: not kept in the pool
	status, err := a[0].AsInt64()
	if err != nil {
		return r, false, false, fmt.Errorf("redis: window script reply: %w", err)
	}
	if status == -1 {
		return r, true, false, nil
	}
	c.orig, c.fin = slices.Grow(c.orig[:0], n)[:n], slices.Grow(c.fin[:0], n)[:n]
	for i := range n {
		before, err := a[1+i].AsInt64()
		if err == nil && (before < 0 || before > math.MaxUint32) {
			// (a value no script wrote: fixed-window counts stay below 2^32)
			err = fmt.Errorf("the count's key holds %d", before)
		}
		if err != nil {
			return r, false, abandoned, fmt.Errorf("redis: window script reply: %w", &store.HitError{Index: i, Err: err})
		}
		// The states the script read and wrote, as far as they matter: an
		// older window is no window.
		end, o := windowEnd(hits[i].Rule, now), store.State{}
		if before > 0 {
			o.Word = end<<32 | uint64(before)
		}
		c.orig[i], c.fin[i] = o, o
		if status == 1 && hits[i].Cost > 0 {
			// (A committed cost is within the limit: the script's cap
			// at limit+1 did not apply.)
			c.fin[i].Word = end<<32 | (uint64(before) + hits[i].Cost)
		}
	}
	return reply{committed: status == 1, orig: c.orig, final: c.fin}, false, abandoned, nil
}

func (s *Store) args(hits []store.Hit, idx []int, now int64) []string {
	n := len(hits)
	if idx != nil {
		n = len(idx)
	}
	args := make([]string, 1, 1+fieldsPerHit*n)
	args[0] = "0"
	if s.opt.ServerClock {
		args[0] = "1"
	}
	if idx == nil {
		for i := range hits {
			args = s.appendArgs(args, &hits[i], now)
		}
		return args
	}
	for _, i := range idx {
		args = s.appendArgs(args, &hits[i], now)
	}
	return args
}

// run executes take.lua for one batch of hits.
func (s *Store) run(ctx context.Context, hits []store.Hit, b batch) (reply, error) {
	res, err := s.eval(ctx, takeScript, b.keys, b.args)
	if err != nil {
		return reply{}, err
	}
	return parseReply(res, hits, b.idx)
}

// eval executes a script by SHA, with a fallback to its source when Redis
// does not have it cached. It returns by ctx's end (see bounded).
func (s *Store) eval(ctx context.Context, sc script, keys, args []string) (rueidis.RedisResult, error) {
	c := s.client() // not nil: the breaker stays open until connected
	cmd := c.B().Evalsha().Sha1(sc.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	res, err := bounded(ctx, func() rueidis.RedisResult { return c.Do(ctx, cmd) })
	if e, ok := rueidis.IsRedisErr(res.Error()); err == nil && ok && e.IsNoScript() {
		cmd = c.B().Eval().Script(sc.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
		res, err = bounded(ctx, func() rueidis.RedisResult { return c.Do(ctx, cmd) })
	}
	return res, err
}

// bounded runs call, a round trip to Redis on ctx, and returns its result,
// or ctx's error as soon as ctx ends, whatever call is waiting for.
// rueidis's calls end at their ctx's deadline on an open connection, not
// while they wait for a connection being dialled (by any caller, with its
// own deadline, or the dialer's second) or closed: a silent Redis (paused,
// a black hole that accepts connections) held callers up to a second past
// their deadline (docs/REDIS.md, "Late while Redis is silent"). call then
// ends in its own goroutine, once rueidis returns; it must use nothing its
// caller may reuse (commands are built before: they copy their keys and
// arguments).
func bounded[T any](ctx context.Context, call func() T) (T, error) {
	done := make(chan T, 1)
	go func() { done <- call() }()
	select {
	case r := <-done:
		return r, nil
	case <-ctx.Done():
		select {
		case r := <-done:
			return r, nil
		default:
		}
		var zero T
		return zero, fmt.Errorf("redis: %w", ctx.Err())
	}
}

// doMulti pipelines cmds on c and returns their results by ctx's end
// (see bounded); after it, each result is ctx's error.
func doMulti(ctx context.Context, c rueidis.Client, cmds rueidis.Commands) []rueidis.RedisResult {
	res, err := bounded(ctx, func() []rueidis.RedisResult { return c.DoMulti(ctx, cmds...) })
	if err != nil {
		res = make([]rueidis.RedisResult, len(cmds))
		for i := range res {
			res[i] = rueidis.NewErrorResult(err)
		}
	}
	return res
}

// parseReply reads take.lua's reply for the hits at idx (every hit when
// idx is nil).
func parseReply(res rueidis.RedisResult, hits []store.Hit, idx []int) (reply, error) {
	var r reply
	n := len(hits)
	if idx != nil {
		n = len(idx)
	}
	a, err := res.ToArray()
	if err != nil {
		return r, fmt.Errorf("redis: %w", err)
	}
	if len(a) != 3+2*n {
		return r, fmt.Errorf("redis: script answered %d values for %d keys", len(a), n)
	}
	c, err := a[0].AsInt64()
	if err != nil {
		return r, fmt.Errorf("redis: script reply: %w", err)
	}
	r.committed = c == 1
	if sec, _ := a[1].ToString(); sec != "" {
		usec, _ := a[2].ToString()
		s, err1 := strconv.ParseInt(sec, 10, 64)
		u, err2 := strconv.ParseInt(usec, 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			return r, fmt.Errorf("redis: TIME: %w", err)
		}
		r.now = make([]int64, n)
		for i := range r.now {
			r.now[i] = s*int64(time.Second) + u*int64(time.Microsecond)
		}
	}
	r.orig, r.final = make([]store.State, n), make([]store.State, n)
	for i := range n {
		alg := hits[i].Rule.Algorithm()
		if idx != nil {
			alg = hits[idx[i]].Rule.Algorithm()
		}
		o, err1 := parseState(&a[3+i], alg)
		f, err2 := parseState(&a[3+n+i], alg)
		if err := errors.Join(err1, err2); err != nil {
			return r, fmt.Errorf("redis: script reply: %w", err)
		}
		r.orig[i], r.final[i] = o, f
	}
	return r, nil
}

// parseState reads a state as the script stores it and packs it as the
// store package holds it: a fixed window's "end:count"; a sliding window's
// "index:counts", or "index:ddebt" in debt (the index modulo 2^32, which
// the store package keeps modulo 2^31); a token bucket's TAT in quanta.
func parseState(m *rueidis.RedisMessage, alg store.Algorithm) (store.State, error) {
	v, err := m.ToString()
	if err != nil || v == "" {
		return store.State{}, err
	}
	if alg == store.TokenBucket {
		tat, err := strconv.ParseUint(v, 10, 64)
		return store.State{Word: tat}, err
	}
	e, c, _ := strings.Cut(v, ":")
	end, err1 := strconv.ParseUint(e, 10, 32)
	if alg == store.FixedWindow {
		count, err2 := strconv.ParseUint(c, 10, 64)
		return store.State{Word: end<<32 | count&0xffffffff, High: count >> 32}, errors.Join(err1, err2)
	}
	debt := strings.HasPrefix(c, "d")
	low, err2 := strconv.ParseUint(strings.TrimPrefix(c, "d"), 10, 32)
	w := end%(1<<31)<<32 | low
	if debt {
		w |= 1 << 63
	}
	return store.State{Word: w}, errors.Join(err1, err2)
}

// decide replays the batch with the store package's algorithms on the
// states the script read (orig, one per hit, equal for hits on one key),
// in the memory store's order (see take.lua): it writes the decisions and
// returns whether the batch committed and each hit's key's final state.
// Fixed-window states are packed as the store package packs them; token
// buckets use tbNow (per hit) if not nil.
func (s *Store) decide(sc *scratch, now int64, tbNow []int64, hits []store.Hit, keys []string, orig []store.State, out []store.Decision) (bool, []store.State) {
	sc.start(now, tbNow, hits, keys, orig)
	first, cur, at, tk := sc.first, sc.cur, sc.at, sc.tk
	apply := func(i int) (before, after store.State) {
		h, f := &hits[i], first[i]
		before = cur[f]
		cur[f], out[i] = h.Apply(before, at[i])
		return before, cur[f]
	}
	peek := func(i int) {
		out[i] = hits[i].Check(cur[first[i]], at[i])
	}
	denied := false
	for i, h := range hits {
		switch {
		case !h.Veto:
		case denied && !h.Always():
			peek(i)
		default:
			before, after := apply(i)
			if !out[i].Allowed {
				denied = true
			} else if !h.Always() && after != before {
				tk[i] = taken{true, before, after}
			}
		}
	}
	for i, h := range hits {
		switch {
		case h.Veto:
		case denied && !h.Always():
			peek(i)
		default:
			apply(i)
		}
	}
	if denied {
		sc.rollback(hits, out)
	}
	final := sc.final
	for i := range hits {
		final[i] = cur[first[i]]
	}
	return !denied, final
}

// scratch holds decide's working state, so that a replay allocates
// nothing once its scratch has grown.
type scratch struct {
	first []int
	cur   []store.State
	at    []int64
	tk    []taken
	final []store.State
}

type taken struct {
	ok            bool
	before, after store.State
}

// start readies sc to replay hits on the states orig at now (tbNow[i]
// for a token-bucket hit, if tbNow is not nil): the first hit on each key
// holds the key's state (first), starting at orig.
func (sc *scratch) start(now int64, tbNow []int64, hits []store.Hit, keys []string, orig []store.State) {
	sc.size(len(hits))
	for i := range hits {
		sc.first[i] = i
		for j := range i {
			if keys[j] == keys[i] {
				sc.first[i] = sc.first[j]
				break
			}
		}
		sc.at[i] = now
		if tbNow != nil && hits[i].Rule.Algorithm() == store.TokenBucket {
			sc.at[i] = tbNow[i]
		}
		if i == sc.first[i] {
			sc.cur[i] = orig[i]
		}
	}
}

// rollback undoes, last first, the takes (tk) of a denied batch, and
// gives each hit that took its decision with nothing consumed.
func (sc *scratch) rollback(hits []store.Hit, out []store.Decision) {
	first, cur, at := sc.first, sc.cur, sc.at
	for i := len(hits) - 1; i >= 0; i-- {
		if t := sc.tk[i]; t.ok {
			f := first[i]
			if cur[f] == t.after {
				cur[f] = t.before
			} else {
				cur[f] = store.Rollback(cur[f], t.after, hits[i].Rule, at[i], hits[i].Cost)
			}
		}
	}
	for i := range hits {
		if sc.tk[i].ok {
			out[i] = store.View(cur[first[i]], hits[i].Rule, at[i])
		}
	}
}

// size makes every slice n long, tk cleared.
func (sc *scratch) size(n int) {
	sc.first = slices.Grow(sc.first[:0], n)[:n]
	sc.cur = slices.Grow(sc.cur[:0], n)[:n]
	sc.at = slices.Grow(sc.at[:0], n)[:n]
	sc.final = slices.Grow(sc.final[:0], n)[:n]
	sc.tk = slices.Grow(sc.tk[:0], n)[:n]
	clear(sc.tk)
}

// sameStates reports whether the replayed final states equal the script's.
func sameStates(replayed, script []store.State) bool {
	for i := range replayed {
		if replayed[i] != script[i] {
			return false
		}
	}
	return true
}
