package config

import (
	"slices"
	"strconv"

	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// rateLimitConfigFields are the fields of a pushed RateLimitConfig that
// CompileRateLimitConfigs uses (rateLimitConfigNode maps them onto a
// limits file's). A descriptor's metadata is used whole.
var rateLimitConfigFields = map[protoreflect.FullName]bool{
	"ratelimit.config.ratelimit.v3.RateLimitConfig.name":                true,
	"ratelimit.config.ratelimit.v3.RateLimitConfig.domain":              true,
	"ratelimit.config.ratelimit.v3.RateLimitConfig.descriptors":         true,
	"ratelimit.config.ratelimit.v3.RateLimitDescriptor.key":             true,
	"ratelimit.config.ratelimit.v3.RateLimitDescriptor.value":           true,
	"ratelimit.config.ratelimit.v3.RateLimitDescriptor.rate_limit":      true,
	"ratelimit.config.ratelimit.v3.RateLimitDescriptor.descriptors":     true,
	"ratelimit.config.ratelimit.v3.RateLimitDescriptor.shadow_mode":     true,
	"ratelimit.config.ratelimit.v3.RateLimitDescriptor.detailed_metric": true,
	"ratelimit.config.ratelimit.v3.RateLimitDescriptor.quota_mode":      true,
	"ratelimit.config.ratelimit.v3.RateLimitDescriptor.metadata":        true,
	"ratelimit.config.ratelimit.v3.RateLimitPolicy.unit":                true,
	"ratelimit.config.ratelimit.v3.RateLimitPolicy.requests_per_unit":   true,
	"ratelimit.config.ratelimit.v3.RateLimitPolicy.unlimited":           true,
	"ratelimit.config.ratelimit.v3.RateLimitPolicy.name":                true,
	"ratelimit.config.ratelimit.v3.RateLimitPolicy.replaces":            true,
	"ratelimit.config.ratelimit.v3.RateLimitReplace.name":               true,
}

// metadataField is the field whose value, a Struct, is used whole.
const metadataField = "ratelimit.config.ratelimit.v3.RateLimitDescriptor.metadata"

// IgnoredFields names the fields of resources that
// CompileRateLimitConfigs does not use, each once, sorted: a field the
// compiled proto defines but the compiler does not map, by its full name
// (ratelimit.config.ratelimit.v3.RateLimitDescriptor.quota_mode), and a
// field it does not define (an unknown field, from a newer control
// plane's proto), by its message's full name and its number
// (ratelimit.config.ratelimit.v3.RateLimitDescriptor.9). Descriptors
// nested deeper than the compiler accepts are not walked.
func IgnoredFields(resources []*ratelimitpb.RateLimitConfig) []string {
	seen := map[string]bool{}
	for _, r := range resources {
		ignoredIn(r.ProtoReflect(), seen, 0)
	}
	out := make([]string, 0, len(seen))
	for f := range seen {
		out = append(out, f)
	}
	slices.Sort(out)
	return out
}

func ignoredIn(m protoreflect.Message, seen map[string]bool, depth int) {
	if depth > maxDepth+2 {
		return
	}
	for b := m.GetUnknown(); len(b) > 0; {
		num, _, n := protowire.ConsumeField(b)
		if n < 0 {
			break
		}
		seen[string(m.Descriptor().FullName())+"."+strconv.Itoa(int(num))] = true
		b = b[n:]
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case !rateLimitConfigFields[fd.FullName()]:
			seen[string(fd.FullName())] = true
		case fd.FullName() == metadataField || fd.Message() == nil:
		case fd.IsList():
			for i := range v.List().Len() {
				ignoredIn(v.List().Get(i).Message(), seen, depth+1)
			}
		default:
			ignoredIn(v.Message(), seen, depth+1)
		}
		return true
	})
}
