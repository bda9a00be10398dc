package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"

	ratelimitpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/loadgen"
)

// ghzRequest is the one request both tools send in the cross-check.
var ghzRequest = &rlspb.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitpb.RateLimitDescriptor{
	{Entries: []*ratelimitpb.RateLimitDescriptor_Entry{{Key: "k", Value: "ghz"}}}}}

type ghzResult struct {
	RPS     float64 `json:"rps"`
	Average float64 `json:"average"` // ns
	Count   uint64  `json:"count"`
	Dist    []struct {
		Percentage float64 `json:"percentage"`
		Latency    float64 `json:"latency"` // ns
	} `json:"latencyDistribution"`
	StatusCodeDistribution map[string]uint64 `json:"statusCodeDistribution"`
}

// quantile returns ghz's latency at percentage p, in µs.
func (g ghzResult) quantile(p float64) float64 {
	for _, d := range g.Dist {
		if d.Percentage == p {
			return d.Latency / 1e3
		}
	}
	return 0
}

// crossCheckGhz runs ghz and then loadgen at the same fixed rate,
// concurrency and request against sluice. ghz finds the method through
// server reflection.
func crossCheckGhz(ctx context.Context, s settings, sl *server) (*crossCheck, error) {
	const conc = 50
	data, err := protojson.Marshal(ghzRequest)
	if err != nil {
		return nil, err
	}
	total := int((s.warmup + s.duration).Seconds() * s.ghzRate)
	out, err := exec.CommandContext(ctx, s.ghz, "--insecure", "--format", "json",
		"--call", "envoy.service.ratelimit.v3.RateLimitService.ShouldRateLimit",
		"-d", string(data), "--rps", strconv.Itoa(int(s.ghzRate)), "-c", strconv.Itoa(conc),
		"--connections", strconv.Itoa(s.connections), "-n", strconv.Itoa(total), sl.proc.GRPC).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("ghz: %w: %s", err, ee.Stderr)
		}
		return nil, fmt.Errorf("ghz: %w", err)
	}
	cc := &crossCheck{rate: s.ghzRate, concurrency: conc}
	if err := json.Unmarshal(out, &cc.ghz); err != nil {
		return nil, fmt.Errorf("ghz output: %w", err)
	}
	fmt.Fprintf(os.Stderr, "ghz    rate=%.0f  %8.0f req/s  p50 %7.0f µs  p99 %7.0f µs\n", s.ghzRate, cc.ghz.RPS, cc.ghz.quantile(50), cc.ghz.quantile(99))
	cc.bench, err = sl.measure(ctx, loadgen.Options{Requests: []*rlspb.RateLimitRequest{ghzRequest}, Concurrency: conc,
		Connections: s.connections, Duration: s.duration, Warmup: s.warmup, Rate: s.ghzRate})
	return cc, err
}
