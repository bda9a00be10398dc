package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/quota"
)

// GRPCOptions configure the gRPC server. The zero value means defaults.
type GRPCOptions struct {
	Options
	// Logger receives panics and, at debug level, one line per call
	// (server-side failures at warn). nil discards.
	Logger *slog.Logger
	// MaxRecvMsgSize bounds a request message; 0 means 1 MiB.
	MaxRecvMsgSize int
	// MaxConnectionAge closes connections after this long (with
	// MaxConnectionAgeGrace for in-flight calls), so clients rebalance
	// across replicas. 0 means never.
	MaxConnectionAge      time.Duration
	MaxConnectionAgeGrace time.Duration
	// KeepaliveTime and KeepaliveTimeout ping idle connections; 0 means
	// gRPC's defaults (2 h, 20 s).
	KeepaliveTime    time.Duration
	KeepaliveTimeout time.Duration
	// MaxConcurrentStreams bounds the calls and streams in flight on one
	// connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS): clients that
	// want more open another connection (Envoy) or wait (grpc-go). 0 means
	// DefaultMaxConcurrentStreams.
	MaxConcurrentStreams uint32
	// TLS, when not nil, serves TLS (mTLS when it asks for client
	// certificates).
	TLS *tls.Config
	// StreamWorkers is the size of the goroutine pool that serves
	// requests; 0 means GOMAXPROCS, enough for a store that answers
	// without waiting. A request that finds every worker busy runs on a
	// goroutine of its own, whose stack then grows from scratch, so a
	// store that waits on the network (Redis) wants about as many workers
	// as requests it has in flight.
	StreamWorkers int
	// Quota, if not nil, serves Envoy's Rate Limit Quota Service
	// (envoy.service.rate_limit_quota.v3) on the same server.
	Quota *quota.Service
	// ServerOptions are appended last: stats handlers, more interceptors.
	// Unless Interceptors is set, what these see as the request and the
	// response of Envoy's ShouldRateLimit are not proto messages but
	// internal types, reused once the call is over.
	ServerOptions []grpc.ServerOption
	// Interceptors run after recovery and logging, before the handler;
	// they see Envoy's requests and responses as proto messages. Setting
	// any turns off the faster path that skips the proto messages.
	Interceptors []grpc.UnaryServerInterceptor
}

// DefaultMaxConcurrentStreams is GRPCOptions.MaxConcurrentStreams' default:
// about Envoy's default circuit breaker for a whole cluster (1,024 requests
// in flight), so that it never binds an Envoy with the defaults.
const DefaultMaxConcurrentStreams = 1000

// NewGRPC returns a gRPC server with Envoy's RateLimitService, our
// sluice.v1.RateLimiter, Envoy's RateLimitQuotaService (with o.Quota),
// grpc.health.v1 (from health) and server reflection registered, behind panic recovery and request logging.
func NewGRPC(lim *limiter.Limiter, health *Health, o GRPCOptions) *grpc.Server {
	logger := o.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if o.MaxRecvMsgSize <= 0 {
		o.MaxRecvMsgSize = 1 << 20
	}
	if o.StreamWorkers <= 0 {
		o.StreamWorkers = runtime.GOMAXPROCS(0)
	}
	if o.MaxConcurrentStreams == 0 {
		o.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	recovered := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		logger.ErrorContext(ctx, "panic in gRPC handler", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	})
	unary := []grpc.UnaryServerInterceptor{recovery.UnaryServerInterceptor(recovered)}
	// The logging interceptor costs about 50 allocations per call even
	// when it logs nothing, so it is installed only at debug level.
	if logger.Enabled(context.Background(), slog.LevelDebug) {
		unary = append(unary, logging.UnaryServerInterceptor(slogLogger(logger),
			logging.WithLogOnEvents(logging.FinishCall),
			logging.WithLevels(callLevel)))
	}
	unary = append(unary, o.Interceptors...)
	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(recovery.StreamServerInterceptor(recovered)),
		grpc.MaxRecvMsgSize(o.MaxRecvMsgSize),
		grpc.MaxConcurrentStreams(o.MaxConcurrentStreams),
		// A fixed pool of workers serves the streams: no goroutine (and
		// no stack growth) per request.
		grpc.NumStreamWorkers(uint32(o.StreamWorkers)),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge:      o.MaxConnectionAge,
			MaxConnectionAgeGrace: o.MaxConnectionAgeGrace,
			Time:                  o.KeepaliveTime,
			Timeout:               o.KeepaliveTimeout,
		}),
		// Envoy pings idle connections; allow it as often as every 10 s.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
	if o.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(o.TLS)))
	}
	// Without interceptors that may look at them, Envoy's requests are
	// decoded straight into the limiter's form and its responses written
	// straight from it (see decodeRLS and appendResponse).
	// Every request message is checked against the bounds before it is
	// decoded further (see bounds.go), so the codec is ours either way.
	direct := len(o.Interceptors) == 0
	opts = append(opts, grpc.ForceServerCodecV2(newCodec(limiterBounds(lim))))
	opts = append(opts, o.ServerOptions...)
	s := grpc.NewServer(opts...)
	if rls := NewRLS(lim, o.Options); direct {
		s.RegisterService(&rlsService, rls)
	} else {
		s.RegisterService(rlsProtoService, rls)
	}
	s.RegisterService(apiService, NewAPI(lim, o.Options))
	if o.Quota != nil {
		rlqs := NewRLQS(o.Quota)
		rlqs.draining, rlqs.logger, rlqs.tracing = health.draining, logger, o.Tracing
		rlqspb.RegisterRateLimitQuotaServiceServer(s, rlqs)
	}
	healthpb.RegisterHealthServer(s, health.service())
	reflection.Register(s)
	return s
}

// callLevel logs successful and client-side outcomes at debug and server
// failures at warn.
func callLevel(c codes.Code) logging.Level {
	switch c {
	case codes.Unavailable, codes.Internal, codes.Unknown, codes.DataLoss:
		return logging.LevelWarn
	}
	return logging.LevelDebug
}

// slogLogger adapts slog to the logging interceptor, checking the level
// before any work.
func slogLogger(l *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		if sl := slog.Level(lvl); l.Enabled(ctx, sl) {
			l.Log(ctx, sl, msg, fields...)
		}
	})
}
