package quota

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/config"
)

// Usage is one bucket's report.
type Usage struct {
	Bucket  map[string]string
	Elapsed time.Duration
	Allowed uint64
	Denied  uint64
}

// Stream is one proxy's stream. Report and Close are called by the
// stream's receiver, Pending by its sender; both may run concurrently.
type Stream struct {
	s      *Service
	id     uint64 // in opening order
	domain string // from the first report; written with s.mu held
	subs   map[string]*sub
	out    []Action
	outIdx map[string]int // bucket key → index in out
	notify chan struct{}
	closed bool
}

// Open starts a stream. It counts against MaxStreams until Close, from
// before its first message: a stream that sends nothing holds a place
// too.
func (s *Service) Open() (*Stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.streams) >= s.o.MaxStreams {
		s.refuse(CapStreams)
		return nil, fmt.Errorf("%w: %d open, at most %d", ErrTooManyStreams, len(s.streams), s.o.MaxStreams)
	}
	s.nextID++
	st := &Stream{s: s, id: s.nextID, subs: map[string]*sub{}, outIdx: map[string]int{}, notify: make(chan struct{}, 1)}
	s.streams[st] = struct{}{}
	return st, nil
}

// Notify receives a value when Pending has actions to send.
func (st *Stream) Notify() <-chan struct{} { return st.notify }

// Pending takes the actions queued for the stream, oldest bucket first.
func (st *Stream) Pending() []Action {
	st.s.mu.Lock()
	defer st.s.mu.Unlock()
	out := st.out
	st.out = nil
	clear(st.outIdx)
	return out
}

// Buckets is the number of buckets the stream is subscribed to.
func (st *Stream) Buckets() int {
	st.s.mu.Lock()
	defer st.s.mu.Unlock()
	return len(st.subs)
}

// Close releases the stream's buckets; their share goes to the others at
// the next Tick.
func (st *Stream) Close() {
	s := st.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.closed {
		return
	}
	st.closed = true
	for _, b := range st.subs {
		s.unsubscribe(b)
	}
	st.subs = nil
	delete(s.streams, st)
}

