package server

import (
	"context"
	"errors"
	"fmt"
	"slices"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"

	"github.com/sluicehq/sluice/limiter"
)

// FillRequest is the proto message's translation, which DecodeRLS is
// checked against.
var FillRequest = fillRequest

// DecodeRLS is the gRPC codec's decoding of Envoy's request, stopped at
// maxDescriptors and maxEntries, its unknown fields dropped.
func DecodeRLS(r *limiter.Request, b []byte, prev string, maxDescriptors, maxEntries int) error {
	var u unknownFields
	return decodeRLS(r, b, prev, bounds{descriptors: maxDescriptors, entries: maxEntries}, &u)
}

// JSONShape checks the shape of a RateLimitRequest's or a CheckRequest's
// JSON form against maxDescriptors and maxEntries.
func JSONShape(body []byte, maxDescriptors, maxEntries int) error {
	return jsonShape(body, bounds{descriptors: maxDescriptors, entries: maxEntries})
}

// WireShape checks the shape of a RateLimitRequest's or a CheckRequest's
// wire form against maxDescriptors and maxEntries.
func WireShape(wire []byte, maxDescriptors, maxEntries int) error {
	sh := requestShape(bounds{descriptors: maxDescriptors, entries: maxEntries})
	return sh.check(wire)
}

// NewCallDecoder returns the gRPC codec's decoding of wire into one
// reused call, and that call's request; a request past the default bounds
// is the error.
func NewCallDecoder(wire []byte) (func() error, *limiter.Request) {
	c, cl := newCodec(bounds{descriptors: limiter.DefaultMaxDescriptors, entries: limiter.DefaultMaxEntries}), new(call)
	data := mem.BufferSlice{mem.SliceBuffer(wire)}
	return func() error {
		if err := c.Unmarshal(data, cl); err != nil {
			return err
		}
		if cl.invalid != nil {
			return cl.invalid
		}
		return nil
	}, &cl.req
}

// NewCall returns what gRPC does with one call of Envoy's ShouldRateLimit
// on s whose request is wire: the handler (through interceptor unless
// nil) decodes it with the codec and answers, the codec marshals the
// answer, and the buffers are freed once out has seen their bytes.
func NewCall(s *RLS, wire []byte, interceptor grpc.UnaryServerInterceptor, out func([]byte)) func() error {
	c := newCodec(s.bounds)
	data := mem.BufferSlice{mem.SliceBuffer(wire)}
	dec := func(v any) error { return c.Unmarshal(data, v) }
	ctx := context.Background()
	return func() error {
		v, err := shouldRateLimitHandler(s, ctx, dec, interceptor)
		if err != nil {
			return err
		}
		bufs, err := c.Marshal(v)
		if err != nil {
			return err
		}
		defer bufs.Free()
		if len(bufs) != 1 {
			return errors.New("want one buffer")
		}
		out(bufs[0].ReadOnlyData())
		return nil
	}
}

// UnknownFields are the unknown fields of Envoy's request wire as the
// codec records them and as read from the message proto.Unmarshal
// makes, each "message.number", sorted.
func UnknownFields(wire []byte) (decoded, fromProto []string, err error) {
	var r limiter.Request
	var u unknownFields
	if err := decodeRLS(&r, wire, "", bounds{descriptors: -1, entries: -1}, &u); err != nil {
		return nil, nil, err
	}
	in := new(rlspb.RateLimitRequest)
	if err := proto.Unmarshal(wire, in); err != nil {
		return nil, nil, err
	}
	var p unknownFields
	unknownOf(in, &p)
	names := func(u *unknownFields) []string {
		var out []string
		u.report(func(m string, n int32) { out = append(out, fmt.Sprintf("%s.%d", m, n)) })
		slices.Sort(out)
		return out
	}
	return names(&u), names(&p), nil
}

// MaxUnknown is how many unknown fields a request reports.
const MaxUnknown = maxUnknown

// AppendResponse is the encoder of Envoy's response.
func (s *RLS) AppendResponse(b []byte, r *limiter.Response) []byte {
	return s.appendResponse(b, nil, r)
}

// BuildResponse is the message builder appendResponse is checked against.
var BuildResponse = buildResponse
