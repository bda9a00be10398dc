package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/quota"
)

// maxActionsPerMessage bounds one RateLimitQuotaResponse; more actions go
// in further messages.
const maxActionsPerMessage = 1000

// RLQS serves Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3) from a quota.Service: it turns
// usage reports into quota.Usages and quota.Actions into bucket actions.
type RLQS struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer
	q *quota.Service
	// draining, when done, ends every stream with UNAVAILABLE so that the
	// proxies reconnect elsewhere (NewGRPC ties it to Health.Shutdown).
	draining context.Context
}

// NewRLQS returns the RLQS adapter of q.
func NewRLQS(q *quota.Service) *RLQS { return &RLQS{q: q, draining: context.Background()} }

// StreamRateLimitQuotas serves one proxy's stream: the first message's
// domain opens it, every message's usages are reported, and the actions
// the quota service queues for the stream are sent as they come. A
// malformed message ends the stream with INVALID_ARGUMENT, too many
// buckets with RESOURCE_EXHAUSTED, and draining with UNAVAILABLE (Envoy
// then reconnects, to another replica); the stream's buckets are released
// when it ends.
func (s *RLQS) StreamRateLimitQuotas(stream rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	first, err := stream.Recv()
	if err != nil {
		return endOfStream(err)
	}
	st, err := s.q.Open(first.GetDomain())
	if err != nil {
		return quotaStatus(err)
	}
	defer st.Close()
	if err := report(st, first, ""); err != nil {
		return s.flush(stream, st, quotaStatus(err))
	}
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- endOfStream(err)
				return
			}
			if err := report(st, m, st.Domain()); err != nil {
				recvErr <- quotaStatus(err)
				return
			}
		}
	}()
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
	case errors.Is(err, quota.ErrTooManyBuckets):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, quota.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// report hands m's usages to st. domain is the stream's domain for
// messages after the first: they may repeat it or leave it empty.
func report(st *quota.Stream, m *rlqspb.RateLimitQuotaUsageReports, domain string) error {
	if domain != "" && m.GetDomain() != "" && m.GetDomain() != domain {
		return fmt.Errorf("%w: domain changed from %s to %s", quota.ErrInvalid, quoteDomain(domain), quoteDomain(m.GetDomain()))
	}
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
	return st.Report(time.Now(), us)
}

func quoteDomain(d string) string {
	if len(d) > 64 {
		d = d[:64] + "..."
	}
	return strconv.Quote(d)
}

// send writes actions in messages of at most maxActionsPerMessage.
func send(stream rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer, actions []quota.Action) error {
	for len(actions) > 0 {
		n := min(len(actions), maxActionsPerMessage)
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
