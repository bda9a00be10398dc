package server

import (
	"context"
	"errors"
	"unicode/utf8"
	"unsafe"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
)

// Envoy's requests skip the proto message tree: the gRPC service below
// hands the codec a pooled call, which the codec fills straight from the
// wire (one copy of the message, entry strings aliasing that copy), and
// the answer goes back as wire bytes (see appendResponse), so a call
// costs Sluice no allocation.

// rlsService is rlspb's RateLimitService description with a handler that
// decodes into a pooled call. Same names and metadata, so reflection and
// clients see no difference.
var rlsService = grpc.ServiceDesc{
	ServiceName: "envoy.service.ratelimit.v3.RateLimitService",
	HandlerType: (*rlspb.RateLimitServiceServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "ShouldRateLimit",
		Handler:    shouldRateLimitHandler,
	}},
	Metadata: "envoy/service/ratelimit/v3/rls.proto",
}

const shouldRateLimitMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

func shouldRateLimitHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	s := srv.(*RLS)
	c := s.calls.Get().(*call)
	defer s.release(c)
	if err := dec(c); err != nil {
		return nil, err
	}
	if c.unknown.n > 0 {
		c.unknown.report(s.opts.OnIgnoredField)
	}
	handle := s.handle
	if c.invalid != nil {
		// past the bounds: answered through the interceptors, which count it
		handle = refuseCall
	}
	if interceptor == nil {
		return handle(ctx, c)
	}
	return interceptor(ctx, c, s.info, handle)
}

// refuseCall answers a call the codec stopped decoding at the bounds.
func refuseCall(_ context.Context, c any) (any, error) {
	return nil, grpcError(c.(*call).invalid)
}

// codec decodes a *call and encodes a *reply itself, checks the shape of
// a *bounded message's wire form before the proto codec decodes it, and
// leaves every other message to the proto codec.
type codec struct {
	proto encoding.CodecV2
	// bounds stop the decoding of a *call
	bounds bounds
}

func newCodec(b bounds) codec {
	return codec{proto: encoding.GetCodecV2("proto"), bounds: b}
}

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*reply); ok {
		return r.buffers(), nil
	}
	return c.proto.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *call:
		return c.unmarshalCall(data, m)
	case *bounded:
		return m.unmarshal(data)
	}
	return c.proto.Unmarshal(data, v)
}

// unmarshalCall decodes Envoy's request into cl. A request past the
// bounds is not an error of the codec's (gRPC would answer INTERNAL): it
// is left in cl.invalid, for the handler to answer INVALID_ARGUMENT.
func (c codec) unmarshalCall(data mem.BufferSlice, cl *call) error {
	cl.invalid = nil
	n := data.Len()
	if cap(cl.buf) < n {
		cl.buf = make([]byte, n)
	}
	cl.buf = cl.buf[:n]
	data.CopyTo(cl.buf)
	err := decodeRLS(&cl.req, cl.buf, cl.domain, c.bounds, &cl.unknown)
	if cl.req.Domain != "" {
		cl.domain = cl.req.Domain
	}
	if inv, ok := err.(*limiter.InvalidError); ok {
		cl.invalid, err = inv, nil
	}
	return err
}

func (codec) Name() string { return "proto" }

// errWire is what proto.Unmarshal would refuse.
var errWire = errors.New("cannot parse invalid wire-format data")

// decodeRLS fills r from b, the wire form of an Envoy RateLimitRequest,
// as proto.Unmarshal and fillRequest would: it refuses what proto.Unmarshal
// refuses (bad wire data, invalid UTF-8) and skips unknown fields,
// recording them in u. Entry
// keys and values alias b, so r must not outlive b; the domain is a copy
// (observers may keep it), or prev when equal to it, which saves the copy.
// It stops at the first descriptor or entry past lim with an
// *limiter.InvalidError, so a request holds no more than lim whatever its
// size.
func decodeRLS(r *limiter.Request, b []byte, prev string, lim bounds, u *unknownFields) error {
	r.Reset()
	*u = unknownFields{}
	return eachField(b, msgRequest, u, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := consumeString(b)
			if n >= 0 {
				if string(v) == prev {
					r.Domain = prev
				} else {
					r.Domain = string(v)
				}
			}
			return n, nil
		case num == 2 && typ == protowire.BytesType:
			i := len(r.Descriptors)
			if i == lim.descriptors {
				return 0, limiter.TooManyDescriptors(i)
			}
			return message(b, func(v []byte) error { return decodeDescriptor(r.AddDescriptor(), i, lim.entries, v, u) })
		case num == 3 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			r.HitsAddend = uint64(uint32(v))
			return n, nil
		}
		return 0, nil
	})
}

