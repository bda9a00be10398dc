package redis

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/store"
)

// The reference's counters (store.PlainKeys) hold a bare count that INCRBY
// continues, so a batch of hits on them needs no script: runIncr counts
// them as the reference does, INCRBY then PEXPIRE (its EXPIRE after every
// INCRBY) for each hit, all in one pipeline, and gives the increments of a
// request that does not fit back (settleIncr). In Redis the commands cost
// about 40 % less than window.lua's MGET and SETs bridged from Lua
// (docs/REDIS.md, "Cost and benchmark"); on Cluster a request's keys need
// not share a slot.

// incrBatch reports whether runIncr can run hits, a windowBatch: every hit
// counts in the reference's layout.
func incrBatch(hits []store.Hit) bool {
	for i := range hits {
		if !hits[i].Plain {
			return false
		}
	}
	return true
}

// incrHit is a runIncr hit as its replies are read: its cost and its
// rule's limit (at most store.MaxFixedWindowLimit: a narrow rule).
type incrHit struct{ cost, limit uint64 }

// incrLook reports whether every hit of a request is a GET: one of its
// costs is past its limit, so the request cannot fit and counts nothing.
func incrLook(hs []incrHit) bool {
	for _, h := range hs {
		if h.cost > h.limit {
			return true
		}
	}
	return false
}

// incrCommands is the number of runIncr's commands for hs: a GET per
// check (cost 0) or for every hit if incrLook, else INCRBY and PEXPIRE.
func incrCommands(hs []incrHit) int {
	if incrLook(hs) {
		return len(hs)
	}
	n := 0
	for _, h := range hs {
		n += 1 + b2i(h.cost > 0)
	}
	return n
}

// readIncr reads one request's replies, res, those of its commands for
// hits hs: each hit's count before the request into before (as window.lua
// reads a count: at most 2^32-2), and into took, if not nil, whether its
// INCRBY counted, which must be given back unless the request fits. fits
// reports whether every hit's cost fits within the room its count leaves.
// A reply that is an error, or a count that is not one, is err (the first
// such); the other hits are read all the same (on Cluster a node may fail
// while another counted).
func readIncr(res []rueidis.RedisResult, hs []incrHit, before []uint64, took []bool) (fits bool, err error) {
	look := incrLook(hs)
	fits = !look
	k := 0
	for i, h := range hs {
		incr := !look && h.cost > 0
		m := &res[k]
		k++
		if incr {
			k++
		}
		// (GET answers a string: a count, or a value no one counted)
		count, e := m.AsInt64()
		switch {
		case incr:
			if took != nil {
				took[i] = e == nil
			}
			count -= int64(h.cost)
			if e == nil {
				// (an error there leaves the key without its expiry)
				e = res[k-1].Error()
			}
		case rueidis.IsRedisNil(e):
			count, e = 0, nil
		}
		if e == nil && count < 0 {
			e = fmt.Errorf("the count's key holds %d", count)
		}
		if e != nil {
			if err == nil {
				err = &store.HitError{Index: i, Err: e}
			}
			before[i], fits = 0, false
			continue
		}
		// (a reference pod's INCRBY counts on past the limit; the bound of
		// a count here, as window.lua clamps it)
		b := uint64(min(count, math.MaxUint32-1))
		before[i] = b
		if b > h.limit || h.cost > h.limit-b {
			fits = false
		}
	}
	return fits && err == nil, err
}

