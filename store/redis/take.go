package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
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
	now       []int64  // per hit, Redis TIME in ns with the server clock, else nil
	orig      []uint64 // state of each hit's key before the batch, as the store package holds it
	final     []uint64 // and after it
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
	// Own copies of the keys: a hit's Key may alias the caller's reused
	// buffer, and a call that reaches its deadline may still be written to
	// Redis after Take returns.
	keys := make([]string, len(hits))
	for i := range hits {
		if s.opt.KeyPrefix == "" {
			keys[i] = strings.Clone(hits[i].Key)
		} else {
			keys[i] = s.opt.KeyPrefix + hits[i].Key
		}
	}
	if s.cache != nil && s.cache.answer(s, now, hits, keys, out) {
		s.localAnswers.Add(1)
		return nil
	}
	if !s.breaker.allow() {
		return ErrOpen
	}
	cctx, cancel := context.WithTimeout(ctx, s.opt.Timeout)
	defer cancel()
	var (
		r   reply
		err error
	)
	start := time.Now()
	if s.cluster {
		r, err = s.takeCluster(cctx, now, hits, keys)
	} else {
		b := batch{keys: keys, args: s.args(hits, nil, now)}
		r, err = s.run(cctx, b)
	}
	if s.opt.OnCall != nil {
		s.opt.OnCall(time.Since(start), err)
	}
	if err != nil {
		// A caller that gave up says nothing about Redis.
		if ctx.Err() == nil {
			s.breaker.failure()
		}
		return err
	}
	s.breaker.success()
	committed, final := s.decide(now, r.now, hits, keys, r.orig, out)
	// On Cluster the script's final states of a denied batch predate the
	// refunds.
	if (committed != r.committed || r.committed || !s.cluster) && !sameStates(final, r.final) {
		return fmt.Errorf("redis: script and store algorithms disagree on %s", keys[0])
	}
	if s.cache != nil {
		s.cache.update(now, r.now, hits, keys, final)
	}
	return nil
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

// run executes the script for one batch.
func (s *Store) run(ctx context.Context, b batch) (reply, error) {
	return parseReply(s.eval(ctx, b.keys, b.args), len(b.keys))
}

// eval executes the script by SHA, with a fallback to its source when
// Redis does not have it cached.
func (s *Store) eval(ctx context.Context, keys, args []string) rueidis.RedisResult {
	c := s.client
	res := c.Do(ctx, c.B().Evalsha().Sha1(takeSHA).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	if e, ok := rueidis.IsRedisErr(res.Error()); ok && e.IsNoScript() {
		res = c.Do(ctx, c.B().Eval().Script(takeLua).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	}
	return res
}

func parseReply(res rueidis.RedisResult, n int) (reply, error) {
	var r reply
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
	r.orig, r.final = make([]uint64, n), make([]uint64, n)
	for i := range n {
		o, err1 := parseState(&a[3+i])
		f, err2 := parseState(&a[3+n+i])
		if err := errors.Join(err1, err2); err != nil {
			return r, fmt.Errorf("redis: script reply: %w", err)
		}
		r.orig[i], r.final[i] = o, f
	}
	return r, nil
}

// parseState reads a state as the script stores it: "end:count" for a
// fixed window (packed as the store package packs it), a TAT in quanta
// for a token bucket.
func parseState(m *rueidis.RedisMessage) (uint64, error) {
	v, err := m.ToString()
	if err != nil {
		return 0, err
	}
	e, c, window := strings.Cut(v, ":")
	if !window {
		return strconv.ParseUint(v, 10, 64)
	}
	end, err1 := strconv.ParseUint(e, 10, 32)
	count, err2 := strconv.ParseUint(c, 10, 32)
	return end<<32 | count, errors.Join(err1, err2)
}

// decide replays the batch with the store package's algorithms on the
// states the script read (orig, one per hit, equal for hits on one key),
// in the memory store's order (see take.lua): it writes the decisions and
// returns whether the batch committed and each hit's key's final state.
// Fixed-window states are packed as the store package packs them; token
// buckets use tbNow (per hit) if not nil.
func (s *Store) decide(now int64, tbNow []int64, hits []store.Hit, keys []string, orig []uint64, out []store.Decision) (bool, []uint64) {
	n := len(hits)
	first := make([]int, n) // the first hit on the same key holds its state
	cur := make([]uint64, n)
	at := make([]int64, n)
	for i := range hits {
		first[i] = i
		for j := range i {
			if keys[j] == keys[i] {
				first[i] = first[j]
				break
			}
		}
		at[i] = now
		if tbNow != nil && hits[i].Rule.Algorithm() == store.TokenBucket {
			at[i] = tbNow[i]
		}
		if i == first[i] {
			cur[i] = orig[i]
		}
	}
	type taken struct {
		ok            bool
		before, after uint64
	}
	tk := make([]taken, n)
	apply := func(i int) (before, after uint64) {
		h, f := &hits[i], first[i]
		before = cur[f]
		if h.Saturate {
			cur[f], out[i] = store.Saturate(before, h.Rule, at[i], h.Cost)
		} else {
			cur[f], out[i] = store.Take(before, h.Rule, at[i], h.Cost)
		}
		return before, cur[f]
	}
	peek := func(i int) {
		h, st := &hits[i], cur[first[i]]
		_, out[i] = store.Take(st, h.Rule, at[i], h.Cost)
		if out[i].Allowed && h.Cost > 0 {
			_, out[i] = store.Take(st, h.Rule, at[i], 0)
			out[i].Allowed = true
		}
	}
	denied := false
	for i, h := range hits {
		switch {
		case !h.Veto:
		case denied && !h.Saturate:
			peek(i)
		default:
			before, after := apply(i)
			if !out[i].Allowed {
				denied = true
			} else if !h.Saturate && after != before {
				tk[i] = taken{true, before, after}
			}
		}
	}
	for i, h := range hits {
		switch {
		case h.Veto:
		case denied && !h.Saturate:
			peek(i)
		default:
			apply(i)
		}
	}
	if denied {
		for i := n - 1; i >= 0; i-- {
			if t := tk[i]; t.ok {
				f := first[i]
				if cur[f] == t.after {
					cur[f] = t.before
				} else {
					cur[f] = store.Refund(cur[f], t.after, hits[i].Rule, at[i], hits[i].Cost)
				}
			}
		}
		for i := range hits {
			if tk[i].ok {
				_, out[i] = store.Take(cur[first[i]], hits[i].Rule, at[i], 0)
				out[i].Allowed = true
			}
		}
	}
	final := make([]uint64, n)
	for i := range hits {
		final[i] = cur[first[i]]
	}
	return !denied, final
}

// sameStates reports whether the replayed final states equal the script's.
func sameStates(replayed, script []uint64) bool {
	for i := range replayed {
		if replayed[i] != script[i] {
			return false
		}
	}
	return true
}
