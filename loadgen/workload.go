package loadgen

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	ratelimitpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// Workloads names the built-in workloads, for flag help.
const Workloads = "distinct, hot, multi"

// Workload returns the requests of a built-in workload for domain, values
// spread over keys distinct values:
//
//   - distinct: one descriptor {k: V}, V cycling through keys values;
//   - hot: one descriptor {hot: hot}, the same on every request;
//   - multi: four descriptors {k1: V} {k2: V} {k3: V} {k4: V}, V cycling.
//
// Workers send the requests in turn, each starting at a different offset.
func Workload(name, domain string, keys int) ([]*rlspb.RateLimitRequest, error) {
	if keys < 1 {
		return nil, fmt.Errorf("loadgen: keys must be at least 1, not %d", keys)
	}
	switch name {
	case "distinct":
		reqs := make([]*rlspb.RateLimitRequest, keys)
		for i := range reqs {
			reqs[i] = request(domain, []string{"k"}, strconv.Itoa(i))
		}
		return reqs, nil
	case "hot":
		return []*rlspb.RateLimitRequest{request(domain, []string{"hot"}, "hot")}, nil
	case "multi":
		reqs := make([]*rlspb.RateLimitRequest, keys)
		for i := range reqs {
			reqs[i] = request(domain, []string{"k1", "k2", "k3", "k4"}, strconv.Itoa(i))
		}
		return reqs, nil
	}
	return nil, fmt.Errorf("loadgen: unknown workload %q (want one of %s, or a request file)", name, Workloads)
}

// request has one single-entry descriptor per key, each with value v.
func request(domain string, keys []string, v string) *rlspb.RateLimitRequest {
	req := &rlspb.RateLimitRequest{Domain: domain}
	for _, k := range keys {
		req.Descriptors = append(req.Descriptors, &ratelimitpb.RateLimitDescriptor{
			Entries: []*ratelimitpb.RateLimitDescriptor_Entry{{Key: k, Value: v}},
		})
	}
	return req
}

// ReadRequests reads requests from a JSON or YAML file (by extension:
// .yaml and .yml are YAML) holding one RateLimitRequest or a list of them,
// in the proto's JSON form:
//
//	domain: bench
//	descriptors:
//	  - entries: [{key: path, value: /api}]
func ReadRequests(path string) ([]*rlspb.RateLimitRequest, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	if ext := strings.ToLower(filepath.Ext(path)); ext == ".yaml" || ext == ".yml" {
		var v any
		if err := yaml.Unmarshal(b, &v); err != nil {
			return nil, fmt.Errorf("loadgen: %s: %w", path, err)
		}
		if b, err = json.Marshal(v); err != nil {
			return nil, fmt.Errorf("loadgen: %s: %w", path, err)
		}
	}
	var list []json.RawMessage
	if err := json.Unmarshal(b, &list); err != nil {
		list = []json.RawMessage{b}
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("loadgen: %s: no requests", path)
	}
	reqs := make([]*rlspb.RateLimitRequest, len(list))
	for i, raw := range list {
		reqs[i] = &rlspb.RateLimitRequest{}
		if err := protojson.Unmarshal(raw, reqs[i]); err != nil {
			return nil, fmt.Errorf("loadgen: %s: request %d: %w", path, i, err)
		}
	}
	return reqs, nil
}
