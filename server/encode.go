package server

import (
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/store"
)

// Envoy's responses skip the proto message tree too: appendResponse
// writes the wire form of a limiter.Response directly. It is the only
// encoder; the paths that need the message (ShouldRateLimit behind
// interceptors, HTTP /json) unmarshal its bytes.

// Field numbers of envoy.service.ratelimit.v3.RateLimitResponse and of
// the messages in it.
const (
	respOverallCode     protowire.Number = 1 // enum Code
	respStatuses        protowire.Number = 2 // repeated DescriptorStatus
	respResponseHeaders protowire.Number = 3 // repeated config.core.v3.HeaderValue
	respDynamicMetadata protowire.Number = 6 // google.protobuf.Struct

	statusCode               protowire.Number = 1 // enum Code
	statusCurrentLimit       protowire.Number = 2 // RateLimit
	statusLimitRemaining     protowire.Number = 3 // uint32
	statusDurationUntilReset protowire.Number = 4 // google.protobuf.Duration

	limitRequestsPerUnit protowire.Number = 1 // uint32
	limitUnit            protowire.Number = 2 // enum Unit
	limitName            protowire.Number = 3 // string
	limitUnitMultiplier  protowire.Number = 4 // google.protobuf.UInt32Value

	headerKey   protowire.Number = 1 // string
	headerValue protowire.Number = 2 // string

	wrapperValue    protowire.Number = 1 // UInt32Value.value
	durationSeconds protowire.Number = 1 // Duration.seconds
)

// appendResponse appends to b Envoy's RateLimitResponse for r, the
// answer to req, byte for byte what proto.Marshal gives for that message:
// fields in number order, zero scalars and empty strings left out,
// present sub-messages written even when empty, and dynamic_metadata's
// map entries in proto's deterministic order. Strings must be valid UTF-8
// (rule names come from YAML; NewRLS cleans header names). req may be nil
// when dynamic metadata is off.
func (s *RLS) appendResponse(b []byte, req *limiter.Request, r *limiter.Response) []byte {
	b = appendVarint(b, respOverallCode, uint64(r.Overall))
	for i := range r.Statuses {
		at := 0
		b, at = beginMessage(b, respStatuses)
		b = appendStatus(b, &r.Statuses[i])
		b = endMessage(b, at)
	}
	if s.opts.ResponseHeaders {
		b = s.appendHeaders(b, r)
	}
	if s.opts.IETFHeaders {
		b = s.appendIETFHeaders(b, r)
	}
	if s.opts.DynamicMetadata && req != nil {
		b = appendMetadata(b, req, r)
	}
	return b
}

// appendStatus appends the fields of a DescriptorStatus.
func appendStatus(b []byte, st *limiter.Status) []byte {
	b = appendVarint(b, statusCode, uint64(st.Code))
	switch {
	case st.Unlimited:
		b = appendVarint(b, statusLimitRemaining, uint64(st.Remaining()))
	case st.Limited:
		at := 0
		b, at = beginMessage(b, statusCurrentLimit)
		b = appendVarint(b, limitRequestsPerUnit, uint64(st.EnvoyRequestsPerUnit()))
		b = appendVarint(b, limitUnit, uint64(st.Unit))
		b = appendString(b, limitName, st.Name)
		if st.UnitMultiplier > 1 {
			w := 0
			b, w = beginMessage(b, limitUnitMultiplier)
			b = appendVarint(b, wrapperValue, uint64(st.UnitMultiplier))
			b = endMessage(b, w)
		}
		b = endMessage(b, at)
		b = appendVarint(b, statusLimitRemaining, uint64(st.Remaining()))
		b, at = beginMessage(b, statusDurationUntilReset)
		b = appendVarint(b, durationSeconds, uint64(seconds(st.ResetAfter())))
		b = endMessage(b, at)
	}
	return b
}

