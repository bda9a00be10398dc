package quota

import (
	"errors"
	"maps"
	"testing"
	"time"
)

// FuzzReport feeds arbitrary usages to a stream: Report never panics,
// either applies the whole report or nothing (returning ErrInvalid or
// ErrExhausted), answers every new bucket at once with its bucket id as
// reported, and never holds more buckets than the cap.
func FuzzReport(f *testing.F) {
	f.Add("tenant", "a", int64(time.Second), uint64(10), uint64(0), "api", "k")
	f.Add("", "", int64(-1), uint64(1<<50), uint64(0), "x", "")
	f.Add("tenant", "", int64(0), uint64(0), uint64(0), "tenant", "b")
	f.Add("free", "1", int64(25*time.Hour), uint64(5), uint64(5), "closed", "z")
	s, _ := newTestService(f, Options{MaxBucketsPerStream: 3})
	f.Fuzz(func(t *testing.T, k1, v1 string, elapsed int64, allowed, denied uint64, k2, v2 string) {
		st, err := s.Open()
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		us := []Usage{
			{Bucket: map[string]string{k1: v1}, Elapsed: time.Duration(elapsed), Allowed: allowed, Denied: denied},
			{Bucket: map[string]string{k1: v1, k2: v2}, Elapsed: time.Second, Allowed: 1},
		}
		for round := range 3 {
			before := st.Buckets()
			err := st.Report(at(float64(round)), "d", us)
			after := st.Buckets()
			switch {
			case err != nil && !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrExhausted):
				t.Fatalf("Report: unexpected error %v", err)
			case err != nil && after != before:
				t.Fatalf("a refused report changed the buckets: %d → %d", before, after)
			case after > 3:
				t.Fatalf("%d buckets past the cap of 3", after)
			case err == nil && round == 0:
				as := st.Pending()
				if len(as) != after {
					t.Fatalf("%d new buckets, not all answered at once", after)
				}
				for _, a := range as {
					if !maps.Equal(a.Bucket, us[0].Bucket) && !maps.Equal(a.Bucket, us[1].Bucket) {
						t.Fatalf("answered bucket %q, reported %q and %q", a.Bucket, us[0].Bucket, us[1].Bucket)
					}
				}
			}
			us[0].Bucket = map[string]string{k2: v1 + v2}
		}
	})
}

// FuzzBucketKey: a bucket id written by appendBucketKey reads back whole
// with parseBucketKey, and two ids have the same key only if equal.
func FuzzBucketKey(f *testing.F) {
	f.Add("tenant", "a", "", "")
	f.Add("1:a", "2:bc", "k", "")
	f.Add("x", "", "y", "3:zzz")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		m := map[string]string{k1: v1, k2: v2}
		key := string(appendBucketKey(nil, m))
		if got := parseBucketKey(key, len(m)); !maps.Equal(got, m) {
			t.Fatalf("%q → %q → %q", m, key, got)
		}
		other := map[string]string{k1 + v1: k2 + v2}
		if !maps.Equal(other, m) && string(appendBucketKey(nil, other)) == key {
			t.Fatalf("%q and %q share the key %q", m, other, key)
		}
	})
}
