package loadgen

import (
	"context"
	"net"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// Noop is an RLS v3 server that answers every request OK, with one OK
// status per descriptor, and does nothing else: what remains of a
// server's cost is gRPC-go's own. Safe for concurrent use.
type Noop struct {
	rlspb.UnimplementedRateLimitServiceServer
}

// okStatus is shared by every reply: marshalling only reads it.
var okStatus = &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK}

// ShouldRateLimit answers OK.
func (Noop) ShouldRateLimit(_ context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	st := make([]*rlspb.RateLimitResponse_DescriptorStatus, len(req.Descriptors))
	for i := range st {
		st[i] = okStatus
	}
	return &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK, Statuses: st}, nil
}

// ServeNoop serves Noop on lis with gRPC-go's default options until ctx
// ends, then stops at once.
func ServeNoop(ctx context.Context, lis net.Listener) error {
	s := grpc.NewServer()
	rlspb.RegisterRateLimitServiceServer(s, Noop{})
	stop := context.AfterFunc(ctx, s.Stop)
	defer stop()
	err := s.Serve(lis)
	if ctx.Err() != nil {
		return nil
	}
	return err
}
