package server

import (
	"strings"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/limiter"
)

// deterministic marshals dynamic_metadata's maps in a fixed order.
var deterministic = proto.MarshalOptions{Deterministic: true}

// appendMetadata appends RateLimitResponse.dynamic_metadata for the
// answer r to req, as envoyproxy/ratelimit fills it with
// RESPONSE_DYNAMIC_METADATA.
// A metadata that does not marshal (it cannot: strings are valid UTF-8)
// is left out rather than failing the answer.
func appendMetadata(b []byte, req *limiter.Request, r *limiter.Response) []byte {
	start := len(b)
	b, at := beginMessage(b, respDynamicMetadata)
	out, err := deterministic.MarshalAppend(b, dynamicMetadata(req, r))
	if err != nil {
		return b[:start]
	}
	return endMessage(out, at)
}

// dynamicMetadata is the reference's dynamic metadata: "domain", a
// "descriptors" list (each with "entries" as "key=value" strings, its
// "limit" override as proto text and its own "hitsAddend" when set), the
// request's "hitsAddend" unless 0, and "metadata": the merged metadata of
// the rules of the descriptors that passed, when there is any.
func dynamicMetadata(req *limiter.Request, r *limiter.Response) *structpb.Struct {
	fields := make(map[string]*structpb.Value, 4)
	fields["domain"] = structpb.NewStringValue(validUTF8(req.Domain))
	descs := make([]*structpb.Value, 0, len(req.Descriptors))
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		entries := make([]*structpb.Value, 0, len(d.Entries))
		for _, e := range d.Entries {
			entries = append(entries, structpb.NewStringValue(validUTF8(e.Key+"="+e.Value)))
		}
		df := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if o := d.Override; o != (limiter.Override{}) {
			pb := &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: o.RequestsPerUnit, Unit: typev3.RateLimitUnit(o.Unit)}
			if o.UnitMultiplier > 0 {
				pb.UnitMultiplier = wrapperspb.UInt32(o.UnitMultiplier)
			}
			df["limit"] = structpb.NewStringValue(pb.String())
		}
		if d.HasCost {
			df["hitsAddend"] = structpb.NewNumberValue(float64(d.Cost))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: df}))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: descs})
	if req.HitsAddend != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(req.HitsAddend))
	}
	if m := r.Metadata(); len(m) > 0 {
		if v, err := structpb.NewStruct(m); err == nil {
			fields["metadata"] = structpb.NewStructValue(v)
		}
	}
	return &structpb.Struct{Fields: fields}
}

// validUTF8 makes a request's string a valid proto string.
func validUTF8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