// runIncr runs a batch of hits on the reference's counters (incrBatch),
// through s.incr, which sends concurrent requests' commands in one
// pipeline: for each hit INCRBY its cost and PEXPIRE its key (the
// reference's expiry, drawn per write), or a GET for a check (cost 0) and
// for every hit of a request one of whose costs is past its limit. The
// request commits if every count before its INCRBY leaves room for the
// cost. Otherwise the combiner gives the increments back (settleIncr)
// before the request returns, so that Redis ends holding what was granted
// only, as with window.lua, also for a request that gave up waiting.
// Between the two round trips a concurrent request may see the counts
// raised, and be denied where the room left would have let it through: a
// transient over-deny (the reference keeps such increments), never an
// over-grant, since a take commits only if the count its own INCRBY
// returned is within the limit.
func (s *Store) runIncr(ctx context.Context, deadline time.Time, c *call, hits []store.Hit, now int64) (r reply, abandoned bool, err error) {
	n := len(hits)
	c.incr = slices.Grow(c.incr[:0], n)[:n]
	for i := range hits {
		c.incr[i] = incrHit{cost: hits[i].Cost, limit: hits[i].Rule.Limit()}
	}
	look := incrLook(c.incr)
	cl := s.client() // not nil: the breaker stays open until connected
	cmds := c.cmds[:0]
	ttl, ms := int64(-1), "" // (the last expiry, in seconds, and in ms as sent: hits mostly share it)
	for i := range hits {
		h := &hits[i]
		if look || h.Cost == 0 {
			cmds = append(cmds, cl.B().Get().Key(c.keys[i]).Build())
			continue
		}
		if t := s.plain.TTL(h.Rule); t != ttl {
			ttl, ms = t, strconv.FormatInt(t*1000, 10)
		}
		cmds = append(cmds, cl.B().Incrby().Key(c.keys[i]).Increment(int64(h.Cost)).Build(),
			cl.B().Arbitrary("PEXPIRE").Keys(c.keys[i]).Args(ms).Build())
	}
	c.counts = slices.Grow(c.counts[:0], n)[:n]
	c.job.keys, c.job.cmds, c.job.incr, c.job.counts, c.job.deadline, c.job.late = c.keys, cmds, c.incr, c.counts, deadline, false
	if abandoned, err = s.incr.do(ctx, &c.job); abandoned {
		return reply{}, true, err // (c is the job's still)
	}
	res := c.job.out
	c.job.cmds, c.job.out = nil, nil // (not kept in the pool)
	if err != nil || !written(res) {
		c.cmds = nil // (rueidis may still hold them)
	} else {
		clear(cmds)
		c.cmds = cmds[:0]
	}
	if err != nil {
		return reply{}, false, err
	}
	fits, bad := c.job.fits, c.job.bad
	c.job.bad = nil
	if bad != nil {
		return reply{}, false, fmt.Errorf("redis: %w", bad)
	}
	c.orig, c.fin = slices.Grow(c.orig[:0], n)[:n], slices.Grow(c.fin[:0], n)[:n]
	for i := range hits {
		// The states read and written, as far as they matter: an older
		// window is no window.
		end, o := windowEnd(hits[i].Rule, now), store.State{}
		if c.counts[i] > 0 {
			o.Word = end<<32 | c.counts[i]
		}
		c.orig[i], c.fin[i] = o, o
		if fits && hits[i].Cost > 0 {
			c.fin[i].Word = end<<32 | (c.counts[i] + hits[i].Cost)
		}
	}
	return reply{committed: fits, orig: c.orig, final: c.fin}, false, nil
}

// written reports whether rueidis is done with the commands whose results
// are res: after an error that is not Redis's (a connection broken) its
// writer may still hold them.
func written(res []rueidis.RedisResult) bool {
	for i := range res {
		if res[i].NonRedisError() != nil {
			return false
		}
	}
	return true
}

// plainRefundEnd is take.lua's refund field for a key in the reference's
// layout of a narrow rule (see refundEnd).
var plainRefundEnd = "p" + strconv.FormatUint(store.MaxFixedWindowLimit+1, 10)

// settleIncr gives back, once a combined call's replies res are in, the
// increments of each of jobs whose request does not fit (or whose reply
// holds an error), through take.lua's refunds, in one call (on Cluster one
// per hash slot): a count goes down by the cost, never below 0, and a key
// that expired meanwhile stays gone (a DECRBY would leave a negative
// count), waiting for Redis as long as a take does (Options.Timeout). It
// leaves each job's reading of its replies in the job (fits, bad and
// counts, for its Take), and reads jobs' keys and hits only: their Takes
// keep them until their job is done, or for good if they gave up waiting.
// A refund that fails is counted in Stats.
func (s *Store) settleIncr(ctx context.Context, jobs []*job, res []rueidis.RedisResult) {
	var keys []string
	var took []bool
	args := []string{"r"}
	for _, j := range jobs {
		m := incrCommands(j.incr)
		took = slices.Grow(took[:0], len(j.incr))[:len(j.incr)]
		clear(took)
		j.fits, j.bad = readIncr(res[:m], j.incr, j.counts, took)
		res = res[m:]
		if j.fits {
			continue
		}
		for i, t := range took {
			if t {
				keys = append(keys, j.keys[i])
				args = append(args, strconv.FormatUint(j.incr[i].cost, 10), plainRefundEnd)
			}
		}
	}
	if len(keys) == 0 {
		return
	}
	// As long as a take may wait for Redis: those still waiting wait
	// for it until their own deadline, and one that fails leaves the
	// count raised until its window ends.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opt.Timeout)
	defer cancel()
	for len(keys) > 0 {
		// (take.lua's keys must share a slot on Cluster: those of the
		// first key's slot now, the rest after)
		sl := slot(keys[0])
		var these, rest []string
		theseArgs, restArgs := []string{"r"}, []string{"r"}
		if !s.cluster {
			these, theseArgs = keys, args
		} else {
			for i, k := range keys {
				a := args[1+2*i : 3+2*i]
				if slot(k) == sl {
					these, theseArgs = append(these, k), append(theseArgs, a...)
				} else {
					rest, restArgs = append(rest, k), append(restArgs, a...)
				}
			}
		}
		if res, err := s.eval(ctx, takeScript, these, theseArgs); err != nil || res.Error() != nil {
			s.refundFailures.Add(1)
		}
		keys, args = rest, restArgs
	}
}
