package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/quota"
)

// Demand shares the rate-limit-quota demand of a fleet of replicas through
// Redis (quota.Fleet). Each group (one limit's counter key) is one hash,
// <prefix>rlqs:<group>, with one field per replica holding the time it was
// written and the demands of that replica's proxies. One more hash,
// <prefix>rlqs-replicas, holds each live replica's last Exchange, so that
// a replica knows how many others may share a limit it has just seen.
// Every command names one key, so the layout works on Redis Cluster. Safe
// for concurrent use.
type Demand struct {
	s       *Store
	replica string
	stale   time.Duration

	mu        sync.Mutex
	published map[string]struct{} // groups written by the last Exchange
	gone      []string            // replicas long dead, deleted at the next Exchange
}

// goneAfter is how many stale periods a replica's membership may be old
// before an Exchange deletes it (long after it stopped counting, so that a
// replica restarted under the same name is not deleted as it comes back).
const goneAfter = 10

// Demand returns the demand exchange of replica (a name unique in the
// fleet). A replica's entries older than stale are ignored, and a hash no
// replica has written for stale expires.
func (s *Store) Demand(replica string, stale time.Duration) *Demand {
	return &Demand{s: s, replica: replica, stale: stale, published: map[string]struct{}{}}
}

func (d *Demand) key(group string) string { return d.s.opt.KeyPrefix + "rlqs:" + group }

func (d *Demand) membersKey() string { return d.s.opt.KeyPrefix + "rlqs-replicas" }

// Exchange writes this replica's demand for each group in local and its
// membership, deletes its entries of groups it no longer has, and returns
// the other replicas' fresh demands of the groups in local and the number
// of live replicas, in one pipelined round trip (one per node on Cluster).
func (d *Demand) Exchange(ctx context.Context, now time.Time, local map[string][]float64) (quota.Remote, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.s.client
	groups := make([]string, 0, len(local))
	cmds := make(rueidis.Commands, 0, 3*len(local)+len(d.published)+4)
	ttl := strconv.FormatInt(max(d.stale.Milliseconds(), 1), 10)
	mk := d.membersKey()
	cmds = append(cmds,
		c.B().Hset().Key(mk).FieldValue().FieldValue(d.replica, strconv.FormatInt(now.UnixMilli(), 10)).Build(),
		c.B().Arbitrary("PEXPIRE").Keys(mk).Args(strconv.FormatInt(max(goneAfter*d.stale.Milliseconds(), 1), 10)).Build(),
		c.B().Hgetall().Key(mk).Build())
	if len(d.gone) > 0 {
		cmds = append(cmds, c.B().Hdel().Key(mk).Field(d.gone...).Build())
		d.gone = nil
	}
	first := len(cmds)
	for g, ds := range local {
		k := d.key(g)
		groups = append(groups, g)
		cmds = append(cmds,
			c.B().Hset().Key(k).FieldValue().FieldValue(d.replica, encodeDemand(now, ds)).Build(),
			c.B().Arbitrary("PEXPIRE").Keys(k).Args(ttl).Build(),
			c.B().Hgetall().Key(k).Build())
	}
	for g := range d.published {
		if _, ok := local[g]; !ok {
			cmds = append(cmds, c.B().Hdel().Key(d.key(g)).Field(d.replica).Build())
		}
	}
	res := c.DoMulti(ctx, cmds...)
	d.published = make(map[string]struct{}, len(local))
	for _, g := range groups {
		d.published[g] = struct{}{}
	}
	remote := quota.Remote{Demands: map[string][]float64{}}
	var errs []error
	if m, err := res[2].AsStrMap(); err != nil {
		errs = append(errs, fmt.Errorf("redis: rlqs replicas: %w", err))
	} else {
		for replica, v := range m {
			ms, err := strconv.ParseInt(v, 10, 64)
			switch {
			case err != nil || now.Sub(time.UnixMilli(ms)) > goneAfter*d.stale:
				d.gone = append(d.gone, replica)
			case now.Sub(time.UnixMilli(ms)) <= d.stale:
				remote.Live++
			}
		}
	}
	for i, g := range groups {
		m, err := res[first+3*i+2].AsStrMap()
		if err != nil {
			errs = append(errs, fmt.Errorf("redis: rlqs demand of %q: %w", g, err))
			continue
		}
		for replica, v := range m {
			if replica == d.replica {
				continue
			}
			at, ds, ok := decodeDemand(v)
			if !ok || now.Sub(at) > d.stale {
				continue
			}
			remote.Demands[g] = append(remote.Demands[g], ds...)
		}
	}
	for _, r := range res {
		if err := r.Error(); err != nil {
			errs = append(errs, err)
			break
		}
	}
	return remote, errors.Join(errs...)
}

// encodeDemand writes "<unix ms> <demand> <demand>...".
func encodeDemand(now time.Time, ds []float64) string {
	b := make([]byte, 0, 16+8*len(ds))
	b = strconv.AppendInt(b, now.UnixMilli(), 10)
	for _, v := range ds {
		b = append(b, ' ')
		b = strconv.AppendFloat(b, v, 'g', 6, 64)
	}
	return string(b)
}

func decodeDemand(v string) (time.Time, []float64, bool) {
	fs := strings.Fields(v)
	if len(fs) == 0 {
		return time.Time{}, nil, false
	}
	ms, err := strconv.ParseInt(fs[0], 10, 64)
	if err != nil {
		return time.Time{}, nil, false
	}
	ds := make([]float64, 0, len(fs)-1)
	for _, f := range fs[1:] {
		x, err := strconv.ParseFloat(f, 64)
		if err != nil || !(x >= 0) {
			return time.Time{}, nil, false
		}
		ds = append(ds, x)
	}
	return time.UnixMilli(ms), ds, true
}