// Report applies one message's usage reports at now. domain is the
// message's: the stream's first message names it, later ones repeat it or
// leave it empty. A new bucket subscribes the stream to it and is
// answered at once (see Pending), once a limits table is in force: before
// the first one no bucket is answered, so that Envoy applies its
// no_assignment_behavior. A malformed report changes nothing and returns
// an error wrapping ErrInvalid, one past a cap an error wrapping
// ErrExhausted; the stream should then end.
func (st *Stream) Report(now time.Time, domain string, usages []Usage) error {
	s := st.s
	s.reports.Add(1)
	if err := st.checkDomain(domain); err != nil {
		s.rejected.Add(1)
		return err
	}
	// The usages' canonical keys, end to end in one buffer: looking a
	// key up allocates nothing, only a new bucket copies its key.
	var arena []byte
	ends := make([]int, len(usages))
	for i := range usages {
		u := &usages[i]
		if kind, err := checkUsage(u); err != nil {
			if kind == ErrTooManyKeys {
				s.refuse(CapBucketKeys)
			} else {
				s.rejected.Add(1)
			}
			return fmt.Errorf("%w: bucket_quota_usages[%d]: %v", kind, i, err)
		}
		arena = appendBucketKey(arena, u.Bucket)
		ends[i] = len(arena)
	}
	key := func(i int) []byte {
		if i == 0 {
			return arena[:ends[0]]
		}
		return arena[ends[i-1]:ends[i]]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.closed {
		return nil
	}
	if err := st.admit(len(usages), key); err != nil {
		return err
	}
	st.domain = cmp.Or(st.domain, domain)
	s.usages.Add(uint64(len(usages)))
	t := s.current()
	for i := range usages {
		u := &usages[i]
		b := st.subs[string(key(i))]
		if b == nil {
			b = &sub{st: st, key: string(key(i)), busy: now}
			b.bucket = parseBucketKey(b.key, len(u.Bucket))
			st.subs[b.key] = b
			s.subscribe(t, b)
		}
		b.record(now, u)
		if !b.hasSent && t != nil {
			s.answerNew(now, b)
		}
	}
	return nil
}

// checkDomain checks a message's domain against the stream's.
func (st *Stream) checkDomain(domain string) error {
	switch {
	case st.domain == "" && domain == "":
		return fmt.Errorf("%w: the first message has no domain", ErrInvalid)
	case len(domain) > MaxValueBytes:
		return fmt.Errorf("%w: domain longer than %d bytes", ErrInvalid, MaxValueBytes)
	case st.domain != "" && domain != "" && domain != st.domain:
		return fmt.Errorf("%w: domain changed from %s to %s", ErrInvalid, quoteDomain(st.domain), quoteDomain(domain))
	}
	return nil
}

func quoteDomain(d string) string {
	if len(d) > 64 {
		d = d[:64] + "..."
	}
	return strconv.Quote(d)
}

// admit checks that n usages whose keys key gives fit in the stream's
// and the replica's bucket caps; s.mu is held.
func (st *Stream) admit(n int, key func(int) []byte) error {
	s := st.s
	added := 0
	for i := range n {
		if st.subs[string(key(i))] == nil {
			added++
		}
	}
	if len(st.subs)+added > s.o.MaxBucketsPerStream {
		s.refuse(CapStreamBuckets)
		return fmt.Errorf("%w: %d buckets, at most %d", ErrTooManyBuckets, len(st.subs)+added, s.o.MaxBucketsPerStream)
	}
	if s.nsubs+added > s.o.MaxBuckets {
		s.refuse(CapBuckets)
		return fmt.Errorf("%w: %d buckets with this report's %d new ones, at most %d", ErrTooManyReplicaBuckets, s.nsubs+added, added, s.o.MaxBuckets)
	}
	return nil
}

// checkUsage returns what is wrong with u, if anything, and the error
// it is a case of (ErrInvalid or ErrTooManyKeys).
func checkUsage(u *Usage) (kind, err error) {
	switch {
	case len(u.Bucket) == 0:
		return ErrInvalid, errors.New("empty bucket_id")
	case len(u.Bucket) > config.MaxBucketKeys:
		return ErrTooManyKeys, fmt.Errorf("bucket_id of %d keys, at most %d", len(u.Bucket), config.MaxBucketKeys)
	case u.Elapsed < 0 || u.Elapsed > MaxElapsed:
		return ErrInvalid, fmt.Errorf("time_elapsed %v outside [0, %v]", u.Elapsed, MaxElapsed)
	case u.Allowed > MaxCount || u.Denied > MaxCount:
		return ErrInvalid, fmt.Errorf("request counts %d allowed, %d denied: above %d", u.Allowed, u.Denied, uint64(MaxCount))
	}
	size := 0
	for k, v := range u.Bucket {
		if k == "" {
			return ErrInvalid, errors.New("bucket_id has an empty key")
		}
		if len(k) > MaxValueBytes || len(v) > MaxValueBytes {
			return ErrInvalid, fmt.Errorf("bucket_id key or value longer than %d bytes", MaxValueBytes)
		}
		size += len(k) + len(v)
	}
	if size > MaxBucketBytes {
		return ErrInvalid, fmt.Errorf("bucket_id of %d keys and %d bytes: above %d bytes", len(u.Bucket), size, MaxBucketBytes)
	}
	return nil, nil
}

// appendBucketKey appends a bucket id in one canonical form: sorted keys,
// each key and value length-prefixed.
func appendBucketKey(b []byte, m map[string]string) []byte {
	var buf [config.MaxBucketKeys]string
	ks := buf[:0]
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	for _, k := range ks {
		v := m[k]
		b = strconv.AppendInt(b, int64(len(k)), 10)
		b = append(b, ':')
		b = append(b, k...)
		b = strconv.AppendInt(b, int64(len(v)), 10)
		b = append(b, ':')
		b = append(b, v...)
	}
	return b
}

// parseBucketKey returns the bucket id of n keys that appendBucketKey
// wrote as key: its keys and values are substrings of key, so that a
// bucket holds its bytes once.
func parseBucketKey(key string, n int) map[string]string {
	m := make(map[string]string, n)
	next := func() string {
		i := strings.IndexByte(key, ':')
		l, _ := strconv.Atoi(key[:i])
		v := key[i+1 : i+1+l]
		key = key[i+1+l:]
		return v
	}
	for key != "" {
		k := next()
		m[k] = next()
	}
	return m
}
