package loadgen

import (
	"fmt"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// frame is a request marshalled once before the run. Sending it copies no
// bytes and allocates nothing in the codec.
type frame struct {
	wire        mem.BufferSlice
	descriptors int
}

func newFrame(req *rlspb.RateLimitRequest) (*frame, error) {
	b, err := proto.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("loadgen: marshal request: %w", err)
	}
	return &frame{wire: mem.BufferSlice{mem.SliceBuffer(b)}, descriptors: len(req.Descriptors)}, nil
}

// reply is what the generator keeps of a RateLimitResponse: the overall
// code and the number of statuses.
type reply struct {
	code     rlspb.RateLimitResponse_Code
	statuses int
}

// rawCodec sends frames as they are and scans replies without decoding
// them into messages. Its name is "proto", so the content type on the
// wire is the standard application/grpc+proto.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, fmt.Errorf("loadgen: cannot marshal %T", v)
	}
	// SliceBuffer's Free does nothing, so gRPC may release the slice
	// after each send and it stays valid for the next.
	return f.wire, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*reply)
	if !ok {
		return fmt.Errorf("loadgen: cannot unmarshal into %T", v)
	}
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData()
	} else {
		b = data.Materialize()
	}
	return r.scan(b)
}

// scan reads the overall code (field 1) and counts the statuses (field 2)
// of a wire-format RateLimitResponse, skipping everything else.
func (r *reply) scan(b []byte) error {
	*r = reply{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("loadgen: bad reply: %w", protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return fmt.Errorf("loadgen: bad reply: %w", protowire.ParseError(m))
			}
			r.code = rlspb.RateLimitResponse_Code(v)
			n = m
		case num == 2 && typ == protowire.BytesType:
			r.statuses++
			n = protowire.ConsumeFieldValue(num, typ, b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("loadgen: bad reply: %w", protowire.ParseError(n))
		}
		b = b[n:]
	}
	return nil
}
