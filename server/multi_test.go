package server_test

import (
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/server"
)

// TestRLS_SeveralLimits: over gRPC, a descriptor with a per-second and a
// per-minute limit reports the deciding one, and the IETF fields list
// both.
func TestRLS_SeveralLimits(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{IETFHeaders: true})
	steps := []struct {
		advance time.Duration
		want    *dstat
		rl      string // the RateLimit field
	}{
		0: {0, st(ok, "tier_second", 2, second, 1, time.Second), `"tier_second";r=1;t=1, "tier_minute";r=2;t=60`},
		1: {0, st(ok, "tier_second", 2, second, 0, time.Second), `"tier_second";r=0;t=1, "tier_minute";r=1;t=60`},
		2: {0, st(over, "tier_second", 2, second, 0, time.Second), `"tier_second";r=0;t=1, "tier_minute";r=1;t=60`},
		3: {time.Second, st(ok, "tier_minute", 3, minute, 0, 59*time.Second), `"tier_second";r=1;t=1, "tier_minute";r=0;t=59`},
		4: {0, st(over, "tier_minute", 3, minute, 0, 59*time.Second), `"tier_second";r=1;t=1, "tier_minute";r=0;t=59`},
	}
	for i, s := range steps {
		e.clock.Advance(s.advance)
		got, err := e.rls.ShouldRateLimit(ctx(t), req(0, d("tier", "a")))
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if !proto.Equal(s.want, got.Statuses[0]) {
			t.Errorf("step %d: status %v, want %v", i, got.Statuses[0], s.want)
		}
		hs := headers(got.ResponseHeadersToAdd)
		if p := hs["RateLimit-Policy"]; p != `"tier_second";q=2;w=1, "tier_minute";q=3;w=60` {
			t.Errorf("step %d: RateLimit-Policy %q", i, p)
		}
		if hs["RateLimit"] != s.rl {
			t.Errorf("step %d: RateLimit %q, want %q", i, hs["RateLimit"], s.rl)
		}
		if _, legacy := hs["RateLimit-Limit"]; legacy {
			t.Errorf("step %d: RateLimit-Limit without --response-headers", i)
		}
		if ra, denied := hs["Retry-After"]; denied != (got.OverallCode == over) || i == 2 && ra != "1" || i == 4 && ra != "59" {
			t.Errorf("step %d: Retry-After %q with overall %v", i, ra, got.OverallCode)
		}
	}
}

func headers(hv []*corepb.HeaderValue) map[string]string {
	m := map[string]string{}
	for _, h := range hv {
		m[h.Key] = h.Value
	}
	return m
}

func TestRLS_QuotaMode(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{})
	if got, _ := e.rls.ShouldRateLimit(ctx(t), req(0, d("quota", "a"))); got.GetOverallCode() != ok {
		t.Fatalf("first quota hit: %v", got)
	}
	// The only quota descriptor is over: all quota descriptors are.
	got, err := e.rls.ShouldRateLimit(ctx(t), req(0, d("quota", "a")))
	if err != nil || got.OverallCode != over {
		t.Fatalf("the only quota descriptor over: %v %v; want OVER_LIMIT", got, err)
	}
	e2 := newEnv(t, limiter.Options{QuotaMode: true}, server.Options{})
	e2.rls.ShouldRateLimit(ctx(t), req(0, d("quota", "a")))
	got, err = e2.rls.ShouldRateLimit(ctx(t), req(0, d("quota", "a"), d("extra", "x")))
	if err != nil || got.OverallCode != ok || got.Statuses[0].Code != over || got.Statuses[1].Code != ok {
		t.Fatalf("--quota-mode, one of two over: %v %v; want OK overall, statuses OVER_LIMIT and OK", got, err)
	}
}

