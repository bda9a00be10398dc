package server

import (
	"context"
	"sync"
	"sync/atomic"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	sluicev1 "github.com/sluicehq/sluice/gen/sluice/v1"
)

// Health is the serving state that grpc.health.v1 and GET /healthcheck
// report. It starts NOT_SERVING. Safe for concurrent use.
type Health struct {
	grpc    *health.Server
	mu      sync.Mutex // orders SetServing and Shutdown
	down    bool
	serving atomic.Bool
	// draining ends at Shutdown; it ends Watch streams, which would
	// otherwise hold a graceful stop until its timeout.
	draining context.Context
	drain    context.CancelFunc
}

// healthServices are the names grpc.health.v1 answers for, besides "".
var healthServices = []string{
	rlspb.RateLimitService_ServiceDesc.ServiceName,
	rlqspb.RateLimitQuotaService_ServiceDesc.ServiceName,
	sluicev1.RateLimiter_ServiceDesc.ServiceName,
}

// NewHealth returns a Health that is not serving.
func NewHealth() *Health {
	h := &Health{grpc: health.NewServer()}
	h.draining, h.drain = context.WithCancel(context.Background())
	h.SetServing(false)
	return h
}

// SetServing flips every reported service to SERVING or NOT_SERVING. After
// Shutdown it does nothing.
func (h *Health) SetServing(ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.down {
		return
	}
	h.serving.Store(ok)
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	h.grpc.SetServingStatus("", st)
	for _, s := range healthServices {
		h.grpc.SetServingStatus(s, st)
	}
}

// Serving reports the current state.
func (h *Health) Serving() bool { return h.serving.Load() }

// Shutdown sets every service NOT_SERVING for good (later SetServing calls
// are ignored): call it when draining starts.
func (h *Health) Shutdown() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.down = true
	h.serving.Store(false)
	h.grpc.Shutdown()
	h.drain()
}

// healthService is grpc.health.v1 with Watch streams that end, after a
// last NOT_SERVING, when draining starts.
type healthService struct {
	*health.Server
	draining context.Context
}

func (h *Health) service() healthpb.HealthServer {
	return &healthService{Server: h.grpc, draining: h.draining}
}

func (s *healthService) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	defer context.AfterFunc(s.draining, cancel)()
	err := s.Server.Watch(req, watchStream{stream, ctx})
	if s.draining.Err() != nil && stream.Context().Err() == nil {
		return stream.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING})
	}
	return err
}

// watchStream is a Watch stream with a context that also ends at drain.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx context.Context
}

func (w watchStream) Context() context.Context { return w.ctx }
