package redis

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// A combiner runs the window.lua requests of concurrent Takes together:
// while a script call is in flight, Takes queue, and the next call carries
// every queued request. Redis then parses, dispatches and answers one
// command for many requests, and this process encodes, writes, reads and
// decodes one. A lone Take sends its call itself at once. A second call
// starts while one is in flight only when a full batch (maxBatchKeys) is
// waiting, so that a burst does not wait for a call per batch.
//
// An incr combiner does the same for runIncr's commands: the next round
// trip carries the commands of every queued request in one pipeline,
// which Redis reads, runs and answers in one pass of its event loop
// (rueidis's auto-pipelining alone wrote two requests' commands a write,
// and Redis spent more on each read and write than on the commands).
type combiner struct {
	s      *Store
	incr   bool
	mu     sync.Mutex
	queue  []*job
	queued int // keys of the jobs in queue (abandoned ones too, until take drops them)
	busy   int // calls in flight or being sent
}

// maxSenders bounds the window.lua calls in flight; maxBatchKeys the keys
// of one (a request with more goes alone). One call in flight, and not
// two, measured +5 % requests/s for four descriptors at concurrency 50 on
// the load benchmark: ~15 requests share a call instead of ~9.
const (
	maxSenders   = 2
	maxBatchKeys = 256
)

// job is one Take's window.lua request, or its runIncr commands.
type job struct {
	keys, args []string            // args start with len(keys) (see window.lua)
	cmds       []rueidis.Completed // runIncr's, for its hits incr on keys
	incr       []incrHit
	counts     []uint64               // settleIncr's reading of out: each hit's count before the request,
	fits       bool                   // whether the request fits,
	bad        error                  // and the first error a reply holds
	deadline   time.Time              // of the Take
	res        []rueidis.RedisMessage // its part of the reply: 1+len(keys) values
	out        []rueidis.RedisResult  // or of runIncr's: one per command
	err        error
	late       bool          // err is the call's end while Redis may still run it, and its results be read (runIncr's)
	done       chan struct{} // signalled once res or err is set, if queued
	timer      *time.Timer   // fires at deadline while queued or in flight
	state      atomic.Int32  // jobQueued, then jobTaken or jobAbandoned
}

const (
	jobQueued int32 = iota
	jobTaken
	jobAbandoned
)

// do runs j and leaves its part of the reply in j.res or j.out. If ctx
// ends or j.deadline passes while j is queued or in flight, do returns at
// once, abandoned: the caller must not reuse j (nor, for runIncr's, its
// keys and hits: settleIncr may still read them). A job abandoned before a
// call took it is not sent.
func (cb *combiner) do(ctx context.Context, j *job) (abandoned bool, err error) {
	cb.mu.Lock()
	if cb.busy == 0 {
		// Nothing is queued (the queue is taken while a call is busy).
		cb.busy++
		cb.mu.Unlock()
		defer cb.release() // (also if a panic is recovered above)
		ctx, cancel := context.WithDeadline(ctx, j.deadline)
		defer cancel()
		one := [1]*job{j}
		cb.send(ctx, one[:], nil)
		return j.late, j.err
	}
	j.state.Store(jobQueued)
	cb.queue = append(cb.queue, j)
	cb.queued += len(j.keys)
	extra := cb.queued >= maxBatchKeys && cb.busy < maxSenders
	if extra {
		cb.busy++
	}
	cb.mu.Unlock()
	if extra {
		go cb.flush()
	}
	if j.timer == nil {
		j.timer = time.NewTimer(time.Until(j.deadline))
	} else {
		j.timer.Reset(time.Until(j.deadline))
	}
	select {
	case <-j.done:
		j.timer.Stop()
		return j.late, j.err
	case <-j.timer.C:
		err = context.DeadlineExceeded
	case <-ctx.Done():
		j.timer.Stop()
		err = ctx.Err()
	}
	j.state.CompareAndSwap(jobQueued, jobAbandoned)
	return true, fmt.Errorf("redis: %w", err)
}

// release ends a sender's call: if requests queued meanwhile, a flusher
// takes over its place in flight, so that its caller returns now; else
// the combiner is idle (a lone request's call costs no goroutine).
func (cb *combiner) release() {
	cb.mu.Lock()
	if len(cb.queue) == 0 {
		cb.busy--
		cb.mu.Unlock()
		return
	}
	cb.mu.Unlock()
	go cb.flush()
}

