package config

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/sluicehq/sluice/store"
)

// egPush is a RateLimitConfig as Envoy Gateway writes one for a
// BackendTrafficPolicy with rules on route rule 0 and 1 of an HTTPRoute
// (listener domain, route descriptor, then one per rule).
func egPush(route string, perHour, perSecond uint32) *ratelimitpb.RateLimitConfig {
	const domain = "default/eg/http"
	key := "httproute/default/" + route + "/rule/0/match/0/example"
	return &ratelimitpb.RateLimitConfig{Name: domain, Domain: domain, Descriptors: []*ratelimitpb.RateLimitDescriptor{{
		Key: key, Value: key,
		Descriptors: []*ratelimitpb.RateLimitDescriptor{
			{Key: "rule-0-match-0", RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_HOUR, RequestsPerUnit: perHour}},
			{Key: "rule-1-match-0", Value: "rule-1-match-0", RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_SECOND, RequestsPerUnit: perSecond}},
		},
	}}}
}

const egOverlay = `
domain: default/eg/*
descriptors:
  - key: httproute/default/backend/rule/0/match/0/*
    value: "*"
    descriptors:
      - key: rule-0-match-0
        rate_limit: {algorithm: token_bucket, burst: 3}
      - key: rule-1-match-0
        value: rule-1-match-0
        rate_limit: {unit_multiplier: 30, algorithm: sliding_window}
        rate_limits:
          - {unit: day, requests_per_unit: 5000000000}
  - key: httproute/default/*/rule/0/match/0/*
    value: "*"
    descriptors:
      - key: rule-0-match-0
        rate_limit: {algorithm: sliding_window}
  - key: nothing-here
    rate_limit: {algorithm: sliding_window}
`

