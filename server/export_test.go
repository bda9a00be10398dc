package server

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"

	"github.com/sluicehq/sluice/limiter"
)

// DecodeRLS and FillRequest expose the two decodings of Envoy's request
// for comparison.
var (
	DecodeRLS   = decodeRLS
	FillRequest = fillRequest
)

// NewCallDecoder returns the gRPC codec's decoding of wire into one
// reused call, and that call's request.
func NewCallDecoder(wire []byte) (func() error, *limiter.Request) {
	c, cl := newCodec(), new(call)
	data := mem.BufferSlice{mem.SliceBuffer(wire)}
	return func() error { return c.Unmarshal(data, cl) }, &cl.req
}

// NewCall returns what gRPC does with one call of Envoy's ShouldRateLimit
// on s whose request is wire: the handler (through interceptor unless
// nil) decodes it with the codec and answers, the codec marshals the
// answer, and the buffers are freed once out has seen their bytes.
func NewCall(s *RLS, wire []byte, interceptor grpc.UnaryServerInterceptor, out func([]byte)) func() error {
	c := newCodec()
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

// AppendResponse is the encoder of Envoy's response.
func (s *RLS) AppendResponse(b []byte, r *limiter.Response) []byte {
	return s.appendResponse(b, nil, r)
}

// BuildResponse is the message builder appendResponse is checked against.
var BuildResponse = buildResponse
