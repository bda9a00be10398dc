package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// CompileRateLimitConfigs compiles RateLimitConfig resources, the limits
// envoyproxy/ratelimit receives over xDS
// (type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig), into
// one Table, exactly as if each resource were a limits file with the same
// domain and descriptors: the same validation, matching and counter keys.
// The resources' order does not matter. Errors name the resource as their file (`resource "NAME"`, or
// `resources[i]` when it has no name) and the descriptor path and field;
// they have no line.
//
// The proto's unit UNKNOWN (0) is a rate_limit without unit, as in the
// reference. A descriptor's quota_mode and metadata (a Struct) are the
// limits file's quota_mode and metadata: the metadata's values are the
// JSON-like values a file's metadata reads to (numbers float64).
func CompileRateLimitConfigs(resources []*ratelimitpb.RateLimitConfig, opts Options) (*Table, error) {
	srcs := make([]source, 0, len(resources))
	marshal := proto.MarshalOptions{Deterministic: true}
	for i, res := range resources {
		name := fmt.Sprintf("resources[%d]", i)
		if res.GetName() != "" {
			name = "resource " + strconv.Quote(res.GetName())
		}
		data, err := marshal.Marshal(res)
		if err != nil {
			return nil, &Errors{List: []Error{{File: name, Msg: err.Error()}}}
		}
		srcs = append(srcs, source{name: name, id: res.GetName(), data: data, root: rateLimitConfigNode(res)})
	}
	// A server lists the resources in any order: the table (its hash,
	// which definition of a merged domain comes first) must not depend
	// on it.
	slices.SortStableFunc(srcs, func(a, b source) int { return strings.Compare(a.id, b.id) })
	return compile(srcs, opts, nil)
}

// rateLimitConfigNode writes a RateLimitConfig as the YAML a limits file
// with its content parses to.
func rateLimitConfigNode(c *ratelimitpb.RateLimitConfig) *yaml.Node {
	m := mapping()
	addField(m, "domain", str(c.GetDomain()))
	if ds := c.GetDescriptors(); len(ds) > 0 {
		addField(m, "descriptors", descriptorsNode(ds, 1))
	}
	return m
}

func descriptorsNode(ds []*ratelimitpb.RateLimitDescriptor, depth int) *yaml.Node {
	seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	if depth > maxDepth+1 {
		// Deep enough for the loader to report; deeper protos (the
		// decoder allows 10,000 levels) are not walked.
		return seq
	}
	for _, d := range ds {
		m := mapping()
		addField(m, "key", str(d.GetKey()))
		if d.GetValue() != "" {
			addField(m, "value", str(d.GetValue()))
		}
		if rl := d.GetRateLimit(); rl != nil {
			addField(m, "rate_limit", policyNode(rl))
		}
		if sub := d.GetDescriptors(); len(sub) > 0 {
			addField(m, "descriptors", descriptorsNode(sub, depth+1))
		}
		if d.GetShadowMode() {
			addField(m, "shadow_mode", boolean(true))
		}
		if d.GetDetailedMetric() {
			addField(m, "detailed_metric", boolean(true))
		}
		if d.GetQuotaMode() {
			addField(m, "quota_mode", boolean(true))
		}
		if md := d.GetMetadata(); md != nil {
			addField(m, "metadata", structNode(md, 0))
		}
		seq.Content = append(seq.Content, m)
	}
	return seq
}

func policyNode(p *ratelimitpb.RateLimitPolicy) *yaml.Node {
	m := mapping()
	if u := p.GetUnit(); u != ratelimitpb.RateLimitUnit_UNKNOWN {
		addField(m, "unit", str(unitName(u)))
	}
	addField(m, "requests_per_unit", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatUint(uint64(p.GetRequestsPerUnit()), 10)})
	if p.GetUnlimited() {
		addField(m, "unlimited", boolean(true))
	}
	if p.GetName() != "" {
		addField(m, "name", str(p.GetName()))
	}
	if rs := p.GetReplaces(); len(rs) > 0 {
		seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, r := range rs {
			rm := mapping()
			addField(rm, "name", str(r.GetName()))
			seq.Content = append(seq.Content, rm)
		}
		addField(m, "replaces", seq)
	}
	return m
}

// unitName is the limits-file unit of a proto unit; a number the proto
// does not define stays a number, which the loader reports as unknown.
func unitName(u ratelimitpb.RateLimitUnit) string {
	switch u {
	case ratelimitpb.RateLimitUnit_SECOND:
		return "second"
	case ratelimitpb.RateLimitUnit_MINUTE:
		return "minute"
	case ratelimitpb.RateLimitUnit_HOUR:
		return "hour"
	case ratelimitpb.RateLimitUnit_DAY:
		return "day"
	case ratelimitpb.RateLimitUnit_WEEK:
		return "week"
	case ratelimitpb.RateLimitUnit_MONTH:
		return "month"
	case ratelimitpb.RateLimitUnit_YEAR:
		return "year"
	}
	return strconv.Itoa(int(u))
}

// structNode writes a Struct as the YAML mapping a file's metadata with
// the same values is: strings quoted (so that "yes" stays a string),
// numbers as floats. Deeper than the loader allows, it stops (the loader
// reports the depth).
func structNode(s *structpb.Struct, depth int) *yaml.Node {
	m := mapping()
	if depth > maxDepth+1 {
		return m
	}
	keys := make([]string, 0, len(s.GetFields()))
	for k := range s.GetFields() {
		keys = append(keys, k)
	}
	slices.Sort(keys) // a deterministic node: the table's hash depends on it
	for _, k := range keys {
		addField(m, k, valueNode(s.GetFields()[k], depth+1))
	}
	return m
}

func valueNode(v *structpb.Value, depth int) *yaml.Node {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Style: yaml.DoubleQuotedStyle, Value: k.StringValue}
	case *structpb.Value_NumberValue:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!float", Value: strconv.FormatFloat(k.NumberValue, 'g', -1, 64)}
	case *structpb.Value_BoolValue:
		return boolean(k.BoolValue)
	case *structpb.Value_StructValue:
		return structNode(k.StructValue, depth)
	case *structpb.Value_ListValue:
		seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		if depth > maxDepth+1 {
			return seq
		}
		for _, e := range k.ListValue.GetValues() {
			seq.Content = append(seq.Content, valueNode(e, depth+1))
		}
		return seq
	}
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}
}

func mapping() *yaml.Node { return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"} }

func str(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s} }

func boolean(b bool) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(b)}
}

func addField(m *yaml.Node, name string, v *yaml.Node) {
	m.Content = append(m.Content, str(name), v)
}