func mustOverlay(t testing.TB, text string) *Overlay {
	t.Helper()
	o, err := ParseOverlay("overlay.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func ruleAt(t *testing.T, tbl *Table, path string) *Rule {
	t.Helper()
	for _, r := range tbl.Rules() {
		if r.Path == path {
			return r
		}
	}
	t.Fatalf("no rule %s in\n%s", path, tbl)
	return nil
}

// TestOverlay_AppliesToPushedRules: the most specific entry applies at
// the pushed rule's domain and path, wildcards included; its fields are
// compiled as a file's would be; an entry that matches nothing is
// reported, not an error.
func TestOverlay_AppliesToPushedRules(t *testing.T) {
	o := mustOverlay(t, egOverlay)
	tbl, err := CompileRateLimitConfigs([]*ratelimitpb.RateLimitConfig{egPush("backend", 60, 10)}, Options{Overlay: o})
	if err != nil {
		t.Fatal(err)
	}
	route := "httproute/default/backend/rule/0/match/0/example_httproute/default/backend/rule/0/match/0/example"
	bucket := ruleAt(t, tbl, route+".rule-0-match-0")
	if bucket.Algorithm != store.TokenBucket || bucket.Burst != 3 || bucket.RequestsPerUnit != 60 || bucket.Unit != Hour {
		t.Errorf("rule 0: %v, want a token bucket of 3 refilling 60 an hour (the more specific entry)", bucket)
	}
	if bucket.Overlay == nil || bucket.Overlay.File != "overlay.yaml" || bucket.Overlay.Line != 7 ||
		strings.Join(bucket.Overlay.Fields, ",") != "algorithm: token_bucket,burst: 3" {
		t.Errorf("rule 0's overlay: %+v", bucket.Overlay)
	}
	window := ruleAt(t, tbl, route+".rule-1-match-0_rule-1-match-0[0]")
	if window.Algorithm != store.SlidingWindow || window.UnitMultiplier != 30 || window.Period().Seconds() != 30 || window.RequestsPerUnit != 10 {
		t.Errorf("rule 1: %v, want 10 per 30 s, sliding", window)
	}
	budget := ruleAt(t, tbl, route+".rule-1-match-0_rule-1-match-0[1]")
	if budget.RequestsPerUnit != 5_000_000_000 || budget.Unit != Day || len(window.Limits()) != 2 {
		t.Errorf("rule 1's added budget: %v (%d limits)", budget, len(window.Limits()))
	}
	rep := tbl.Overlay()
	if rep.Entries != 4 || len(rep.Unmatched) != 2 || len(rep.Problems) != 0 {
		t.Fatalf("report %+v, want 4 entries, 2 unmatched", rep)
	}
	// The less specific entry for rule 0 lost to the more specific one.
	if rep.Unmatched[0].Line != 17 || rep.Unmatched[0].Reason != "every rule it matches takes a more specific entry" ||
		rep.Unmatched[1].Line != 19 || rep.Unmatched[1].Match != "default/eg/* | nothing-here" ||
		rep.Unmatched[1].Reason != "matches no rate_limit of the pushed config" {
		t.Errorf("unmatched %+v", rep.Unmatched)
	}

	// Another route: only the wider entry matches.
	tbl, err = CompileRateLimitConfigs([]*ratelimitpb.RateLimitConfig{egPush("frontend", 60, 10)}, Options{Overlay: o})
	if err != nil {
		t.Fatal(err)
	}
	r := ruleAt(t, tbl, "httproute/default/frontend/rule/0/match/0/example_httproute/default/frontend/rule/0/match/0/example.rule-0-match-0")
	if r.Algorithm != store.SlidingWindow || r.Overlay == nil || r.Overlay.Line != 17 {
		t.Errorf("frontend's rule 0: %v %+v, want the wider entry's sliding window", r, r.Overlay)
	}
	if rep := tbl.Overlay(); len(rep.Unmatched) != 3 {
		t.Errorf("unmatched %+v, want 3", rep.Unmatched)
	}
}

// TestOverlay_Problems: an entry that cannot apply to a pushed rule
// leaves the rule as pushed and is reported; the push compiles.
func TestOverlay_Problems(t *testing.T) {
	o := mustOverlay(t, `
domain: default/eg/http
descriptors:
  - key: "*"
    value: "*"
    descriptors:
      - key: rule-0-match-0
        rate_limit: {burst: 3}
      - key: rule-1-match-0
        value: "*"
        rate_limit: {calendar: true}
`)
	tbl, err := CompileRateLimitConfigs([]*ratelimitpb.RateLimitConfig{egPush("backend", 60, 10)}, Options{Overlay: o})
	if err != nil {
		t.Fatalf("a push with an overlay that cannot apply: %v, want it compiled", err)
	}
	for _, r := range tbl.Rules() {
		if r.Algorithm != store.FixedWindow || r.Overlay != nil {
			t.Errorf("%v changed by %+v", r, r.Overlay)
		}
	}
	rep := tbl.Overlay()
	if len(rep.Problems) != 2 || len(rep.Unmatched) != 2 {
		t.Fatalf("report %+v, want 2 problems", rep)
	}
	for i, want := range []string{"overlay.yaml:7: default/eg/http | *=* | rule-0-match-0: not applied to default/eg/http.", "burst needs algorithm: token_bucket"} {
		if !strings.Contains(rep.Problems[0].String(), want) {
			t.Errorf("problem %d: %q lacks %q", i, rep.Problems[0], want)
		}
	}
	if !strings.Contains(rep.Problems[1].Reason, "calendar periods are days, weeks, months or years, not seconds") {
		t.Errorf("problem: %q", rep.Problems[1])
	}
	// With --default-algorithm token_bucket a burst alone applies.
	tbl, err = CompileRateLimitConfigs([]*ratelimitpb.RateLimitConfig{egPush("backend", 60, 10)}, Options{Overlay: o, DefaultAlgorithm: store.TokenBucket})
	if err != nil {
		t.Fatal(err)
	}
	if r := tbl.Rules()[0]; r.Algorithm != store.TokenBucket || r.Burst != 3 || r.Overlay == nil {
		t.Errorf("%v, want a token bucket of 3", r)
	}
}

// TestOverlay_ChangesTheHash: the same push under another overlay or
// default algorithm is another table.
func TestOverlay_ChangesTheHash(t *testing.T) {
	push := []*ratelimitpb.RateLimitConfig{egPush("backend", 60, 10)}
	hashes := map[string]string{}
	for name, opts := range map[string]Options{
		"none":    {},
		"overlay": {Overlay: mustOverlay(t, egOverlay)},
		"other":   {Overlay: mustOverlay(t, strings.Replace(egOverlay, "burst: 3", "burst: 4", 1))},
		"default": {DefaultAlgorithm: store.TokenBucket},
	} {
		tbl, err := CompileRateLimitConfigs(push, opts)
		if err != nil {
			t.Fatal(err)
		}
		if prev, dup := hashes[tbl.Hash()]; dup {
			t.Errorf("%s and %s: the same hash", name, prev)
		}
		hashes[tbl.Hash()] = name
	}
	tbl, err := CompileRateLimitConfigs(push, Options{DefaultAlgorithm: store.FixedWindow})
	if err != nil {
		t.Fatal(err)
	}
	if hashes[tbl.Hash()] != "none" {
		t.Error("an explicit fixed_window default changed the hash")
	}
}

// TestDefaultAlgorithm: a pushed 10 per second becomes a bucket of 10
// refilling 10 a second; a rule that names its algorithm keeps it; a
// calendar rule stays a window.
func TestDefaultAlgorithm(t *testing.T) {
	tbl, err := CompileRateLimitConfigs([]*ratelimitpb.RateLimitConfig{egPush("backend", 60, 10)}, Options{DefaultAlgorithm: store.TokenBucket})
	if err != nil {
		t.Fatal(err)
	}
	r := tbl.Rules()[1]
	if r.Algorithm != store.TokenBucket || r.Burst != 10 || r.RequestsPerUnit != 10 || r.Period().Seconds() != 1 {
		t.Fatalf("%v, want a token bucket of 10 refilling 10/s", r)
	}
	now := int64(1_700_000_000_000_000_000)
	var s store.State
	granted := 0
	for range 11 {
		var d store.Decision
		s, d = store.TakeTokens(s, r.Limit, now, 1)
		if d.Allowed {
			granted++
		}
	}
	if granted != 10 {
		t.Errorf("11 quick takes: %d granted, want 10", granted)
	}
	if _, d := store.TakeTokens(s, r.Limit, now+int64(100e6), 1); !d.Allowed {
		t.Error("100 ms later: denied, want one token refilled")
	}

	tbl, err = Parse("f.yaml", []byte(`
domain: d
descriptors:
  - {key: a, rate_limit: {unit: second, requests_per_unit: 5, algorithm: fixed_window}}
  - {key: b, rate_limit: {unit: day, requests_per_unit: 5, calendar: yes}}
  - {key: c, rate_limit: {unit: day, requests_per_unit: 5, burst: 7}}
`), Options{DefaultAlgorithm: store.TokenBucket})
	if err != nil {
		t.Fatal(err)
	}
	got := []string{}
	for _, r := range tbl.Rules() {
		got = append(got, r.String())
	}
	want := "d.a: 5/second fixed_window|d.b: 5/calendar day (UTC) fixed_window|d.c: 5/day token_bucket burst 7"
	if strings.Join(got, "|") != want {
		t.Errorf("rules %q, want %q", strings.Join(got, "|"), want)
	}
}

// TestOverlay_ErrorsGolden loads each testdata/overlay/*.yaml and
// compares the errors, each with its file and line, with the .golden
// file next to it.
func TestOverlay_ErrorsGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/overlay/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			o, err := LoadOverlay(file)
			var es *Errors
			if !errors.As(err, &es) {
				t.Fatalf("LoadOverlay(%s) = %v, %v; want Errors", file, o, err)
			}
			matchGolden(t, file, err.Error()+"\n", "TestOverlay_ErrorsGolden")
		})
	}
}

