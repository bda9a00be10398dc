package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/store"
)

//go:embed demand.lua
var demandLua string

var demandScript = newScript(demandLua)

// Demand shares the rate-limit-quota demand of a fleet of replicas through
// Redis (quota.Fleet). Each group (one limit's counter key) is one hash,
// <prefix>rlqs:<group>, with one field per replica holding the time it was
// written, the part of the limit the replica holds and the demands of its
// proxies (equal ones once, with their count); demand.lua claims a
// replica's part atomically. One more hash, <prefix>rlqs-replicas, holds
// each live replica's last Exchange. Every command names one key, so the
// layout works on Redis Cluster, and each group's claim stands alone: a
// failed one (a key of the wrong type, a shard down) costs only its group.
// Safe for concurrent use.
type Demand struct {
	s       *Store
	replica string
	stale   time.Duration

	mu   sync.Mutex
	gone []string // replicas long dead, deleted at the next Exchange
}

// goneAfter is how many stale periods a replica's membership may be old
// before an Exchange deletes it (long after it stopped counting, so that a
// replica restarted under the same name is not deleted as it comes back).
const goneAfter = 10

// Demand returns the demand exchange of replica (a name unique in the
// fleet). A replica's entries older than stale are ignored, and a hash no
// replica has written for stale expires.
func (s *Store) Demand(replica string, stale time.Duration) *Demand {
	return &Demand{s: s, replica: replica, stale: stale}
}

func (d *Demand) key(group string) string { return d.s.opt.KeyPrefix + "rlqs:" + group }

func (d *Demand) membersKey() string { return d.s.opt.KeyPrefix + "rlqs-replicas" }

// Exchange records this replica's membership, deletes its entries of the
// groups in release, claims its part of each group in local, and returns
// the parts granted and the number of live replicas, in one pipelined
// round trip (one per node on Cluster; one more for the claims that found
// the script not loaded, after a Redis restart). A group
// whose claim failed has no part in the result, and the error names it;
// the others are granted all the same. Live is 0 when the membership could
// not be read.
func (d *Demand) Exchange(ctx context.Context, now time.Time, local map[string]store.Claim, release []string) (store.Grants, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.s.client()
	if c == nil {
		return store.Grants{}, errNotConnected
	}
	ms := strconv.FormatInt(now.UnixMilli(), 10)
	stale := strconv.FormatInt(max(d.stale.Milliseconds(), 1), 10)
	mk := d.membersKey()
	cmds := make(rueidis.Commands, 0, len(local)+len(release)+4)
	cmds = append(cmds,
		c.B().Hset().Key(mk).FieldValue().FieldValue(d.replica, ms).Build(),
		c.B().Arbitrary("PEXPIRE").Keys(mk).Args(strconv.FormatInt(max(goneAfter*d.stale.Milliseconds(), 1), 10)).Build(),
		c.B().Hgetall().Key(mk).Build())
	if len(d.gone) > 0 {
		cmds = append(cmds, c.B().Hdel().Key(mk).Field(d.gone...).Build())
		d.gone = nil
	}
	// Given back before the claims, in case a group is in both.
	for _, g := range release {
		cmds = append(cmds, c.B().Hdel().Key(d.key(g)).Field(d.replica).Build())
	}
	first := len(cmds)
	groups := make([]string, 0, len(local))
	args := make([][]string, 0, len(local))
	for g, cl := range local {
		a := make([]string, 0, 5+len(cl.Demands))
		a = append(a, d.replica, ms, stale, formatCapacity(cl.Capacity), formatCapacity(min(cl.Max, cl.Capacity)))
		a = appendDemands(a, cl.Demands, cl.Capacity)
		groups = append(groups, g)
		args = append(args, a)
		cmds = append(cmds, c.B().Evalsha().Sha1(demandScript.sha).Numkeys(1).Key(d.key(g)).Arg(a...).Build())
	}
	res := d.do(ctx, cmds)
	claims := d.loadAndRetry(ctx, res[first:], groups, args)
	grants := store.Grants{Granted: make(map[string]float64, len(groups))}
	var errs []error
	if m, err := res[2].AsStrMap(); err != nil {
		errs = append(errs, fmt.Errorf("redis: rlqs replicas: %w", err))
	} else {
		grants.Live = d.live(now, m)
	}
	var failed int
	var firstErr error
	for i, g := range groups {
		v, err := claims[i].ToString()
		if err == nil {
			grants.Granted[g], err = strconv.ParseFloat(v, 64)
		}
		if err != nil {
			delete(grants.Granted, g)
			if failed++; firstErr == nil {
				firstErr = fmt.Errorf("redis: rlqs claim of %q: %w", g, err)
			}
		}
	}
	if failed > 1 {
		errs = append(errs, fmt.Errorf("%w (and %d more claims failed)", firstErr, failed-1))
	} else if firstErr != nil {
		errs = append(errs, firstErr)
	}
	for i, r := range res[:first] {
		if err := r.Error(); err != nil && i != 2 {
			errs = append(errs, fmt.Errorf("redis: rlqs membership or release: %w", err))
			break
		}
	}
	return grants, errors.Join(errs...)
}