// decodeDescriptor decodes a RateLimitDescriptor, the request's i-th,
// into d, stopping past maxEntries entries. Repeated occurrences of limit
// and hits_addend merge, as in proto.
func decodeDescriptor(d *limiter.Descriptor, i, maxEntries int, b []byte, u *unknownFields) error {
	negative := false
	err := eachField(b, msgDescriptor, u, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case num == 1 && typ == protowire.BytesType:
			if len(d.Entries) == maxEntries {
				return 0, limiter.TooManyEntries(i, maxEntries)
			}
			return message(b, func(v []byte) error {
				e, err := decodeEntry(v, u)
				d.Entries = append(d.Entries, e)
				return err
			})
		case num == 2 && typ == protowire.BytesType:
			return message(b, func(v []byte) error { return decodeOverride(&d.Override, v, u) })
		case num == 3 && typ == protowire.BytesType:
			return message(b, func(v []byte) error {
				w, set, err := decodeWrapper(v, msgUInt64, u)
				if set {
					d.Cost = w
				}
				d.HasCost = true
				return err
			})
		case num == 4 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			negative = v != 0
			return n, nil
		}
		return 0, nil
	})
	d.Kind = kind(d.HasCost, d.Cost, negative)
	return err
}

// kind is how an Envoy descriptor's cost counts: is_negative_hits gives it
// back; a hits_addend of its own above 0 is a charge (Envoy Gateway's
// cost, apply_on_stream_done: usage recorded whole, past the limit too);
// anything else is the request's own hits.
func kind(hasCost bool, cost uint64, negative bool) limiter.Kind {
	switch {
	case negative:
		return limiter.Refund
	case hasCost && cost > 0:
		return limiter.Charge
	}
	return limiter.Hits
}

// decodeEntry decodes a RateLimitDescriptor.Entry; its strings alias b.
func decodeEntry(b []byte, u *unknownFields) (config.Entry, error) {
	var e config.Entry
	err := eachField(b, msgEntry, u, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if (num != 1 && num != 2) || typ != protowire.BytesType {
			return 0, nil
		}
		v, n := consumeString(b)
		if num == 1 {
			e.Key = alias(v)
		} else {
			e.Value = alias(v)
		}
		return n, nil
	})
	return e, err
}

// decodeOverride decodes a RateLimitOverride into o, merging.
func decodeOverride(o *limiter.Override, b []byte, u *unknownFields) error {
	return eachField(b, msgOverride, u, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			o.RequestsPerUnit = uint32(v)
			return n, nil
		case num == 2 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			o.Unit = config.Unit(int32(v))
			return n, nil
		case num == 3 && typ == protowire.BytesType:
			return message(b, func(v []byte) error {
				w, set, err := decodeWrapper(v, msgUInt32, u)
				if set {
					o.UnitMultiplier = uint32(w)
				}
				return err
			})
		}
		return 0, nil
	})
}

// decodeWrapper decodes a UInt64Value or UInt32Value (msg): its value,
// and whether the message set it.
func decodeWrapper(b []byte, msg string, u *unknownFields) (v uint64, set bool, err error) {
	err = eachField(b, msg, u, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if num != 1 || typ != protowire.VarintType {
			return 0, nil
		}
		var n int
		v, n = protowire.ConsumeVarint(b)
		set = true
		return n, nil
	})
	return v, set, err
}

// eachField walks the fields of message b, a msg. For each it calls fn
// with the field's number and type and the bytes after its tag; fn
// returns how many of them the field's value took, 0 to have the field
// skipped (and recorded in u as unknown), or a negative count for bad
// wire data (fn's other effects then do not matter: the message is
// refused).
func eachField(b []byte, msg string, u *unknownFields, fn func(num protowire.Number, typ protowire.Type, b []byte) (int, error)) error {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return errWire
		}
		b = b[n:]
		n, err := fn(num, typ, b)
		if err != nil {
			return err
		}
		if n == 0 {
			n = protowire.ConsumeFieldValue(num, typ, b)
			u.add(msg, num)
		}
		if n < 0 {
			return errWire
		}
		b = b[n:]
	}
	return nil
}

// message consumes a length-delimited field and hands its bytes to fn.
func message(b []byte, fn func(v []byte) error) (int, error) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return n, nil
	}
	return n, fn(v)
}

// consumeTag is protowire.ConsumeTag refusing field numbers above the
// maximum, as proto.Unmarshal does.
func consumeTag(b []byte) (protowire.Number, protowire.Type, int) {
	num, typ, n := protowire.ConsumeTag(b)
	if n >= 0 && num > protowire.MaxValidNumber {
		return 0, 0, -1
	}
	return num, typ, n
}

// consumeString is protowire.ConsumeBytes refusing invalid UTF-8, as
// proto.Unmarshal does for proto3 strings.
func consumeString(b []byte) ([]byte, int) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 || !utf8.Valid(v) {
		return nil, -1
	}
	return v, n
}

// alias returns b as a string without copying; b must not change while
// the string is in use.
func alias(b []byte) string {
	return unsafe.String(unsafe.SliceData(b), len(b))
}
