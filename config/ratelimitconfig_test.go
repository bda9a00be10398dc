package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// edgeProto is edgeYAML as an xDS RateLimitConfig.
var edgeProto = &ratelimitpb.RateLimitConfig{
	Name:   "edge-config",
	Domain: "edge",
	Descriptors: []*ratelimitpb.RateLimitDescriptor{
		{Key: "remote_address", RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_SECOND, RequestsPerUnit: 100}},
		{Key: "api_key", Descriptors: []*ratelimitpb.RateLimitDescriptor{
			{Key: "path", Value: "/v1/search*", RateLimit: &ratelimitpb.RateLimitPolicy{
				Name: "search", Unit: ratelimitpb.RateLimitUnit_MINUTE, RequestsPerUnit: 60,
				Replaces: []*ratelimitpb.RateLimitReplace{{Name: "any"}}}},
			{Key: "path", RateLimit: &ratelimitpb.RateLimitPolicy{Name: "any", Unit: ratelimitpb.RateLimitUnit_HOUR, RequestsPerUnit: 1000}},
		}},
		{Key: "vip", Value: "yes", RateLimit: &ratelimitpb.RateLimitPolicy{Unlimited: true}},
		{Key: "trial", ShadowMode: true, DetailedMetric: true, RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_WEEK, RequestsPerUnit: 5}},
		{Key: "monthly", RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_MONTH, RequestsPerUnit: 9}},
		// Envoy Gateway sends levels without a rate limit and empty lists.
		{Key: "generic_key", Value: "gw", Descriptors: []*ratelimitpb.RateLimitDescriptor{
			{Key: "masked_remote_address", Value: "0.0.0.0/0", RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_DAY, RequestsPerUnit: 0}},
		}},
	},
}

const edgeYAML = `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: api_key
    descriptors:
      - key: path
        value: /v1/search*
        rate_limit: {name: search, unit: minute, requests_per_unit: 60, replaces: [{name: any}]}
      - key: path
        rate_limit: {name: any, unit: hour, requests_per_unit: 1000}
  - key: vip
    value: "yes"
    rate_limit: {unlimited: true}
  - key: trial
    shadow_mode: true
    detailed_metric: true
    rate_limit: {unit: week, requests_per_unit: 5}
  - key: monthly
    rate_limit: {unit: month, requests_per_unit: 9}
  - key: generic_key
    value: gw
    rate_limit: null
    descriptors:
      - key: masked_remote_address
        value: 0.0.0.0/0
        rate_limit: {unit: day, requests_per_unit: 0}
`

