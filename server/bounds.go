package server

import (
	"context"
	"encoding/json"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/gen/sluice/v1"
	"github.com/sluicehq/sluice/limiter"
)

// A request is refused at its bounds before it is decoded further, so
// that its size in memory is the bounds' and not the message's: a 1 MiB
// message of empty descriptors would otherwise become half a million of
// them before the limiter's Validate refused it. The gRPC codec's own
// decoding (decodeRLS) stops at the bounds; the wire form of a message
// the proto codec decodes, and the body of an HTTP request protojson
// decodes, are counted first (wireShape, jsonShape), without allocating.

// bounds are the most descriptors in one request and entries in one
// descriptor.
type bounds struct{ descriptors, entries int }

// limiterBounds returns lim's bounds; the defaults without a limiter (an
// RLS that only encodes).
func limiterBounds(lim *limiter.Limiter) bounds {
	if lim == nil {
		return bounds{descriptors: limiter.DefaultMaxDescriptors, entries: limiter.DefaultMaxEntries}
	}
	d, e := lim.Bounds()
	return bounds{descriptors: d, entries: e}
}

// shape bounds a message's repeated fields: at most maxOuter occurrences
// of the top-level field outer, and in each of them at most maxInner
// occurrences of the field that path leads to (entries in a descriptor:
// [1]; keys of a bucket id in an RLQS usage: [1, 1]). tooMany and
// tooManyInner make the errors.
type shape struct {
	outer        protowire.Number
	maxOuter     int
	path         []protowire.Number
	maxInner     int
	tooMany      func(max int) error
	tooManyInner func(i, max int) error
}

// requestShape is the shape of Envoy's RateLimitRequest and of our
// CheckRequest: descriptors (field 2) of entries (field 1).
func requestShape(b bounds) shape {
	return shape{outer: 2, maxOuter: b.descriptors, path: []protowire.Number{1}, maxInner: b.entries,
		tooMany:      func(max int) error { return limiter.TooManyDescriptors(max) },
		tooManyInner: func(i, max int) error { return limiter.TooManyEntries(i, max) }}
}

// check returns the error of the first field past the bounds in wire, or
// nil. Bad wire data ends the count: the decoding refuses it.
func (s *shape) check(wire []byte) error {
	n := 0
	var err error
	eachField(wire, "", nil, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if num != s.outer || typ != protowire.BytesType {
			return 0, nil
		}
		v, m := protowire.ConsumeBytes(b)
		if m < 0 {
			return m, nil
		}
		if n == s.maxOuter {
			err = s.tooMany(n)
			return 0, err
		}
		if count(v, s.path, s.maxInner) > s.maxInner {
			err = s.tooManyInner(n, s.maxInner)
			return 0, err
		}
		n++
		return m, nil
	})
	return err
}

// count counts the occurrences of the field path leads to in message b,
// merging repeated occurrences of the messages on the way as proto does;
// it stops once the count is past max.
func count(b []byte, path []protowire.Number, max int) int {
	n := 0
	eachField(b, "", nil, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if num != path[0] || typ != protowire.BytesType {
			return 0, nil
		}
		v, m := protowire.ConsumeBytes(b)
		if m < 0 {
			return m, nil
		}
		if len(path) == 1 {
			n++
		} else {
			n += count(v, path[1:], max-n)
		}
		if n > max {
			return 0, errStop
		}
		return m, nil
	})
	return n
}

// errStop ends a count early.
var errStop = &limiter.InvalidError{Reason: "stop"}

// bounded is a proto message the codec decodes only once the shape of
// its wire form is within bounds; err is the refusal otherwise, which the
// handler answers (a codec's own error gRPC would answer INTERNAL). It is
// the message itself to any other codec, which decodes it unchecked.
type bounded struct {
	proto.Message
	shape *shape
	err   error
}

func (m *bounded) unmarshal(data mem.BufferSlice) error {
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	if m.err = m.shape.check(b); m.err != nil {
		return nil
	}
	return proto.Unmarshal(b, m.Message)
}

// boundedHandler is a unary gRPC handler like the generated ones that
// decodes its request as a *bounded of sh, and answers a request past the
// bounds with INVALID_ARGUMENT.
func boundedHandler[T proto.Message](method string, newMsg func() T, sh func(srv any) *shape,
	call func(srv any, ctx context.Context, in T) (any, error)) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		in := newMsg()
		m := &bounded{Message: in, shape: sh(srv)}
		if err := dec(m); err != nil {
			return nil, err
		}
		handle := func(ctx context.Context, req any) (any, error) { return call(srv, ctx, req.(T)) }
		if m.err != nil {
			// past the bounds: answered through the interceptors, which
			// count it (they see the message undecoded)
			handle = func(context.Context, any) (any, error) { return nil, grpcError(m.err) }
		}
		if interceptor == nil {
			return handle(ctx, in)
		}
		return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: method}, handle)
	}
}

