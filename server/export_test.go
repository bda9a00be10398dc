package server

import (
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
