package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/quota"
)

// maxActionsPerMessage and maxIDBytesPerMessage (the bytes of the bucket
// ids it echoes) bound one RateLimitQuotaResponse, below gRPC's default
// limit of 4 MiB a message; more actions go in further messages.
const (
	maxActionsPerMessage = 1000
	maxIDBytesPerMessage = 1 << 20
)

// RLQS serves Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3) from a quota.Service: it turns
// usage reports into quota.Usages and quota.Actions into bucket actions.
type RLQS struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer
	q *quota.Service
	// draining, when done, ends every stream with UNAVAILABLE so that the
	// proxies reconnect elsewhere (NewGRPC ties it to Health.Shutdown).
	draining context.Context
	// logger receives the panics recovered in a stream's receiver.
	logger *slog.Logger
	// tracing, with a Tracer, makes each report a span, a child of the
	// trace context in the stream's metadata.
	tracing Tracing
	// shape bounds a report's wire form: its usages, and the keys of
	// each bucket id, are counted before it is decoded (by NewGRPC's
	// codec; another server's decodes it unchecked).
	shape shape
}

// reportShape bounds q's RLQS reports: at most a stream's most buckets of
// usages (more cannot all be new), of bucket ids of at most
// config.MaxBucketKeys keys, refused (and counted) as the quota service
// refuses them.
func reportShape(q *quota.Service) shape {
	return shape{outer: 2, maxOuter: q.MaxBucketsPerStream(), path: []protowire.Number{1, 1}, maxInner: config.MaxBucketKeys,
		tooMany: func(max int) error {
			q.Refused(quota.CapStreamBuckets)
			return fmt.Errorf("%w: more than %d bucket_quota_usages in one report", quota.ErrTooManyBuckets, max)
		},
		tooManyInner: func(i, max int) error {
			q.Refused(quota.CapBucketKeys)
			return fmt.Errorf("%w: bucket_quota_usages[%d]: bucket_id of more than %d keys", quota.ErrTooManyKeys, i, max)
		}}
}

// NewRLQS returns the RLQS adapter of q.
func NewRLQS(q *quota.Service) *RLQS {
	return &RLQS{q: q, draining: context.Background(), logger: slog.New(slog.DiscardHandler), shape: reportShape(q)}
}

// StreamRateLimitQuotas serves one proxy's stream: it is opened (counted
// against the quota service's stream cap) before its first message, every
// message's usages are reported, and the actions the quota service queues
// for the stream are sent as they come. A malformed message ends the
// stream with INVALID_ARGUMENT, one past a cap (or a stream past the
// stream cap) with RESOURCE_EXHAUSTED, a panic while receiving with
// INTERNAL, and draining with UNAVAILABLE (Envoy then reconnects, to
// another replica); the stream's buckets are released when it ends.
func (s *RLQS) StreamRateLimitQuotas(stream rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	st, err := s.q.Open()
	if err != nil {
		return quotaStatus(err)
	}
	defer st.Close()
	recvErr := make(chan error, 1)
	go s.receive(stream, st, recvErr)
	for {
		select {
		case <-st.Notify():
			if err := send(stream, st.Pending()); err != nil {
				return err
			}
		case err := <-recvErr:
			return s.flush(stream, st, err)
		case <-s.draining.Done():
			return s.flush(stream, st, status.Error(codes.Unavailable, "rlqs: server draining, reconnect"))
		}
	}
}

