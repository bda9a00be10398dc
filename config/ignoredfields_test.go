package config

import (
	"slices"
	"testing"

	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// TestIgnoredFields_EveryFieldIsMapped: every field of this version of
// the pushed proto is one the compiler uses. A newer go-control-plane
// with a new field fails here until ratelimitconfig.go maps it (or the
// field is left out of rateLimitConfigFields, and reported as ignored).
func TestIgnoredFields_EveryFieldIsMapped(t *testing.T) {
	var fields []protoreflect.FullName
	var walk func(m protoreflect.MessageDescriptor)
	walked := map[protoreflect.FullName]bool{}
	walk = func(m protoreflect.MessageDescriptor) {
		if walked[m.FullName()] || m.ParentFile().Package() != "ratelimit.config.ratelimit.v3" {
			return
		}
		walked[m.FullName()] = true
		for i := range m.Fields().Len() {
			fd := m.Fields().Get(i)
			fields = append(fields, fd.FullName())
			if fd.Message() != nil {
				walk(fd.Message())
			}
		}
	}
	walk((&ratelimitpb.RateLimitConfig{}).ProtoReflect().Descriptor())
	for _, f := range fields {
		if !rateLimitConfigFields[f] {
			t.Errorf("%s is neither mapped nor in rateLimitConfigFields", f)
		}
	}
	if len(fields) != len(rateLimitConfigFields) {
		t.Errorf("the proto has %d fields, rateLimitConfigFields %d", len(fields), len(rateLimitConfigFields))
	}
}

// unknownField adds an unknown varint field num to m, as a newer control
// plane's field arrives.
func unknownField(m proto.Message, num protowire.Number) {
	r := m.ProtoReflect()
	b := protowire.AppendTag(r.GetUnknown(), num, protowire.VarintType)
	r.SetUnknown(protoreflect.RawFields(protowire.AppendVarint(b, 1)))
}

// TestIgnoredFields_Unknown: fields of a newer proto, at any level, are
// named by message and number, each once; the configs of the tests,
// quota_mode and metadata included, have none.
func TestIgnoredFields_Unknown(t *testing.T) {
	if got := IgnoredFields([]*ratelimitpb.RateLimitConfig{edgeProto}); len(got) != 0 {
		t.Errorf("edgeProto: ignored %q", got)
	}
	newer := proto.Clone(edgeProto).(*ratelimitpb.RateLimitConfig)
	unknownField(newer, 4)
	unknownField(newer.Descriptors[0], 9)
	unknownField(newer.Descriptors[1].Descriptors[0], 9)
	unknownField(newer.Descriptors[1].Descriptors[0].RateLimit, 6)
	unknownField(newer.Descriptors[1].Descriptors[0].RateLimit.Replaces[0], 2)
	// Round-tripped as a server sends it.
	wire, err := proto.Marshal(newer)
	if err != nil {
		t.Fatal(err)
	}
	got := &ratelimitpb.RateLimitConfig{}
	if err := proto.Unmarshal(wire, got); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"ratelimit.config.ratelimit.v3.RateLimitConfig.4",
		"ratelimit.config.ratelimit.v3.RateLimitDescriptor.9",
		"ratelimit.config.ratelimit.v3.RateLimitPolicy.6",
		"ratelimit.config.ratelimit.v3.RateLimitReplace.2",
	}
	if names := IgnoredFields([]*ratelimitpb.RateLimitConfig{got, edgeProto}); !slices.Equal(names, want) {
		t.Errorf("ignored %q, want %q", names, want)
	}
}
