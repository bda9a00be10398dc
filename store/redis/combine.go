package redis

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// A combiner runs the window.lua requests of concurrent Takes together:
// while maxSenders script calls are in flight, Takes queue, and the next
// call carries every queued request. Redis then parses, dispatches and
// answers one command for many requests, and this process encodes, writes,
// reads and decodes one. A lone Take sends its call itself at once.
type combiner struct {
	s     *Store
	mu    sync.Mutex
	queue []*job
	busy  int // calls in flight or being sent
}

// maxSenders bounds the window.lua calls in flight; maxBatchKeys the keys
// of one (a request with more goes alone).
const (
	maxSenders   = 2
	maxBatchKeys = 256
)

// job is one Take's window.lua request.
type job struct {
	keys, args []string               // args start with len(keys) (see window.lua)
	deadline   time.Time              // of the Take
	res        []rueidis.RedisMessage // its part of the reply: 1+2*len(keys) values
	err        error
	done       chan struct{} // signalled once res or err is set, if queued
}

// do runs j by j.deadline and returns its part of the reply. If ctx ends
// while j is queued or in flight, do returns at once, abandoned: the caller
// must not reuse j. A queued job needs no timer of its own: the call that
// carries it ends by the earliest deadline of its jobs, and the calls before
// it by theirs, which are earlier.
func (cb *combiner) do(ctx context.Context, j *job) (res []rueidis.RedisMessage, abandoned bool, err error) {
	cb.mu.Lock()
	if cb.busy < maxSenders {
		// Nothing is queued (the queue is taken while busy is at max).
		cb.busy++
		cb.mu.Unlock()
		ctx, cancel := context.WithDeadline(ctx, j.deadline)
		one := [1]*job{j}
		cb.send(ctx, one[:])
		cancel()
		cb.release()
		return j.res, false, j.err
	}
	cb.queue = append(cb.queue, j)
	cb.mu.Unlock()
	select {
	case <-j.done:
		return j.res, false, j.err
	case <-ctx.Done():
		return nil, true, fmt.Errorf("redis: %w", ctx.Err())
	}
}

// release ends a sender's call: if requests queued meanwhile, a flusher
// takes over its place in flight, so that its caller returns now.
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

// flush sends queued requests until none is left.
func (cb *combiner) flush() {
	var batch []*job
	for {
		cb.mu.Lock()
		if len(cb.queue) == 0 {
			cb.busy--
			cb.mu.Unlock()
			return
		}
		batch = cb.take(batch[:0])
		cb.mu.Unlock()
		deadline := batch[0].deadline
		for _, j := range batch[1:] {
			if j.deadline.Before(deadline) {
				deadline = j.deadline
			}
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		cb.send(ctx, batch)
		cancel()
		for _, j := range batch {
			j.done <- struct{}{}
		}
		clear(batch)
	}
}

// take moves queued requests into batch, up to maxBatchKeys keys (at least
// one request). cb.mu is held.
func (cb *combiner) take(batch []*job) []*job {
	keys, n := 0, 0
	for _, j := range cb.queue {
		if n > 0 && keys+len(j.keys) > maxBatchKeys {
			break
		}
		keys += len(j.keys)
		n++
	}
	batch = append(batch, cb.queue[:n]...)
	rest := copy(cb.queue, cb.queue[n:])
	clear(cb.queue[rest:])
	cb.queue = cb.queue[:rest]
	return batch
}

// send runs batch as one window.lua call and hands each job its part.
func (cb *combiner) send(ctx context.Context, batch []*job) {
	keys, args := batch[0].keys, batch[0].args
	if len(batch) > 1 {
		keys, args = nil, nil
		for _, j := range batch {
			keys = append(keys, j.keys...)
			args = append(args, j.args...)
		}
	}
	n := len(keys)
	a, err := cb.s.eval(ctx, windowScript, keys, args).ToArray()
	if err == nil && len(a) != len(batch)+2*n {
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
		m := 1 + 2*len(j.keys)
		j.res, j.err, a = a[:m:m], nil, a[m:]
	}
}

// counts are the decimal strings of small key counts.
var counts = func() (c [65]string) {
	for i := range c {
		c[i] = strconv.Itoa(i)
	}
	return c
}()

func count(n int) string {
	if n < len(counts) {
		return counts[n]
	}
	return strconv.Itoa(n)
}
