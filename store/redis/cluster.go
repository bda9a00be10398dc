package redis

import (
	"context"
	"errors"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/store"
)

// takeCluster runs one script per hash slot, in parallel. When a slot
// denies the batch (or fails), the slots that committed are refunded: until
// the refund lands a concurrent request may be denied for capacity this
// batch held briefly (an over-deny), never granted capacity it did not
// have. A refund that fails leaves the takes in place until the keys
// expire, also an over-deny; Stats counts them.
func (s *Store) takeCluster(ctx context.Context, now int64, hits []store.Hit, keys []string) (reply, error) {
	bs := s.bySlot(now, hits, keys)
	if len(bs) == 1 {
		return s.run(ctx, hits, bs[0])
	}
	whole, replies, err := s.runSlots(ctx, hits, bs)
	if !whole.committed {
		for j, b := range bs {
			if replies[j].committed {
				s.refund(ctx, now, hits, b, replies[j])
			}
		}
	}
	return whole, err
}

// bySlot splits hits into one batch per hash slot of their keys, in the
// order the slots first appear, each with take.lua's arguments at now.
func (s *Store) bySlot(now int64, hits []store.Hit, keys []string) []batch {
	var bs []batch
	var slots []uint16
	for i := range hits {
		sl := slot(keys[i])
		j := 0
		for j < len(slots) && slots[j] != sl {
			j++
		}
		if j == len(slots) {
			slots = append(slots, sl)
			bs = append(bs, batch{})
		}
		bs[j].idx = append(bs[j].idx, i)
		bs[j].keys = append(bs[j].keys, keys[i])
	}
	for j := range bs {
		bs[j].args = s.args(hits, bs[j].idx, now)
	}
	return bs
}

// runSlots runs the batches of bs in one pipeline (a slot that lacks the
// script runs it again with its source) and returns the whole request's
// reply, committed only if every slot committed, and each slot's reply
// (the zero reply for one that failed). The error joins the slots'.
func (s *Store) runSlots(ctx context.Context, hits []store.Hit, bs []batch) (reply, []reply, error) {
	c := s.client() // not nil: the breaker stays open until connected
	cmds := make(rueidis.Commands, len(bs))
	for j, b := range bs {
		cmds[j] = c.B().Evalsha().Sha1(takeScript.sha).Numkeys(int64(len(b.keys))).Key(b.keys...).Arg(b.args...).Build()
	}
	res, err := bounded(ctx, func() []rueidis.RedisResult { return c.DoMulti(ctx, cmds...) })
	if err != nil {
		// Out of time with no reply: a slot that commits later keeps its
		// takes until its keys expire (an over-deny, as a failed refund).
		return reply{}, make([]reply, len(bs)), err
	}
	n := len(hits)
	whole := reply{committed: true, orig: make([]store.State, n), final: make([]store.State, n)}
	if s.opt.ServerClock {
		whole.now = make([]int64, n)
	}
	replies := make([]reply, len(bs))
	var errs []error
	for j, b := range bs {
		if e, ok := rueidis.IsRedisErr(res[j].Error()); ok && e.IsNoScript() {
			cmd := c.B().Eval().Script(takeScript.src).Numkeys(int64(len(b.keys))).Key(b.keys...).Arg(b.args...).Build()
			var err error
			if res[j], err = bounded(ctx, func() rueidis.RedisResult { return c.Do(ctx, cmd) }); err != nil {
				errs = append(errs, err)
				whole.committed = false
				continue
			}
		}
		r, err := parseReply(res[j], hits, b.idx)
		if err != nil {
			errs = append(errs, err)
			whole.committed = false
			continue
		}
		replies[j] = r
		whole.committed = whole.committed && r.committed
		for k, i := range b.idx {
			whole.orig[i], whole.final[i] = r.orig[k], r.final[k]
			if r.now != nil {
				whole.now[i] = r.now[k]
			}
		}
	}
	return whole, replies, errors.Join(errs...)
}

// refund gives back what b, a slot that committed (its reply r) in a
// request another slot denied, took: the takes its own replay allowed. A
// refund that fails is counted in Stats.
func (s *Store) refund(ctx context.Context, now int64, hits []store.Hit, b batch, r reply) {
	sub := make([]store.Hit, len(b.idx))
	for k, i := range b.idx {
		sub[k] = hits[i]
	}
	out := make([]store.Decision, len(sub))
	s.decide(new(scratch), now, r.now, sub, b.keys, r.orig, out)
	owed := s.owed(now, r, sub, b.keys, out)
	var keys []string
	args := []string{"r"}
	for k := range sub {
		h := &sub[k]
		if !out[k].Allowed || h.Always() || h.Cost == 0 {
			continue
		}
		keys = append(keys, b.keys[k])
		args = append(args, refundAmount(h, owed[k]), refundEnd(h, r.final[k]))
	}
	if len(keys) == 0 {
		return
	}
	// The refund outlives its caller's deadline, not by much: the caller
	// is waiting for it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(s.opt.Timeout, s.opt.RefundTimeout))
	defer cancel()
	if res, err := s.eval(ctx, takeScript, keys, args); err != nil || res.Error() != nil {
		s.refundFailures.Add(1)
	}
}

// refundAmount is what take.lua gives back for h, an allowed take: its
// cost, or for a token bucket the quanta it still owes (see owed).
func refundAmount(h *store.Hit, owed uint64) string {
	if h.Rule.Algorithm() == store.TokenBucket {
		return strconv.FormatUint(owed, 10)
	}
	return strconv.FormatUint(h.Cost, 10)
}

// refundEnd tells take.lua where h's take counted, from final, the state
// of h's key after the batch: nothing for a token bucket; for a sliding
// window the bucket the take counted in (every take of a batch has its
// now), its count's width and the buckets per window; for a fixed window
// the take's window and, if a count there can be saturated past the limit
// (and so no longer exact), the bound where it is.
func refundEnd(h *store.Hit, final store.State) string {
	switch h.Rule.Algorithm() {
	case store.TokenBucket:
		return ""
	case store.SlidingWindow:
		g, _, bits := h.Rule.Buckets()
		return "s" + strconv.FormatUint(final.Word>>32, 10) + ":" + strconv.FormatUint(bits, 10) + ":" + strconv.FormatUint(g, 10)
	}
	end := strconv.FormatUint(final.Word>>32, 10) + ":"
	if h.Plain {
		end = "p"
	}
	if b := windowBound(h.Rule); b > h.Rule.Limit() {
		end += strconv.FormatUint(b, 10)
	}
	return end
}

// owed returns, for each refundable token-bucket take of a committed slot,
// the quanta it still owes at the time of the refund (store.Refund's rule):
// the part of its key's debt that lies after that time, handed out from the
// key's last take back, so that a key taken twice owes at most its
// debt in all.
func (s *Store) owed(now int64, r reply, sub []store.Hit, keys []string, out []store.Decision) []uint64 {
	at := now
	if s.opt.Clock != nil {
		at = max(at, s.opt.Clock.Now())
	}
	owed := make([]uint64, len(sub))
	state := map[string]store.State{}
	for k := len(sub) - 1; k >= 0; k-- {
		h := &sub[k]
		if h.Rule.Algorithm() != store.TokenBucket || !out[k].Allowed || h.Always() || h.Cost == 0 {
			continue
		}
		v, seen := state[keys[k]]
		if !seen {
			v = r.final[k]
		}
		t := at
		if r.now != nil {
			t = r.now[k] // Redis TIME of the take
		}
		n := store.Rollback(v, v, h.Rule, t, h.Cost)
		owed[k], state[keys[k]] = v.Word-n.Word, n
	}
	return owed
}
