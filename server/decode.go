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
// wire (one copy of the message, entry strings aliasing that copy), so a
// request costs no allocation until the response is built.

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
	defer s.calls.Put(c)
	if err := dec(c); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return s.check(ctx, c)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: shouldRateLimitMethod}
	return interceptor(ctx, c, info, func(ctx context.Context, req any) (any, error) {
		return s.check(ctx, req.(*call))
	})
}

// codec decodes a *call itself and leaves every other message to the
// proto codec.
type codec struct {
	proto encoding.CodecV2
}

func newCodec() codec {
	return codec{proto: encoding.GetCodecV2("proto")}
}

func (c codec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	cl, ok := v.(*call)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	n := data.Len()
	if cap(cl.buf) < n {
		cl.buf = make([]byte, n)
	}
	cl.buf = cl.buf[:n]
	data.CopyTo(cl.buf)
	err := decodeRLS(&cl.req, cl.buf, cl.domain)
	if cl.req.Domain != "" {
		cl.domain = cl.req.Domain
	}
	return err
}

func (codec) Name() string { return "proto" }

// errWire is what proto.Unmarshal would refuse.
var errWire = errors.New("cannot parse invalid wire-format data")

// decodeRLS fills r from b, the wire form of an Envoy RateLimitRequest,
// as proto.Unmarshal and fillRequest would: it refuses what proto.Unmarshal
// refuses (bad wire data, invalid UTF-8) and skips unknown fields. Entry
// keys and values alias b, so r must not outlive b; the domain is a copy
// (observers may keep it), or prev when equal to it, which saves the copy.
func decodeRLS(r *limiter.Request, b []byte, prev string) error {
	r.Reset()
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return errWire
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := consumeString(b)
			if n < 0 {
				return errWire
			}
			if string(v) == prev {
				r.Domain = prev
			} else {
				r.Domain = string(v)
			}
			b = b[n:]
		case num == 2 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errWire
			}
			if err := decodeDescriptor(r.AddDescriptor(), v); err != nil {
				return err
			}
			b = b[n:]
		case num == 3 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return errWire
			}
			r.HitsAddend = uint64(uint32(v))
			b = b[n:]
		default:
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return errWire
			}
			b = b[n:]
		}
	}
	return nil
}

// decodeDescriptor decodes a RateLimitDescriptor into d. Repeated
// occurrences of limit and hits_addend merge, as in proto.
func decodeDescriptor(d *limiter.Descriptor, b []byte) error {
	negative := false
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return errWire
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errWire
			}
			e, err := decodeEntry(v)
			if err != nil {
				return err
			}
			d.Entries = append(d.Entries, e)
			b = b[n:]
		case num == 2 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errWire
			}
			if err := decodeOverride(&d.Override, v); err != nil {
				return err
			}
			b = b[n:]
		case num == 3 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errWire
			}
			w, set, err := decodeWrapper(v)
			if err != nil {
				return err
			}
			if set {
				d.Cost = w
			}
			d.HasCost = true
			b = b[n:]
		case num == 4 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return errWire
			}
			negative = v != 0
			b = b[n:]
		default:
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return errWire
			}
			b = b[n:]
		}
	}
	if negative {
		// Refunds are not applied: the descriptor is only checked.
		d.Cost, d.HasCost = 0, true
	}
	return nil
}

// decodeEntry decodes a RateLimitDescriptor.Entry; its strings alias b.
func decodeEntry(b []byte) (config.Entry, error) {
	var e config.Entry
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return e, errWire
		}
		b = b[n:]
		if (num == 1 || num == 2) && typ == protowire.BytesType {
			v, n := consumeString(b)
			if n < 0 {
				return e, errWire
			}
			if num == 1 {
				e.Key = alias(v)
			} else {
				e.Value = alias(v)
			}
			b = b[n:]
			continue
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return e, errWire
		}
		b = b[n:]
	}
	return e, nil
}

// decodeOverride decodes a RateLimitOverride into o, merging.
func decodeOverride(o *limiter.Override, b []byte) error {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return errWire
		}
		b = b[n:]
		switch {
		case (num == 1 || num == 2) && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return errWire
			}
			if num == 1 {
				o.RequestsPerUnit = uint32(v)
			} else {
				o.Unit = config.Unit(int32(v))
			}
			b = b[n:]
		case num == 3 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errWire
			}
			w, set, err := decodeWrapper(v)
			if err != nil {
				return err
			}
			if set {
				o.UnitMultiplier = uint32(w)
			}
			b = b[n:]
		default:
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return errWire
			}
			b = b[n:]
		}
	}
	return nil
}

// decodeWrapper decodes a UInt64Value or UInt32Value: its value, and
// whether the message set it.
func decodeWrapper(b []byte) (uint64, bool, error) {
	var v uint64
	set := false
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return 0, false, errWire
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			if v, n = protowire.ConsumeVarint(b); n < 0 {
				return 0, false, errWire
			}
			set = true
		} else if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return 0, false, errWire
		}
		b = b[n:]
	}
	return v, set, nil
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
