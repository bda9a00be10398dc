package main

import (
	"os"
	"path/filepath"
	"testing"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestServe_Peeks replays the reference's
// integration-test/scripts/token-quota.sh over gRPC: a limit of 2, a peek
// (the descriptor's own hits_addend 0) on each request and a charge of 1
// when its stream is done. By default requests 1 to 3 pass and the 4th is
// refused, as on the reference, and the peek at the limit is OK with
// nothing remaining; with --strict-peeks or SLUICE_STRICT_PEEKS=true the
// 3rd is refused. (A limit per year: no window ends during the test.)
func TestServe_Peeks(t *testing.T) {
	dir := t.TempDir()
	limits := "domain: quota\ndescriptors:\n  - key: user\n    rate_limit: {unit: year, requests_per_unit: 2}\n"
	if err := os.WriteFile(filepath.Join(dir, "limits.yaml"), []byte(limits), 0o644); err != nil {
		t.Fatal(err)
	}
	call := func(hits uint64) *rlspb.RateLimitRequest {
		r := rlsRequest("quota", "user", "alice")
		r.Descriptors[0].HitsAddend = wrapperspb.UInt64(hits)
		return r
	}
	for _, c := range []struct {
		name     string
		env      serveEnv
		args     []string
		admitted int
	}{
		{"default", nil, nil, 3},
		{"--strict-peeks", nil, []string{"--strict-peeks"}, 2},
		{"SLUICE_STRICT_PEEKS", serveEnv{"SLUICE_STRICT_PEEKS": "true"}, nil, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			grpcAddr, _, _ := startServe(t, c.env, append([]string{"--config", dir}, c.args...)...)
			rls, _ := dialRLS(t, grpcAddr)
			ctx := testCtx(t)
			admitted := 0
			for i := range 5 {
				peek, err := rls.ShouldRateLimit(ctx, call(0))
				if err != nil {
					t.Fatalf("request %d: peek: %v", i+1, err)
				}
				st := peek.Statuses[0]
				if peek.OverallCode != rlspb.RateLimitResponse_OK {
					if st.LimitRemaining != 0 || st.DurationUntilReset.AsDuration() <= 0 {
						t.Errorf("request %d: refused peek %v", i+1, st)
					}
					break
				}
				if admitted == 2 && (st.LimitRemaining != 0 || st.DurationUntilReset.AsDuration() <= 0) {
					t.Errorf("request %d: peek at the limit %v, want nothing remaining and a reset", i+1, st)
				}
				admitted++
				if _, err := rls.ShouldRateLimit(ctx, call(1)); err != nil {
					t.Fatalf("request %d: charge: %v", i+1, err)
				}
			}
			if admitted != c.admitted {
				t.Errorf("%d requests admitted, want %d", admitted, c.admitted)
			}
		})
	}
}