func TestRLS_DynamicMetadata(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{DynamicMetadata: true})
	mustStruct := func(m map[string]any) *structpb.Struct {
		s, err := structpb.NewStruct(m)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	got, err := e.rls.ShouldRateLimit(ctx(t), req(0, d("tier", "a"), hits(d("extra", "b"), 1)))
	if err != nil {
		t.Fatal(err)
	}
	want := mustStruct(map[string]any{
		"domain": "e2e",
		"descriptors": []any{
			map[string]any{"entries": []any{"tier=a"}},
			map[string]any{"entries": []any{"extra=b"}, "hitsAddend": 1.0},
		},
		// tier comes first: its values win, the plans merge.
		"metadata": map[string]any{"plan": map[string]any{"name": "gold", "seats": 3.0, "extra": true}, "region": "eu"},
	})
	if !proto.Equal(want, got.DynamicMetadata) {
		t.Errorf("dynamic metadata %v, want %v", got.DynamicMetadata, want)
	}
	// tier over its per-second limit: its metadata is left out; an
	// override shows as proto text; hits_addend is the request's.
	e.rls.ShouldRateLimit(ctx(t), req(0, d("tier", "a")))
	got, err = e.rls.ShouldRateLimit(ctx(t), req(2, d("tier", "a"), d("extra", "b"), override(d("nomatch", "x"), 7, typepb.RateLimitUnit_HOUR)))
	if err != nil {
		t.Fatal(err)
	}
	f := got.DynamicMetadata.GetFields()
	if m := f["metadata"].GetStructValue().AsMap(); !reflect.DeepEqual(m, map[string]any{"plan": map[string]any{"extra": true}, "region": "us"}) {
		t.Errorf("metadata with tier over: %v", m)
	}
	if h := f["hitsAddend"].GetNumberValue(); h != 2 {
		t.Errorf("hitsAddend %v, want 2", h)
	}
	lim := f["descriptors"].GetListValue().GetValues()[2].GetStructValue().GetFields()["limit"].GetStringValue()
	var o commonpb.RateLimitDescriptor_RateLimitOverride
	if err := prototext.Unmarshal([]byte(lim), &o); err != nil || o.RequestsPerUnit != 7 || o.Unit != typepb.RateLimitUnit_HOUR {
		t.Errorf("override as text %q: %v %v", lim, &o, err)
	}
	// Off: no dynamic metadata.
	e = newEnv(t, limiter.Options{}, server.Options{})
	if got, _ := e.rls.ShouldRateLimit(ctx(t), req(0, d("tier", "a"))); got.GetDynamicMetadata() != nil {
		t.Errorf("dynamic metadata without the option: %v", got.DynamicMetadata)
	}
}

func TestHTTP_IETFHeaders(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{IETFHeaders: true})
	r := e.do(t, http.MethodPost, "/v1/check", `{"domain":"e2e","key":"tier","value":"z"}`)
	if got := r.header.Get("RateLimit-Policy"); got != `"tier_second";q=2;w=1, "tier_minute";q=3;w=60` {
		t.Errorf("RateLimit-Policy %q", got)
	}
	if got := r.header.Get("RateLimit"); got != `"tier_second";r=1;t=1, "tier_minute";r=2;t=60` {
		t.Errorf("RateLimit %q", got)
	}
	// /json carries them in response_headers_to_add.
	r = e.do(t, http.MethodPost, "/json", `{"domain":"e2e","descriptors":[{"entries":[{"key":"remote_address","value":"1.2.3.4"}]}]}`)
	if hs, _ := r.body["responseHeadersToAdd"].([]any); len(hs) != 2 || !strings.Contains(hs[1].(map[string]any)["value"].(string), `"per_ip";r=1;t=60`) {
		t.Errorf("/json headers: %v", r.body["responseHeadersToAdd"])
	}
	// Without the option, none.
	e = newEnv(t, limiter.Options{}, server.Options{})
	if r := e.do(t, http.MethodPost, "/v1/check", `{"domain":"e2e","key":"tier","value":"z"}`); r.header.Get("RateLimit") != "" {
		t.Errorf("RateLimit without the option: %q", r.header.Get("RateLimit"))
	}
}