// loadAndRetry runs again the claims of res that found demand.lua not
// loaded (after a Redis restart) and returns every claim's result. Each
// round sends the first of them with EVAL, which loads the script, and the
// others with EVALSHA behind it in one pipeline: on a single Redis one
// round does, on Cluster one per node that lacked the script (each round
// ends the EVAL'd claim's NOSCRIPT). EVAL for every claim would send the
// script's source a thousand times.
func (d *Demand) loadAndRetry(ctx context.Context, res []rueidis.RedisResult, groups []string, args [][]string) []rueidis.RedisResult {
	c := d.s.client()
	noScript := func(r rueidis.RedisResult) bool {
		e, ok := rueidis.IsRedisErr(r.Error())
		return ok && e.IsNoScript()
	}
	for {
		var idx []int
		var cmds rueidis.Commands
		for i, r := range res {
			if !noScript(r) {
				continue
			}
			k := d.key(groups[i])
			if len(idx) == 0 {
				cmds = append(cmds, c.B().Eval().Script(demandScript.src).Numkeys(1).Key(k).Arg(args[i]...).Build())
			} else {
				cmds = append(cmds, c.B().Evalsha().Sha1(demandScript.sha).Numkeys(1).Key(k).Arg(args[i]...).Build())
			}
			idx = append(idx, i)
		}
		if len(idx) == 0 {
			return res
		}
		for j, r := range d.do(ctx, cmds) {
			res[idx[j]] = r
		}
	}
}

// do pipelines cmds, by ctx's end (see doMulti). Redis answering counts
// as a success for the store's circuit breaker, as its own calls do: a
// health probe that waited behind the exchange's commands does not open
// it.
func (d *Demand) do(ctx context.Context, cmds rueidis.Commands) []rueidis.RedisResult {
	res := doMulti(ctx, d.s.client(), cmds)
	for _, r := range res {
		if _, answered := rueidis.IsRedisErr(r.Error()); answered || r.Error() == nil {
			d.s.breaker.success()
			break
		}
	}
	return res
}

// live counts the replicas of members (replica → unix ms of its last
// Exchange) seen within stale, and marks those gone for goneAfter stale
// periods for deletion.
func (d *Demand) live(now time.Time, members map[string]string) int {
	n := 0
	for replica, v := range members {
		at, err := strconv.ParseInt(v, 10, 64)
		switch {
		case err != nil || now.Sub(time.UnixMilli(at)) > goneAfter*d.stale:
			d.gone = append(d.gone, replica)
		case now.Sub(time.UnixMilli(at)) <= d.stale:
			n++
		}
	}
	return n
}

// appendDemands appends the demands ds of a replica's proxies for
// demand.lua: each of a demand's lowest, mean and peak rounded to 3
// significant digits (a share moves by less than 0.5 %; an infinite one,
// a proxy not measured yet, is the capacity), "<low>/<mean>/<peak>" or
// one value when all three are equal, and equal demands once, with
// their count ("<demand>*<count>"), so that a claim costs Redis the
// distinct demands, a few dozen, not the proxies.
func appendDemands(a []string, ds []store.Demand, capacity float64) []string {
	counts := make(map[string]int, len(ds))
	round := func(v float64) string {
		switch {
		case math.IsInf(v, 1):
			v = capacity
		case !(v >= 0):
			v = 0
		}
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
	for _, d := range ds {
		lo, m, hi := round(d.Low), round(d.Mean), round(d.Peak)
		v := hi
		if lo != hi || m != hi {
			v = lo + "/" + m + "/" + hi
		}
		counts[v]++
	}
	for v, c := range counts {
		if c > 1 {
			v += "*" + strconv.Itoa(c)
		}
		a = append(a, v)
	}
	return a
}

// formatCapacity writes a capacity for demand.lua: a finite, non-negative
// number.
func formatCapacity(v float64) string {
	if !(v >= 0) || math.IsInf(v, 1) {
		v = 0
	}
	return strconv.FormatFloat(v, 'g', 10, 64)
}
