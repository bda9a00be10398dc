package server

import (
	"bytes"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/store"
)

// buildResponse is the reference for appendResponse: the message
// builder the server used before it wrote the wire form itself, as it
// was.
func buildResponse(s *RLS, r *limiter.Response) *rlspb.RateLimitResponse {
	out := &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_Code(r.Overall)}
	blocks := make([]statusBlock, len(r.Statuses))
	out.Statuses = make([]*rlspb.RateLimitResponse_DescriptorStatus, len(r.Statuses))
	for i := range r.Statuses {
		st, b := &r.Statuses[i], &blocks[i]
		ps := &b.status
		out.Statuses[i] = ps
		ps.Code = rlspb.RateLimitResponse_Code(st.Code)
		switch {
		case st.Unlimited:
			ps.LimitRemaining = st.Remaining()
		case st.Limited:
			l := &b.limit
			l.Name, l.RequestsPerUnit, l.Unit = st.Name, uint32(min(st.RequestsPerUnit, math.MaxUint32)), rlspb.RateLimitResponse_RateLimit_Unit(st.Unit)
			if st.UnitMultiplier > 1 {
				l.UnitMultiplier = wrapperspb.UInt32(st.UnitMultiplier)
			}
			b.duration.Seconds = int64(st.ResetAfter().Seconds())
			ps.CurrentLimit, ps.LimitRemaining, ps.DurationUntilReset = l, st.Remaining(), &b.duration
		}
	}
	if s.opts.ResponseHeaders {
		out.ResponseHeadersToAdd = buildHeaders(s, r)
	}
	return out
}

// statusBlock holds one descriptor's messages, so that a response's
// statuses are allocated together.
type statusBlock struct {
	status   rlspb.RateLimitResponse_DescriptorStatus
	limit    rlspb.RateLimitResponse_RateLimit
	duration durationpb.Duration
}

func buildHeaders(s *RLS, r *limiter.Response) []*corepb.HeaderValue {
	i := r.MostRestrictive()
	if i < 0 {
		return nil
	}
	st := &r.Statuses[i]
	hs := []*corepb.HeaderValue{
		{Key: s.headers.Limit, Value: strconv.FormatUint(st.RequestsPerUnit, 10)},
		{Key: s.headers.Remaining, Value: strconv.FormatUint(st.ExactRemaining(), 10)},
		{Key: s.headers.Reset, Value: strconv.FormatInt(int64(st.ResetAfter().Seconds()), 10)},
	}
	if d := r.RetryAfter(); d > 0 && d != store.Never {
		hs = append(hs, &corepb.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(int64(d.Seconds()), 10)})
	}
	return hs
}

// checkEncoding fails t unless appendResponse gives, after some bytes
// already in the buffer, exactly proto.Marshal's bytes for the reference
// message, and the message path's response equals that message.
func checkEncoding(t *testing.T, name string, s *RLS, r *limiter.Response) {
	t.Helper()
	ref := buildResponse(s, r)
	want, err := proto.Marshal(ref)
	if err != nil {
		t.Fatalf("%s: marshal the reference: %v", name, err)
	}
	prefix := []byte("prefix")
	got := s.appendResponse(append([]byte(nil), prefix...), nil, r)
	if !bytes.HasPrefix(got, prefix) || !bytes.Equal(got[len(prefix):], want) {
		t.Fatalf("%s: appendResponse\n got %x\nwant %x", name, got, append(prefix, want...))
	}
	if msg := s.response(nil, r); !proto.Equal(msg, ref) {
		t.Fatalf("%s: response\n got %s\nwant %s", name, protojson.Format(msg), protojson.Format(ref))
	}
}

func limited(code limiter.Code, name string, rpu uint64, unit config.Unit, d store.Decision) limiter.Status {
	return limiter.Status{Code: code, Limited: true, Name: name, RequestsPerUnit: rpu, Unit: unit, Decision: d}
}