// appendHeaders appends response_headers_to_add: the most restrictive
// descriptor's limit, remaining and reset, and Retry-After when a wait
// helps.
func (s *RLS) appendHeaders(b []byte, r *limiter.Response) []byte {
	i := r.MostRestrictive()
	if i < 0 {
		return b
	}
	st := &r.Statuses[i]
	var num [20]byte
	b = appendHeader(b, s.headers.Limit, strconv.AppendUint(num[:0], st.RequestsPerUnit, 10))
	b = appendHeader(b, s.headers.Remaining, strconv.AppendUint(num[:0], st.ExactRemaining(), 10))
	b = appendHeader(b, s.headers.Reset, strconv.AppendInt(num[:0], seconds(st.ResetAfter()), 10))
	if d := r.RetryAfter(); d > 0 && d != store.Never {
		b = appendHeader(b, "Retry-After", strconv.AppendInt(num[:0], seconds(d), 10))
	}
	return b
}

// appendHeader appends one HeaderValue; value is never empty.
func appendHeader(b []byte, key string, value []byte) []byte {
	b, at := beginMessage(b, respResponseHeaders)
	b = appendString(b, headerKey, key)
	b = protowire.AppendTag(b, headerValue, protowire.BytesType)
	b = protowire.AppendBytes(b, value)
	return endMessage(b, at)
}

// seconds is a Duration's seconds field for d, as Envoy's responses have
// always been built (d is in whole seconds).
func seconds(d time.Duration) int64 {
	return int64(d.Seconds())
}

// appendVarint appends a varint field unless v is zero. Enums and int32
// values are passed sign-extended to 64 bits, as proto does.
func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// appendString appends a string field unless s is empty.
func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// beginMessage appends the tag of a message field and one byte for its
// length, which endMessage fills in; at is that byte's index.
func beginMessage(b []byte, num protowire.Number) (_ []byte, at int) {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	at = len(b)
	return append(b, 0), at
}

// endMessage writes the length of the message that began at at, moving
// the message when its length takes more than one byte.
func endMessage(b []byte, at int) []byte {
	n := len(b) - at - 1
	if n < 0x80 {
		b[at] = byte(n)
		return b
	}
	k := protowire.SizeVarint(uint64(n))
	b = append(b, make([]byte, k-1)...)
	copy(b[at+k:], b[at+1:at+1+n])
	protowire.AppendVarint(b[:at], uint64(n))
	return b
}

// reply is the wire form of a response on its way out through gRPC. The
// codec hands gRPC one mem.Buffer over data whose pool is the reply
// itself: when gRPC has written the message and freed the buffer, Put
// returns the reply to its RLS's pool, so a response costs no
// allocation. Until then the reply is gRPC's alone; one gRPC never
// marshals (the call failed on the way out) is left to the garbage
// collector.
type reply struct {
	data []byte
	// bufs is the mem.BufferSlice given to gRPC, which keeps the slice
	// until it frees the buffer in it.
	bufs [1]mem.Buffer
	pool *sync.Pool
}

// replyCap is a new reply's capacity: mem.NewBuffer pools no buffer of
// 1 KiB or less (it wraps it without a free callback), and four
// descriptors take a few hundred bytes.
const replyCap = 2 << 10

// maxPooledReply bounds the capacity of the replies kept for reuse.
const maxPooledReply = 64 << 10

func newReplyPool() *sync.Pool {
	p := new(sync.Pool)
	p.New = func() any { return &reply{data: make([]byte, 0, replyCap), pool: p} }
	return p
}

// buffers returns r's data as gRPC's BufferSlice, handing r to gRPC.
func (r *reply) buffers() mem.BufferSlice {
	r.bufs[0] = mem.NewBuffer(&r.data, r)
	return r.bufs[:]
}

// Get implements mem.BufferPool: a pool of r's one buffer, at least
// length bytes long.
func (r *reply) Get(length int) *[]byte {
	if cap(r.data) < length {
		r.data = make([]byte, length)
	}
	r.data = r.data[:length]
	return &r.data
}

// Put implements mem.BufferPool: gRPC has freed r's buffer. A reply
// grown past maxPooledReply by a huge request is dropped.
func (r *reply) Put(*[]byte) {
	if cap(r.data) <= maxPooledReply {
		r.pool.Put(r)
	}
}