// flush sends queued requests until none is left. When none is, it first
// lets the goroutines ready to run run (requests on their way to the store,
// under load) and looks again: a request that finds no call in flight
// sends alone and those behind it wait for its call (under load at
// concurrency 50, a third of the calls carried one request without the
// yield, a quarter with it). An idle process yields at once.
func (cb *combiner) flush() {
	var batch []*job
	var sc sendScratch
	for yielded := false; ; {
		cb.mu.Lock()
		if len(cb.queue) == 0 {
			if yielded {
				cb.busy--
				cb.mu.Unlock()
				return
			}
			cb.mu.Unlock()
			yielded = true
			runtime.Gosched()
			continue
		}
		yielded = false
		batch = cb.take(batch[:0])
		cb.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		// Each job leaves at its own deadline; the call ends at the last
		// one, so that a job that queued long does not fail the others.
		deadline := batch[0].deadline
		for _, j := range batch[1:] {
			if j.deadline.After(deadline) {
				deadline = j.deadline
			}
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		cb.send(ctx, batch, &sc)
		cancel()
		for _, j := range batch {
			j.done <- struct{}{}
		}
		clear(batch)
	}
}

// take moves queued requests into batch, up to maxBatchKeys keys (at least
// one request if any), and drops those abandoned. cb.mu is held.
func (cb *combiner) take(batch []*job) []*job {
	keys, n := 0, 0
	for _, j := range cb.queue {
		if len(batch) > 0 && keys+len(j.keys) > maxBatchKeys {
			break
		}
		n++
		cb.queued -= len(j.keys)
		if j.state.CompareAndSwap(jobQueued, jobTaken) {
			batch = append(batch, j)
			keys += len(j.keys)
		}
	}
	rest := copy(cb.queue, cb.queue[n:])
	clear(cb.queue[rest:])
	cb.queue = cb.queue[:rest]
	return batch
}

// sendScratch holds a flusher's keys and arguments of a combined call
// between calls: the command copies them, so they are free again once the
// call returns. rueidis holds cmds until it has written them: they are
// dropped when a call ends early.
type sendScratch struct {
	keys, args []string
	cmds       []rueidis.Completed
}

// send runs batch as one window.lua call, or as one pipeline of runIncr's
// commands, and hands each job its part. A batch of more than one job
// needs sc.
func (cb *combiner) send(ctx context.Context, batch []*job, sc *sendScratch) {
	if cb.incr {
		cb.sendIncr(ctx, batch, sc)
		return
	}
	keys, args := batch[0].keys, batch[0].args
	if len(batch) > 1 {
		keys, args = sc.keys[:0], sc.args[:0]
		for _, j := range batch {
			keys = append(keys, j.keys...)
			args = append(args, j.args...)
		}
	}
	n := len(keys)
	res, err := cb.s.eval(ctx, windowScript, keys, args)
	var a []rueidis.RedisMessage
	if err == nil {
		a, err = res.ToArray()
	}
	if len(batch) > 1 {
		// (cleared, so that no job's strings stay reachable from sc)
		clear(keys)
		clear(args)
		sc.keys, sc.args = keys[:0], args[:0]
	}
	if err == nil && len(a) != len(batch)+n {
		err = fmt.Errorf("window script answered %d values for %d requests of %d keys", len(a), len(batch), n)
	}
	if err != nil {
		err = fmt.Errorf("redis: %w", err)
		for _, j := range batch {
			j.res, j.err = nil, err
		}
		return
	}
	for _, j := range batch {
		m := 1 + len(j.keys)
		j.res, j.err, a = a[:m:m], nil, a[m:]
	}
}

// sendIncr runs batch's commands in one pipeline, and gives back the
// increments of the requests that do not fit (settleIncr) before it hands
// each job its part. Were the call to end before Redis answers, the
// settling still happens once it does, and the jobs are late.
func (cb *combiner) sendIncr(ctx context.Context, batch []*job, sc *sendScratch) {
	cmds := batch[0].cmds
	if len(batch) > 1 {
		cmds = sc.cmds[:0]
		for _, j := range batch {
			cmds = append(cmds, j.cmds...)
		}
	}
	jobs := slices.Clone(batch) // (the flusher reuses batch)
	s := cb.s
	cl := s.client() // not nil: the breaker stays open until connected
	res, err := bounded(ctx, func() []rueidis.RedisResult {
		// (not cut at ctx's end: an INCRBY sent must be read, to be given
		// back if its request does not fit; rueidis ends a call on a
		// connection that stops answering, after Options.Timeout or a
		// second)
		res := cl.DoMulti(context.WithoutCancel(ctx), cmds...)
		if len(res) == len(cmds) {
			s.settleIncr(ctx, jobs, res)
		}
		return res
	})
	if len(batch) > 1 {
		if err != nil || !written(res) {
			sc.cmds = nil // (rueidis may still hold them)
		} else {
			clear(cmds)
			sc.cmds = cmds[:0]
		}
	}
	late := err != nil // (bounded's: rueidis may still run the call)
	if err == nil && len(res) != len(cmds) {
		err = fmt.Errorf("redis: %d replies to %d commands", len(res), len(cmds))
	}
	for _, j := range batch {
		if err != nil {
			j.out, j.err, j.late = nil, err, late
			continue
		}
		m := len(j.cmds)
		j.out, j.err, res = res[:m:m], nil, res[m:]
	}
}
