package server

import (
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The messages of Envoy's request, as Options.OnIgnoredField names them.
const (
	msgRequest    = "envoy.service.ratelimit.v3.RateLimitRequest"
	msgDescriptor = "envoy.extensions.common.ratelimit.v3.RateLimitDescriptor"
	msgEntry      = "envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.Entry"
	msgOverride   = "envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.RateLimitOverride"
	msgUInt64     = "google.protobuf.UInt64Value"
	msgUInt32     = "google.protobuf.UInt32Value"
)

// maxUnknown is how many distinct unknown fields one request reports.
const maxUnknown = 8

// unknownFields are the fields of a request that Sluice does not read
// (numbers its version of the proto does not define, or a known number
// with another wire type, which proto.Unmarshal keeps as unknown too):
// the first maxUnknown distinct ones. Its zero value is empty.
type unknownFields struct {
	n int
	f [maxUnknown]unknownField
}

type unknownField struct {
	msg string
	num protowire.Number
}

// add records the field num of msg; a nil u records nothing.
func (u *unknownFields) add(msg string, num protowire.Number) {
	if u == nil {
		return
	}
	for _, f := range u.f[:u.n] {
		if f.msg == msg && f.num == num {
			return
		}
	}
	if u.n < maxUnknown {
		u.f[u.n] = unknownField{msg, num}
		u.n++
	}
}

// report tells fn each field, if fn is set.
func (u *unknownFields) report(fn func(message string, number int32)) {
	if fn == nil {
		return
	}
	for _, f := range u.f[:u.n] {
		fn(f.msg, int32(f.num))
	}
}

// unknownOf records the unknown fields of in and of its messages, which
// proto.Unmarshal kept aside.
func unknownOf(in *rlspb.RateLimitRequest, u *unknownFields) {
	*u = unknownFields{}
	rawUnknown(in.ProtoReflect(), msgRequest, u)
	for _, d := range in.GetDescriptors() {
		rawUnknown(d.ProtoReflect(), msgDescriptor, u)
		for _, e := range d.GetEntries() {
			rawUnknown(e.ProtoReflect(), msgEntry, u)
		}
		if h := d.GetHitsAddend(); h != nil {
			rawUnknown(h.ProtoReflect(), msgUInt64, u)
		}
		if o := d.GetLimit(); o != nil {
			rawUnknown(o.ProtoReflect(), msgOverride, u)
			if m := o.GetUnitMultiplier(); m != nil {
				rawUnknown(m.ProtoReflect(), msgUInt32, u)
			}
		}
	}
}

func rawUnknown(m protoreflect.Message, msg string, u *unknownFields) {
	b := m.GetUnknown()
	for len(b) > 0 {
		num, _, n := protowire.ConsumeField(b)
		if n < 0 {
			return
		}
		u.add(msg, num)
		b = b[n:]
	}
}
