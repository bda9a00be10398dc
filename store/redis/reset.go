package redis

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/store"
)

var _ store.Resetter = (*Store)(nil)

// Reset deletes the keys of hits, per store.Resetter: each algorithm keeps
// a key's whole state in one Redis key (a fixed window's count, wide and
// calendar ones included; a sliding window's buckets; a token bucket's
// arrival time), so the next hit finds it fresh. It sends one DEL per key
// in one pipeline (on Cluster the keys may lie in different slots), and
// forgets the keys in this instance's local cache. Other instances' local
// caches may still deny a key they hold as over its limit until their
// entry lapses (see docs/REDIS.md).
func (s *Store) Reset(ctx context.Context, now int64, hits []store.Hit) error {
	if len(hits) == 0 {
		return nil
	}
	c := s.client()
	if c == nil {
		return errNotConnected
	}
	keys := make([]string, 0, len(hits))
	cmds := make(rueidis.Commands, 0, len(hits))
	for i := range hits {
		k := s.opt.KeyPrefix + hits[i].Key
		if hits[i].Plain {
			k = string(s.plain.Append(nil, hits[i].Key, hits[i].Rule, now))
		}
		keys = append(keys, k)
		cmds = append(cmds, c.B().Del().Key(k).Build())
	}
	var errs []error
	for i, res := range doMulti(ctx, c, cmds) {
		if err := res.Error(); err != nil {
			errs = append(errs, fmt.Errorf("redis: reset: %w", &store.HitError{Index: i, Err: err}))
		}
	}
	if s.cache != nil {
		for _, k := range keys {
			s.cache.m.Delete(k)
		}
	}
	return errors.Join(errs...)
}