// FuzzOverlay: any overlay file loads or fails with problems that name
// the file and a line; one that loads applies to a push without an
// error.
func FuzzOverlay(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/overlay/*.yaml")
	seeds = append(seeds, "../examples/overlay/token-bucket.yaml", "../examples/overlay/sliding-window.yaml", "../examples/overlay/fixed-window.yaml")
	for _, s := range seeds {
		if data, err := os.ReadFile(s); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(egOverlay))
	push := []*ratelimitpb.RateLimitConfig{egPush("backend", 60, 10)}
	f.Fuzz(func(t *testing.T, data []byte) {
		o, err := ParseOverlay("o.yaml", data)
		if err != nil {
			checkPlaced(t, err, "o.yaml")
			return
		}
		tbl, err := CompileRateLimitConfigs(push, Options{Overlay: o})
		if err != nil {
			t.Fatalf("a valid push with a valid overlay: %v", err)
		}
		rep := tbl.Overlay()
		if len(rep.Unmatched) > rep.Entries || rep.Entries != o.Entries() {
			t.Fatalf("report %+v of %d entries", rep, o.Entries())
		}
	})
}

// TestReloader_Overlay: a valid overlay goes in force and the config is
// compiled again with it; a bad one keeps the last good one, its problem
// named with file and line; RunOverlay follows the overlay's changes.
func TestReloader_Overlay(t *testing.T) {
	dir, odir := t.TempDir(), t.TempDir()
	writeFiles(t, dir, map[string]string{"eg.yaml": "domain: default/eg/http\ndescriptors:\n  - key: rule-0-match-0\n    rate_limit: {unit: hour, requests_per_unit: 60}\n"})
	r, err := NewReloader(dir, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	overlay := filepath.Join(odir, "o.yaml")
	write := func(text string) {
		t.Helper()
		writeAtomic(t, overlay, "domain: default/eg/http\ndescriptors:\n  - key: rule-0-match-0\n    rate_limit: "+text+"\n")
	}
	alg := func(tbl *Table) store.Algorithm { return tbl.Rules()[0].Algorithm }
	write("{algorithm: token_bucket, burst: 3}")
	if err := r.LoadOverlay(odir); err != nil {
		t.Fatal(err)
	}
	if got := r.Current().Rules()[0]; got.Algorithm != store.TokenBucket || got.Burst != 3 || got.Overlay == nil || got.Overlay.File != overlay {
		t.Fatalf("after the overlay: %v %+v, want a token bucket of 3 from %s", got, got.Overlay, overlay)
	}
	if st, ost := r.Status(), r.OverlayStatus(); st.Successes != 1 || st.Hash != r.Current().Hash() || !ost.LastOK || ost.Successes != 1 ||
		ost.Hash == "" || ost.Files != 1 || ost.Entries != 1 {
		t.Errorf("status %+v, overlay status %+v", st, ost)
	}

	write("{algorithm: leaky_bucket}")
	err = r.LoadOverlay(odir)
	if err == nil || !strings.Contains(err.Error(), overlay+":4: descriptors[0]: unknown algorithm \"leaky_bucket\"") {
		t.Errorf("a bad overlay: %v, want its file:line", err)
	}
	if alg(r.Current()) != store.TokenBucket || r.Overlay() == nil {
		t.Error("a bad overlay changed the config in force")
	}
	if ost := r.OverlayStatus(); ost.LastOK || ost.Failures != 1 || ost.LastError == nil {
		t.Errorf("overlay status after a bad overlay: %+v", ost)
	}

	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan *Table, 16)
	r.OnReload(func(tbl *Table, _ error) {
		select {
		case events <- tbl:
		case <-ctx.Done():
		}
	})
	done := make(chan error, 1)
	go func() { done <- r.RunOverlay(ctx, odir) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("RunOverlay: %v", err)
		}
	}()
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		write("{algorithm: sliding_window}")
		select {
		case tbl := <-events:
			if alg(tbl) == store.SlidingWindow {
				if ost := r.OverlayStatus(); !ost.LastOK {
					t.Errorf("overlay status after the fix: %+v", ost)
				}
				return
			}
		case <-tick.C:
		case <-deadline:
			t.Fatal("the changed overlay was not applied within 30 s")
		}
	}
}

// TestLoadOverlay_EmptyDirectory: a directory without overlay files is an
// overlay without entries (a ConfigMap emptied), not an error.
func TestLoadOverlay_EmptyDirectory(t *testing.T) {
	o, err := LoadOverlay(t.TempDir())
	if err != nil || o.Entries() != 0 {
		t.Fatalf("LoadOverlay(empty dir) = %v, %v; want an overlay without entries", o, err)
	}
	if _, err := LoadOverlay(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("LoadOverlay(a missing path): no error")
	}
}

// TestReloader_OverlayKeepsARejectedPushVisible: after a push that was
// rejected, a new overlay compiles the config in force (the last good
// push) again, and the status still says the last push failed.
func TestReloader_OverlayKeepsARejectedPushVisible(t *testing.T) {
	r := NewSourceReloader(pushSource{}, nil, nil)
	push := func(perHour uint32) func() (*Table, error) {
		return func() (*Table, error) {
			return CompileRateLimitConfigs([]*ratelimitpb.RateLimitConfig{egPush("backend", perHour, 10)}, Options{Overlay: r.Overlay()})
		}
	}
	if err := r.UpdateVersion("1", push(60)); err != nil {
		t.Fatal(err)
	}
	bad := func() (*Table, error) { return nil, errors.New("a bad push") }
	if err := r.UpdateVersion("2", bad); err == nil {
		t.Fatal("the bad push: no error")
	}
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"o.yaml": "domain: default/eg/http\ndescriptors:\n  - key: '*'\n    value: '*'\n    descriptors:\n      - key: rule-0-match-0\n        rate_limit: {algorithm: token_bucket}\n"})
	if err := r.LoadOverlay(dir); err != nil {
		t.Fatal(err)
	}
	if got := r.Current().Rules()[0]; got.Algorithm != store.TokenBucket || got.RequestsPerUnit != 60 {
		t.Errorf("after the overlay: %v, want push 1's rule as a token bucket", got)
	}
	if st := r.Status(); st.LastOK || st.Version != "1" || st.Successes != 1 || st.Failures != 1 || st.Hash != r.Current().Hash() {
		t.Errorf("status %+v, want the failed push still the last attempt, version 1 in force", st)
	}
}