func TestAppendResponse(t *testing.T) {
	allowed := store.Decision{Allowed: true, Remaining: 7, ResetAfter: 1500 * time.Millisecond}
	denied := store.Decision{ResetAfter: time.Minute, RetryAfter: 12*time.Second + 1}
	multiplied := limited(limiter.OK, "", 5, config.Unit(2), allowed)
	multiplied.UnitMultiplier = 30
	one := multiplied
	one.UnitMultiplier = 1
	cases := []struct {
		name string
		r    limiter.Response
	}{
		{"empty", limiter.Response{}},
		{"no statuses", limiter.Response{Overall: limiter.OK}},
		{"no rule", limiter.Response{Overall: limiter.OK, Statuses: []limiter.Status{{Code: limiter.OK}}}},
		{"unknown code", limiter.Response{Statuses: []limiter.Status{{}}}},
		{"negative code", limiter.Response{Overall: -3, Statuses: []limiter.Status{{Code: -1}}}},
		{"unlimited", limiter.Response{Overall: limiter.OK, Statuses: []limiter.Status{{Code: limiter.OK, Unlimited: true, Hits: 3}}}},
		{"limited", limiter.Response{Overall: limiter.OK, Statuses: []limiter.Status{limited(limiter.OK, "per_ip", 100, config.Unit(2), allowed)}}},
		{"over limit", limiter.Response{Overall: limiter.OverLimit, Statuses: []limiter.Status{
			limited(limiter.OK, "", 10, config.Unit(1), allowed), limited(limiter.OverLimit, "login", 1, config.Unit(3), denied)}}},
		{"never", limiter.Response{Overall: limiter.OverLimit, Statuses: []limiter.Status{
			limited(limiter.OverLimit, "", 1, config.Unit(1), store.Decision{ResetAfter: time.Second, RetryAfter: store.Never})}}},
		{"full bucket", limiter.Response{Overall: limiter.OK, Statuses: []limiter.Status{
			limited(limiter.OK, "", 0, 0, store.Decision{Allowed: true, Remaining: math.MaxUint64})}}},
		{"multiplier", limiter.Response{Overall: limiter.OK, Statuses: []limiter.Status{multiplied, one}}},
		{"long name", limiter.Response{Overall: limiter.OK, Statuses: []limiter.Status{
			limited(limiter.OK, strings.Repeat("n", 200), 1, config.Unit(1), allowed)}}},
		{"name of 40000 bytes", limiter.Response{Overall: limiter.OK, Statuses: []limiter.Status{
			limited(limiter.OK, strings.Repeat("é", 20000), 1, config.Unit(1), allowed)}}},
		{"shadow mode", limiter.Response{Overall: limiter.OK, Statuses: []limiter.Status{
			limited(limiter.OK, "", 1, config.Unit(2), store.Decision{ResetAfter: time.Minute, RetryAfter: time.Minute})}}},
	}
	for _, headers := range []bool{false, true} {
		s := NewRLS(nil, Options{ResponseHeaders: headers, HeaderNames: Headers{Limit: "X-Limit"}})
		for _, c := range cases {
			checkEncoding(t, c.name+", headers "+strconv.FormatBool(headers), s, &c.r)
		}
	}
}

func TestNewRLS_HeaderNamesValidUTF8(t *testing.T) {
	s := NewRLS(nil, Options{ResponseHeaders: true, HeaderNames: Headers{Remaining: "X-\xffLeft"}})
	r := limiter.Response{Overall: limiter.OK, Statuses: []limiter.Status{limited(limiter.OK, "", 1, config.Unit(1), store.Decision{Allowed: true})}}
	got := s.response(nil, &r)
	if len(got.ResponseHeadersToAdd) != 3 || got.ResponseHeadersToAdd[1].Key != "X-\uFFFDLeft" {
		t.Errorf("headers %v, want X-\uFFFDLeft second", got.ResponseHeadersToAdd)
	}
}

// FuzzAppendResponse checks appendResponse against proto.Marshal of the
// reference message for responses read from arbitrary bytes.
func FuzzAppendResponse(f *testing.F) {
	f.Add(int32(1), false, []byte{})
	// Allowed, then over limit with a name and a multiplier.
	f.Add(int32(2), true, []byte("\x05\x01\x00\x00\x00\x00\x64\x02\x00\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00\x05\xdc\x00\x00\x00\x00"+
		"\x01\x02\x06per_ip\x00\x00\x00\x0a\x03\x1e\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xea\x60\x00\x00\x2e\xe0"))
	f.Fuzz(func(t *testing.T, overall int32, headers bool, b []byte) {
		r := limiter.Response{Overall: limiter.Code(overall)}
		for len(b) > 0 {
			var st limiter.Status
			st, b = readStatus(b)
			r.Statuses = append(r.Statuses, st)
		}
		checkEncoding(t, "fuzz", NewRLS(nil, Options{ResponseHeaders: headers}), &r)
	})
}

// readStatus reads a status from b (zeros past its end): flags, code,
// and for a limited status name, limit, unit, multiplier and decision.
func readStatus(b []byte) (limiter.Status, []byte) {
	u := func(n int) uint64 {
		var v uint64
		for range n {
			v <<= 8
			if len(b) > 0 {
				v |= uint64(b[0])
				b = b[1:]
			}
		}
		return v
	}
	flags := u(1)
	st := limiter.Status{Code: limiter.Code(int8(u(1))), Limited: flags&1 != 0, Unlimited: flags&2 != 0}
	st.Decision.Allowed = flags&4 != 0
	if st.Limited {
		n := min(int(u(1)), len(b))
		st.Name = strings.ToValidUTF8(string(b[:n]), "?") // names are valid UTF-8
		b = b[n:]
		st.RequestsPerUnit, st.Unit, st.UnitMultiplier = u(8), config.Unit(int8(u(1))), uint32(u(1))
		st.Decision.Remaining = u(8)
		st.Decision.ResetAfter = time.Duration(u(4)) * time.Millisecond
		st.Decision.RetryAfter = time.Duration(u(4)) * time.Millisecond
		if flags&8 != 0 {
			st.Decision.RetryAfter = store.Never
		}
	}
	return st, b
}