// receive reports each message of stream to st until the stream ends or
// a message is refused, and then sends why to done (nil for the client's
// half-close). A panic ends the stream with INTERNAL, not the process.
func (s *RLQS) receive(stream rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer, st *quota.Stream, done chan<- error) {
	defer func() {
		if p := recover(); p != nil {
			s.logger.ErrorContext(stream.Context(), "panic in an RLQS stream's receiver", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			done <- status.Error(codes.Internal, "internal error")
		}
	}()
	for {
		m := new(rlqspb.RateLimitQuotaUsageReports)
		b := &bounded{Message: m, shape: &s.shape}
		if err := stream.RecvMsg(b); err != nil {
			done <- endOfStream(err)
			return
		}
		if b.err != nil {
			done <- quotaStatus(b.err)
			return
		}
		if err := s.report(stream.Context(), st, m); err != nil {
			done <- quotaStatus(err)
			return
		}
	}
}

// flush sends what is pending, then returns err.
func (s *RLQS) flush(stream rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer, st *quota.Stream, err error) error {
	if serr := send(stream, st.Pending()); serr != nil && err == nil {
		return serr
	}
	return err
}

// endOfStream is nil for the client's half-close, else err.
func endOfStream(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

func quotaStatus(err error) error {
	switch {
	case errors.Is(err, quota.ErrExhausted):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, quota.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// report reports m to st, within a span when tracing is on.
func (s *RLQS) report(ctx context.Context, st *quota.Stream, m *rlqspb.RateLimitQuotaUsageReports) error {
	if s.tracing.Tracer == nil {
		return report(st, m)
	}
	_, span := s.tracing.start(ctx, spanRLQSReport, nil)
	defer span.End()
	err := report(st, m)
	if span.IsRecording() {
		span.SetAttributes(attrDomain.String(m.GetDomain()), attrBuckets.Int(len(m.GetBucketQuotaUsages())))
		if err != nil {
			failed(span, err)
		}
	}
	return err
}

// report hands m's domain and usages to st.
func report(st *quota.Stream, m *rlqspb.RateLimitQuotaUsageReports) error {
	in := m.GetBucketQuotaUsages()
	us := make([]quota.Usage, len(in))
	for i, u := range in {
		el := time.Duration(0)
		if d := u.GetTimeElapsed(); d != nil {
			if err := d.CheckValid(); err != nil {
				return fmt.Errorf("%w: bucket_quota_usages[%d]: time_elapsed: %v", quota.ErrInvalid, i, err)
			}
			el = d.AsDuration()
		}
		us[i] = quota.Usage{Bucket: u.GetBucketId().GetBucket(), Elapsed: el,
			Allowed: u.GetNumRequestsAllowed(), Denied: u.GetNumRequestsDenied()}
	}
	return st.Report(time.Now(), m.GetDomain(), us)
}

// send writes actions in messages of at most maxActionsPerMessage and
// about maxIDBytesPerMessage.
func send(stream rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer, actions []quota.Action) error {
	for len(actions) > 0 {
		n, size := 0, 0
		for n < min(len(actions), maxActionsPerMessage) && (n == 0 || size < maxIDBytesPerMessage) {
			for k, v := range actions[n].Bucket {
				size += len(k) + len(v)
			}
			n++
		}
		resp := &rlqspb.RateLimitQuotaResponse{BucketAction: make([]*rlqspb.RateLimitQuotaResponse_BucketAction, n)}
		for i := range n {
			resp.BucketAction[i] = bucketAction(&actions[i])
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
		actions = actions[n:]
	}
	return nil
}

func bucketAction(a *quota.Action) *rlqspb.RateLimitQuotaResponse_BucketAction {
	ba := &rlqspb.RateLimitQuotaResponse_BucketAction{BucketId: &rlqspb.BucketId{Bucket: a.Bucket}}
	if a.Kind == quota.Abandon {
		ba.BucketAction = &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{
			AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{}}
		return ba
	}
	ba.BucketAction = &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
		QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(a.TTL),
			RateLimitStrategy:    strategy(a),
		}}
	return ba
}

// strategy is a's envoy.type.v3.RateLimitStrategy.
func strategy(a *quota.Action) *typepb.RateLimitStrategy {
	switch a.Kind {
	case quota.RequestsPerUnit:
		return &typepb.RateLimitStrategy{Strategy: &typepb.RateLimitStrategy_RequestsPerTimeUnit_{
			RequestsPerTimeUnit: &typepb.RateLimitStrategy_RequestsPerTimeUnit{
				RequestsPerTimeUnit: a.Requests, TimeUnit: typepb.RateLimitUnit(a.Unit)}}}
	case quota.TokenBucket:
		return &typepb.RateLimitStrategy{Strategy: &typepb.RateLimitStrategy_TokenBucket{
			TokenBucket: &typepb.TokenBucket{MaxTokens: a.MaxTokens,
				TokensPerFill: wrapperspb.UInt32(a.TokensPerFill), FillInterval: durationpb.New(a.FillInterval)}}}
	case quota.DenyAll:
		return &typepb.RateLimitStrategy{Strategy: &typepb.RateLimitStrategy_BlanketRule_{
			BlanketRule: typepb.RateLimitStrategy_DENY_ALL}}
	}
	return &typepb.RateLimitStrategy{Strategy: &typepb.RateLimitStrategy_BlanketRule_{
		BlanketRule: typepb.RateLimitStrategy_ALLOW_ALL}}
}