func TestCompileRateLimitConfigs_SameTableAsTheFile(t *testing.T) {
	got, err := CompileRateLimitConfigs([]*ratelimitpb.RateLimitConfig{edgeProto}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(path, []byte(edgeYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	want, err := Load(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != want.String() {
		t.Errorf("proto table:\n%s\nfile table:\n%s", got, want)
	}
	if g, w := len(got.Rules()), len(want.Rules()); g != w || g != 7 {
		t.Errorf("%d rules from the proto, %d from the file, want 7", g, w)
	}
	for i, r := range got.Rules() {
		w := want.Rules()[i]
		if r.Name != w.Name || r.Unit != w.Unit || r.RequestsPerUnit != w.RequestsPerUnit || r.Unlimited != w.Unlimited ||
			r.ShadowMode != w.ShadowMode || r.DetailedMetric != w.DetailedMetric || strings.Join(r.Replaces, ",") != strings.Join(w.Replaces, ",") {
			t.Errorf("rule %d: proto %v, file %v", i, r, w)
		}
		if r.File != `resource "edge-config"` || r.Line != 0 {
			t.Errorf("rule %d at %s:%d, want resource \"edge-config\" without line", i, r.File, r.Line)
		}
	}
	for _, entries := range [][]Entry{
		{{"remote_address", "10.0.0.1"}},
		{{"api_key", "k"}, {"path", "/v1/search?q=1"}},
		{{"api_key", "k"}, {"path", "/v2"}},
		{{"vip", "yes"}},
		{{"trial", "t"}},
		{{"generic_key", "gw"}, {"masked_remote_address", "0.0.0.0/0"}},
		{{"generic_key", "gw"}},
		{{"nope", "x"}},
	} {
		gr, gk := got.Match("edge", entries, nil)
		wr, wk := want.Match("edge", entries, nil)
		if (gr == nil) != (wr == nil) || string(gk) != string(wk) {
			t.Errorf("Match(%v): proto %v %q, file %v %q", entries, gr, gk, wr, wk)
		}
	}
}

func TestCompileRateLimitConfigs_ErrorsNameResourceAndField(t *testing.T) {
	policy := func(u ratelimitpb.RateLimitUnit) *ratelimitpb.RateLimitPolicy {
		return &ratelimitpb.RateLimitPolicy{Unit: u, RequestsPerUnit: 1}
	}
	good := &ratelimitpb.RateLimitConfig{Name: "good", Domain: "d1",
		Descriptors: []*ratelimitpb.RateLimitDescriptor{{Key: "k", RateLimit: policy(ratelimitpb.RateLimitUnit_SECOND)}}}
	for _, tc := range []struct {
		name string
		res  *ratelimitpb.RateLimitConfig
		want string
	}{
		{"no unit", &ratelimitpb.RateLimitConfig{Name: "r", Domain: "d",
			Descriptors: []*ratelimitpb.RateLimitDescriptor{{Key: "a", Descriptors: []*ratelimitpb.RateLimitDescriptor{
				{Key: "b", RateLimit: &ratelimitpb.RateLimitPolicy{RequestsPerUnit: 3}}}}}},
			`config: resource "r": descriptors[0].descriptors[0]: rate_limit has no unit`},
		{"unknown unit", &ratelimitpb.RateLimitConfig{Name: "r", Domain: "d",
			Descriptors: []*ratelimitpb.RateLimitDescriptor{{Key: "a", RateLimit: policy(42)}}},
			`config: resource "r": descriptors[0]: unknown unit "42" (want second, minute, hour, day, week, month or year)`},
		{"empty key", &ratelimitpb.RateLimitConfig{Name: "r", Domain: "d",
			Descriptors: []*ratelimitpb.RateLimitDescriptor{{Key: "a"}, {Value: "v", RateLimit: policy(ratelimitpb.RateLimitUnit_SECOND)}}},
			`config: resource "r": descriptors[1]: descriptor has an empty key`},
		{"empty domain", &ratelimitpb.RateLimitConfig{Name: "r"}, `config: resource "r": domain is empty`},
		{"unlimited with unit", &ratelimitpb.RateLimitConfig{Name: "r", Domain: "d",
			Descriptors: []*ratelimitpb.RateLimitDescriptor{{Key: "a", RateLimit: &ratelimitpb.RateLimitPolicy{Unlimited: true, Unit: ratelimitpb.RateLimitUnit_HOUR}}}},
			`config: resource "r": descriptors[0]: an unlimited rate_limit takes no unit`},
		{"replaces nothing", &ratelimitpb.RateLimitConfig{Name: "r", Domain: "d",
			Descriptors: []*ratelimitpb.RateLimitDescriptor{{Key: "a", RateLimit: &ratelimitpb.RateLimitPolicy{
				Unit: ratelimitpb.RateLimitUnit_SECOND, Replaces: []*ratelimitpb.RateLimitReplace{{Name: "ghost"}}}}}},
			`config: resource "r": descriptors[0]: replaces[0] names "ghost", but no rule of domain "d" has that name`},
		{"duplicate", &ratelimitpb.RateLimitConfig{Name: "r", Domain: "d",
			Descriptors: []*ratelimitpb.RateLimitDescriptor{{Key: "a", Value: "1"}, {Key: "a", Value: "1"}}},
			`config: resource "r": descriptors[1]: duplicate descriptor: key "a" value "1" is also defined at resource "r"`},
		{"domain twice", &ratelimitpb.RateLimitConfig{Name: "z-again", Domain: "d1"},
			`config: resource "z-again": domain "d1" is also defined at resource "good" (merge them with --merge-domains)`},
		{"no name", &ratelimitpb.RateLimitConfig{Domain: "d", Descriptors: []*ratelimitpb.RateLimitDescriptor{{Key: "a", RateLimit: policy(0)}}},
			`config: resources[1]: descriptors[0]: rate_limit has no unit`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl, err := CompileRateLimitConfigs([]*ratelimitpb.RateLimitConfig{good, tc.res}, Options{})
			var es *Errors
			if !errors.As(err, &es) || tbl != nil {
				t.Fatalf("CompileRateLimitConfigs = %v, %v; want *Errors", tbl, err)
			}
			if es.List[0].Error() != tc.want {
				t.Errorf("error\n %s\nwant\n %s", es.List[0].Error(), tc.want)
			}
		})
	}
}

func TestCompileRateLimitConfigs_Hash(t *testing.T) {
	compile := func(cs ...*ratelimitpb.RateLimitConfig) string {
		t.Helper()
		tbl, err := CompileRateLimitConfigs(cs, Options{})
		if err != nil {
			t.Fatal(err)
		}
		return tbl.Hash()
	}
	other := proto.Clone(edgeProto).(*ratelimitpb.RateLimitConfig)
	other.Descriptors[0].RateLimit.RequestsPerUnit = 101
	renamed := proto.Clone(edgeProto).(*ratelimitpb.RateLimitConfig)
	renamed.Name = "renamed"
	h := compile(edgeProto)
	if compile(proto.Clone(edgeProto).(*ratelimitpb.RateLimitConfig)) != h {
		t.Error("the same content hashes differently")
	}
	if compile(other) == h || compile(renamed) == h {
		t.Error("another limit or another resource name hashes the same")
	}
	second := &ratelimitpb.RateLimitConfig{Name: "second", Domain: "other"}
	if compile(edgeProto, second) != compile(second, edgeProto) {
		t.Error("the resources' order changes the hash")
	}
	if empty := compile(); empty != Empty().Hash() || empty == h {
		t.Errorf("no resources hash %s, Empty %s", empty, Empty().Hash())
	}
}

func TestCompileRateLimitConfigs_MergeDomains(t *testing.T) {
	a := &ratelimitpb.RateLimitConfig{Name: "a", Domain: "d", Descriptors: []*ratelimitpb.RateLimitDescriptor{
		{Key: "x", RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_SECOND, RequestsPerUnit: 1}}}}
	b := &ratelimitpb.RateLimitConfig{Name: "b", Domain: "d", Descriptors: []*ratelimitpb.RateLimitDescriptor{
		{Key: "y", RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_SECOND, RequestsPerUnit: 2}}}}
	tbl, err := CompileRateLimitConfigs([]*ratelimitpb.RateLimitConfig{a, b}, Options{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := tbl.Match("d", []Entry{{"y", "1"}}, nil); r == nil || r.RequestsPerUnit != 2 || tbl.Files() != 2 {
		t.Errorf("merged domain: rule %v, %d resources", r, tbl.Files())
	}
}

// quota_mode and metadata (fields 7 and 8 of the newer proto, which the
// QuotaPolicy controller of Envoy AI Gateway pushes) compile as the same
// fields of a limits file do, and the units WEEK, MONTH and YEAR too.
func TestCompileRateLimitConfigs_QuotaModeAndMetadata(t *testing.T) {
	md, err := structpb.NewStruct(map[string]any{
		"backend": "service-a",
		"answer":  "yes", // a string, not YAML's boolean
		"weight":  1.5,
		"count":   float64(3),
		"on":      true,
		"none":    nil,
		"list":    []any{"x", float64(2), false, map[string]any{"deep": "v"}},
		"nested":  map[string]any{"route": map[string]any{"name": "r1"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	res := &ratelimitpb.RateLimitConfig{Name: "quota", Domain: "ai", Descriptors: []*ratelimitpb.RateLimitDescriptor{
		{Key: "model", Value: "a", QuotaMode: true, Metadata: md,
			RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_YEAR, RequestsPerUnit: 10}},
		{Key: "model", Value: "b", QuotaMode: true, RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_MONTH, RequestsPerUnit: 10}},
		{Key: "model", Value: "c", RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_WEEK, RequestsPerUnit: 10}},
	}}
	got, err := CompileRateLimitConfigs([]*ratelimitpb.RateLimitConfig{res}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "quota.yaml")
	if err := os.WriteFile(path, []byte(`domain: ai
descriptors:
  - key: model
    value: a
    quota_mode: true
    metadata:
      backend: service-a
      answer: "yes"
      weight: 1.5
      count: 3
      on: true
      none: null
      list: [x, 2, false, {deep: v}]
      nested: {route: {name: r1}}
    rate_limit: {unit: year, requests_per_unit: 10}
  - key: model
    value: b
    quota_mode: true
    rate_limit: {unit: month, requests_per_unit: 10}
  - key: model
    value: c
    rate_limit: {unit: week, requests_per_unit: 10}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	want, err := Load(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != want.String() {
		t.Errorf("proto table:\n%s\nfile table:\n%s", got, want)
	}
	for _, v := range []string{"a", "b", "c"} {
		gr, gk := got.Match("ai", []Entry{{"model", v}}, nil)
		wr, wk := want.Match("ai", []Entry{{"model", v}}, nil)
		if gr == nil || wr == nil || string(gk) != string(wk) {
			t.Fatalf("model %s: proto %v %q, file %v %q", v, gr, gk, wr, wk)
		}
		if gr.QuotaMode != wr.QuotaMode || gr.QuotaMode != (v != "c") || gr.Unit != wr.Unit {
			t.Errorf("model %s: proto quota_mode %t unit %v, file %t %v", v, gr.QuotaMode, gr.Unit, wr.QuotaMode, wr.Unit)
		}
		if !reflect.DeepEqual(gr.Metadata, wr.Metadata) {
			t.Errorf("model %s: proto metadata %#v, file %#v", v, gr.Metadata, wr.Metadata)
		}
	}
	if r, _ := got.Match("ai", []Entry{{"model", "a"}}, nil); !reflect.DeepEqual(r.Metadata, md.AsMap()) {
		t.Errorf("metadata %#v, want the Struct's %#v", r.Metadata, md.AsMap())
	}
	// The Struct's map order does not change the table.
	again, err := CompileRateLimitConfigs([]*ratelimitpb.RateLimitConfig{proto.Clone(res).(*ratelimitpb.RateLimitConfig)}, Options{})
	if err != nil || again.Hash() != got.Hash() {
		t.Errorf("compiled again: hash %s (%v), first %s", again.Hash(), err, got.Hash())
	}
}

// A Struct nested deeper than a file's metadata may be is refused as
// the file's is, without walking all of it.
func TestCompileRateLimitConfigs_DeepMetadataIsBounded(t *testing.T) {
	v := structpb.NewStringValue("leaf")
	for range 5000 {
		v = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"k": v}})
	}
	_, err := CompileRateLimitConfigs([]*ratelimitpb.RateLimitConfig{{Name: "deep", Domain: "d", Descriptors: []*ratelimitpb.RateLimitDescriptor{
		{Key: "k", Metadata: v.GetStructValue(), RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_HOUR, RequestsPerUnit: 1}}}}}, Options{})
	if err == nil || !strings.Contains(err.Error(), "metadata nested deeper than 64 levels") {
		t.Fatalf("err = %v, want the nesting bound", err)
	}
}

func TestCompileRateLimitConfigs_DeepNestingIsBounded(t *testing.T) {
	d := &ratelimitpb.RateLimitDescriptor{Key: "leaf"}
	for range 5000 {
		d = &ratelimitpb.RateLimitDescriptor{Key: "k", Descriptors: []*ratelimitpb.RateLimitDescriptor{d}}
	}
	_, err := CompileRateLimitConfigs([]*ratelimitpb.RateLimitConfig{{Name: "deep", Domain: "d", Descriptors: []*ratelimitpb.RateLimitDescriptor{d}}}, Options{})
	if err == nil || !strings.Contains(err.Error(), "nested deeper than 64 levels") {
		t.Fatalf("err = %v, want the nesting bound", err)
	}
}

// FuzzCompileRateLimitConfigs checks that any pushed resource either
// compiles into a usable table or fails with errors that name the
// resource and no line.
func FuzzCompileRateLimitConfigs(f *testing.F) {
	seed, err := proto.Marshal(edgeProto)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte{})
	md, _ := structpb.NewStruct(map[string]any{"backend": "a", "n": 1.5, "l": []any{true, nil, map[string]any{"k": "v"}}})
	quota, err := proto.Marshal(&ratelimitpb.RateLimitConfig{Domain: "ai", Descriptors: []*ratelimitpb.RateLimitDescriptor{
		{Key: "model", QuotaMode: true, Metadata: md, RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_YEAR, RequestsPerUnit: 1}}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(quota)
	f.Fuzz(func(t *testing.T, data []byte) {
		var res ratelimitpb.RateLimitConfig
		if proto.Unmarshal(data, &res) != nil {
			return
		}
		res.Name = "fuzz"
		for _, f := range IgnoredFields([]*ratelimitpb.RateLimitConfig{&res}) {
			if !strings.HasPrefix(f, "ratelimit.config.ratelimit.v3.") {
				t.Errorf("ignored field %q is not one of the proto's messages", f)
			}
		}
		tbl, err := CompileRateLimitConfigs([]*ratelimitpb.RateLimitConfig{&res}, Options{})
		if err != nil {
			var es *Errors
			if !errors.As(err, &es) || len(es.List) == 0 {
				t.Fatalf("error %T %v, want *Errors", err, err)
			}
			for _, e := range es.List {
				if e.File != `resource "fuzz"` || e.Line != 0 || e.Msg == "" {
					t.Errorf("error %+v does not name the resource", e)
				}
			}
			return
		}
		for _, r := range tbl.Rules() {
			if r.Limit == nil != r.Unlimited || !tbl.HasDomain(r.Domain) {
				t.Errorf("rule %v: Limit %v", r, r.Limit)
			}
		}
	})
}

// BenchmarkCompileRateLimitConfigs is the cost of one push as Envoy
// Gateway sends it: 50 resources (routes) of 20 rules each.
func BenchmarkCompileRateLimitConfigs(b *testing.B) {
	var cfgs []*ratelimitpb.RateLimitConfig
	for i := range 50 {
		c := &ratelimitpb.RateLimitConfig{Name: fmt.Sprintf("default/eg/route-%d", i), Domain: fmt.Sprintf("default/eg/route-%d", i)}
		for j := range 20 {
			c.Descriptors = append(c.Descriptors, &ratelimitpb.RateLimitDescriptor{
				Key: fmt.Sprintf("rule-%d", j), Value: fmt.Sprintf("rule-%d", j),
				Descriptors: []*ratelimitpb.RateLimitDescriptor{{Key: "remote_address",
					RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_MINUTE, RequestsPerUnit: uint32(j + 1)}}},
			})
		}
		cfgs = append(cfgs, c)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := CompileRateLimitConfigs(cfgs, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}

// Envoy Gateway's own test of the uint32 bound: a limit of 4294967295
// pushed over xDS compiles (it was refused as exceeding 4294967294) into
// a rule that counts it exactly.
func TestCompileRateLimitConfigs_MaxUint32(t *testing.T) {
	tbl, err := CompileRateLimitConfigs([]*ratelimitpb.RateLimitConfig{{Name: "eg", Domain: "eg", Descriptors: []*ratelimitpb.RateLimitDescriptor{
		{Key: "k", RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_HOUR, RequestsPerUnit: 4294967295}},
	}}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, key := tbl.Match("eg", []Entry{{"k", "v"}}, nil)
	if r == nil || r.RequestsPerUnit != 4294967295 || r.Limit.Limit() != 4294967295 || !r.Limit.Wide() || !strings.HasSuffix(string(key), "|fw64:3600s") {
		t.Fatalf("rule %v key %q: want 4294967295 per hour, wide", r, key)
	}
}