// boundedService returns desc with the handler of its only method
// replaced by h.
func boundedService(desc *grpc.ServiceDesc, h grpc.MethodHandler) *grpc.ServiceDesc {
	d := *desc
	d.Methods = []grpc.MethodDesc{{MethodName: desc.Methods[0].MethodName, Handler: h}}
	return &d
}

// jsonShape is shape for the JSON form of a RateLimitRequest or a
// CheckRequest: at most b.descriptors elements in the top-level
// "descriptors" array, at most b.entries in the "entries" array of each.
// Malformed JSON ends the count: protojson refuses it.
func jsonShape(body []byte, b bounds) error {
	const maxTracked = 4 // the root, descriptors, a descriptor, its entries
	var (
		kinds   [maxTracked]byte // '{' or '[' per level
		named   [maxTracked]bool // an object's current key is the one counted at its level
		counted [maxTracked]bool // an array whose elements are counted
		counts  [maxTracked]int
		depth   int
		isKey   = false // a string here is an object's key
		desc    = -1    // the index of the current descriptor
	)
	// value counts a value that starts at depth.
	value := func() error {
		if depth != 2 && depth != 4 || !counted[depth-1] {
			return nil
		}
		counts[depth-1]++
		if depth == 2 {
			desc++
			if counts[1] > b.descriptors {
				return limiter.TooManyDescriptors(b.descriptors)
			}
		} else if counts[3] > b.entries {
			return limiter.TooManyEntries(desc, b.entries)
		}
		return nil
	}
	for i := 0; i < len(body); i++ {
		c := body[i]
		switch c {
		case ' ', '\t', '\n', '\r', ':':
		case '"':
			j, escaped := i+1, false
			for ; j < len(body) && body[j] != '"'; j++ {
				if body[j] == '\\' {
					escaped = true
					j++
				}
			}
			if j >= len(body) {
				return nil
			}
			if isKey {
				if depth <= maxTracked {
					named[depth-1] = jsonKeyIs(body[i:j+1], escaped, depth)
				}
			} else if err := value(); err != nil {
				return err
			}
			isKey = false
			i = j
		case '{', '[':
			if err := value(); err != nil {
				return err
			}
			if depth < maxTracked {
				kinds[depth], counts[depth], named[depth] = c, 0, false
				counted[depth] = c == '[' && (depth == 1 || depth == 3 && counted[1]) && named[depth-1]
			}
			depth++
			isKey = c == '{'
		case '}', ']':
			if depth == 0 {
				return nil
			}
			depth--
			isKey = false
		case ',':
			isKey = depth > 0 && (depth > maxTracked || kinds[depth-1] == '{')
		default:
			// a number, true, false or null
			if err := value(); err != nil {
				return err
			}
			for i+1 < len(body) && !isJSONDelim(body[i+1]) {
				i++
			}
			isKey = false
		}
	}
	return nil
}

// jsonKeyIs reports whether q, a quoted JSON key of an object at depth,
// names the array counted below it: "descriptors" at the root, "entries"
// in a descriptor.
func jsonKeyIs(q []byte, escaped bool, depth int) bool {
	want := "descriptors"
	if depth == 3 {
		want = "entries"
	} else if depth != 1 {
		return false
	}
	if !escaped {
		return string(q[1:len(q)-1]) == want
	}
	// An escaped key is at most six bytes per character.
	var k string
	return len(q) <= 2+6*len(want) && json.Unmarshal(q, &k) == nil && k == want
}

func isJSONDelim(c byte) bool {
	switch c {
	case ',', '}', ']', ' ', '\t', '\n', '\r', ':':
		return true
	}
	return false
}

// rlsProtoService is Envoy's RateLimitService for interceptors, which see
// proto messages: their requests are checked against the bounds first.
var rlsProtoService = boundedService(&rlspb.RateLimitService_ServiceDesc, boundedHandler(shouldRateLimitMethod,
	func() *rlspb.RateLimitRequest { return new(rlspb.RateLimitRequest) },
	func(srv any) *shape { return &srv.(*RLS).shape },
	func(srv any, ctx context.Context, in *rlspb.RateLimitRequest) (any, error) {
		return srv.(*RLS).ShouldRateLimit(ctx, in)
	}))

// apiService is sluice.v1.RateLimiter, its requests checked against the
// bounds first.
var apiService = boundedService(&sluicev1.RateLimiter_ServiceDesc, boundedHandler(sluicev1.RateLimiter_Check_FullMethodName,
	func() *sluicev1.CheckRequest { return new(sluicev1.CheckRequest) },
	func(srv any) *shape { return &srv.(*API).shape },
	func(srv any, ctx context.Context, in *sluicev1.CheckRequest) (any, error) {
		return srv.(*API).Check(ctx, in)
	}))
