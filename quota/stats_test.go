package quota

import (
	"context"
	"fmt"
	"testing"
)

const statLimits = `
domain: d
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000}
  - key: user
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: free
    rate_limit: {unlimited: true}
`

func TestService_RulesPerRule(t *testing.T) {
	tb := &tables{}
	tb.p.Store(loadTable(t, statLimits))
	s := New(tb, Options{})
	ctx := context.Background()
	a, _ := s.Open()
	b, _ := s.Open()
	mustReport(t, a, at(0), use("tenant", "x", 10, 0), use("tenant", "y", 10, 0), use("user", "alice", 1, 0))
	mustReport(t, b, at(0), use("tenant", "x", 10, 0), use("free", "1", 1, 0))
	if rs := s.Rules(); len(rs) != 0 {
		t.Errorf("before the first Tick: %+v, want none", rs)
	}
	if err := s.Tick(ctx, at(1)); err != nil {
		t.Fatal(err)
	}
	got := map[string]RuleStat{}
	for _, r := range s.Rules() {
		got[r.Rule.Path] = r
	}
	for _, w := range []struct {
		path                     string
		groups, buckets, streams int
		ids                      int
	}{{"tenant", 2, 3, 2, 0}, {"user", 1, 1, 1, 1}, {"free", 0, 1, 1, 0}} {
		r, ok := got[w.path]
		if !ok {
			t.Errorf("rule %s: missing from %+v", w.path, got)
			continue
		}
		if r.Groups != w.groups || r.Buckets != w.buckets || r.Streams != w.streams || len(r.BucketIDs) != w.ids {
			t.Errorf("rule %s: %d groups, %d buckets, %d streams, ids %v; want %d, %d, %d, %d ids",
				w.path, r.Groups, r.Buckets, r.Streams, r.BucketIDs, w.groups, w.buckets, w.streams, w.ids)
		}
	}
	if r := got["user"]; len(r.BucketIDs) == 1 && r.BucketIDs[0]["user"] != "alice" {
		t.Errorf("user's bucket ids %v, want alice's", r.BucketIDs)
	}
	if r := got["tenant"]; r.Share > 2*1000 || r.Share <= 0 {
		t.Errorf("tenant: share %v, want in (0, 2000] (two groups of 1000)", r.Share)
	}
	// The caller's copy is its own.
	got["user"].BucketIDs[0]["user"] = "mallory"
	for _, r := range s.Rules() {
		if r.Rule.Path == "user" && r.BucketIDs[0]["user"] != "alice" {
			t.Errorf("Rules exposes the subscription's own bucket id: %v", r.BucketIDs)
		}
	}
	if s.Stats().Shared {
		t.Error("Shared without a Fleet")
	}

	// Many users: the ids listed stop at MaxStatBuckets, the count does not.
	var us []Usage
	for i := range 2 * MaxStatBuckets {
		us = append(us, use("user", fmt.Sprint("u", i), 1, 0))
	}
	mustReport(t, b, at(1), us...)
	if err := s.Tick(ctx, at(2)); err != nil {
		t.Fatal(err)
	}
	for _, r := range s.Rules() {
		if r.Rule.Path == "user" && (r.Buckets != 2*MaxStatBuckets+1 || r.Streams != 2 || len(r.BucketIDs) != MaxStatBuckets) {
			t.Errorf("user after %d more: %d buckets, %d streams, %d ids; want %d, 2, %d",
				2*MaxStatBuckets, r.Buckets, r.Streams, len(r.BucketIDs), 2*MaxStatBuckets+1, MaxStatBuckets)
		}
	}
	// A stream that ends leaves the counts at the next Tick.
	b.Close()
	if err := s.Tick(ctx, at(3)); err != nil {
		t.Fatal(err)
	}
	for _, r := range s.Rules() {
		if r.Rule.Path == "tenant" && (r.Buckets != 2 || r.Streams != 1) {
			t.Errorf("tenant after a stream ended: %d buckets, %d streams; want 2, 1", r.Buckets, r.Streams)
		}
		if r.Rule.Path == "free" {
			t.Errorf("free after its only stream ended: %+v", r)
		}
	}
}

func TestService_StatsShared(t *testing.T) {
	s, _ := newTestService(t, Options{Fleet: &fakeFleet{name: "a", all: map[string]map[string]fakeEntry{}}})
	if !s.Stats().Shared {
		t.Error("Shared = false with a Fleet")
	}
}

// TestService_RuleDemandIsTheMean: a rule's demand is its buckets' mean
// demand over their last reports (Options.DemandWindow), not their peak:
// a proxy at 100/s, then 300/s counts as 200.
func TestService_RuleDemandIsTheMean(t *testing.T) {
	tb := &tables{}
	tb.p.Store(loadTable(t, statLimits))
	s := New(tb, Options{})
	a, _ := s.Open()
	mustReport(t, a, at(0), use("tenant", "x", 1, 0))
	mustReport(t, a, at(1), use("tenant", "x", 100, 0))
	mustReport(t, a, at(2), use("tenant", "x", 300, 0))
	if err := s.Tick(context.Background(), at(2.5)); err != nil {
		t.Fatal(err)
	}
	for _, r := range s.Rules() {
		if r.Rule.Path == "tenant" && r.Demand != 200 {
			t.Errorf("tenant: demand %v, want 200 (the mean of 100 and 300)", r.Demand)
		}
	}
}
