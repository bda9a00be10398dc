package observe

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// GRPCMetrics counts a gRPC server's calls by service, method and code,
// and times them: the series of go-grpc-middleware's Prometheus provider
// (grpc_server_started_total, grpc_server_handled_total,
// grpc_server_msg_received_total, grpc_server_msg_sent_total and the
// grpc_server_handling_seconds histogram), with the same names, labels and
// meaning, so its dashboards and alerts keep working. The provider hashes
// every series' label values on each call, about 6 % of the server's CPU
// per request; here a method's series are looked up once and then kept.
// Safe for concurrent use; a Prometheus collector.
type GRPCMetrics struct {
	started, handled, received, sent *prometheus.CounterVec
	handling                         *prometheus.HistogramVec
	methods                          sync.Map // full method name → *methodSeries
	// millis, once set (TrackMillis), gives unary methods first called
	// after it a count of calls by whole milliseconds, for RefStats.
	millis atomic.Bool
}

// millisSlots is how many whole-millisecond durations a millisCounts
// tells apart; longer calls count in the last.
const millisSlots = 4096

// millisCounts counts a method's calls by their duration in whole
// milliseconds (truncated, as envoyproxy/ratelimit times them). The
// reader swaps each count to zero.
type millisCounts [millisSlots]atomic.Uint64

func (m *millisCounts) add(d time.Duration) {
	ms := d.Milliseconds()
	if ms >= millisSlots {
		ms = millisSlots - 1
	}
	m[max(ms, 0)].Add(1)
}

// TrackMillis makes unary methods first called from now on count their
// calls by whole milliseconds too (for RefStats's response_time timer).
// Call it before serving.
func (m *GRPCMetrics) TrackMillis() { m.millis.Store(true) }

// eachUnary calls fn with every unary method's series.
func (m *GRPCMetrics) eachUnary(fn func(*methodSeries)) {
	m.methods.Range(func(_, v any) bool {
		if s := v.(*methodSeries); s.labels[0] == "unary" {
			fn(s)
		}
		return true
	})
}

// methodSeries are one method's series. Like the provider's, the message
// and code series appear on their first count, not at zero before.
type methodSeries struct {
	labels         [3]string // grpc_type, grpc_service, grpc_method
	started        prometheus.Counter
	handling       prometheus.Observer
	received, sent lazyCounter
	handled        [codes.Unauthenticated + 1]lazyCounter // by code
	ms             *millisCounts                          // nil unless TrackMillis
}

// lazyCounter is a series made on its first count.
type lazyCounter struct {
	c atomic.Pointer[prometheus.Counter]
}

// inc adds one to the series of vec with s's labels and, if coded, code,
// made if need be.
func (l *lazyCounter) inc(vec *prometheus.CounterVec, s *methodSeries, coded bool, code codes.Code) {
	c := l.c.Load()
	if c == nil {
		made := vec.WithLabelValues(s.values(coded, code)...)
		c = &made
		l.c.Store(c)
	}
	(*c).Inc()
}

// values are the label values of s's series, with code if coded.
func (s *methodSeries) values(coded bool, code codes.Code) []string {
	if !coded {
		return s.labels[:]
	}
	return append(s.labels[:3:3], code.String())
}

// NewGRPCMetrics registers gRPC server metrics on reg, with
// LatencyBuckets for the handling time. Add its interceptors to the
// server:
//
//	grpc.ChainUnaryInterceptor(m.UnaryServerInterceptor())
//	grpc.ChainStreamInterceptor(m.StreamServerInterceptor())
func NewGRPCMetrics(reg prometheus.Registerer) (*GRPCMetrics, error) {
	names := []string{"grpc_type", "grpc_service", "grpc_method"}
	counter := func(name, help string, labels []string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	m := &GRPCMetrics{
		started: counter("grpc_server_started_total", "Total number of RPCs started on the server.", names),
		handled: counter("grpc_server_handled_total", "Total number of RPCs completed on the server, regardless of success or failure.",
			append(names[:3:3], "grpc_code")),
		received: counter("grpc_server_msg_received_total", "Total number of RPC stream messages received on the server.", names),
		sent:     counter("grpc_server_msg_sent_total", "Total number of gRPC stream messages sent by the server.", names),
		handling: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "grpc_server_handling_seconds",
			Help:    "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
			Buckets: LatencyBuckets}, names),
	}
	return m, reg.Register(m)
}

// Describe implements prometheus.Collector.
func (m *GRPCMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *GRPCMetrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

func (m *GRPCMetrics) collectors() [5]prometheus.Collector {
	return [5]prometheus.Collector{m.started, m.handled, m.received, m.sent, m.handling}
}

// UnaryServerInterceptor counts and times unary calls. A call whose
// handler panics is counted as INTERNAL, what the server's panic recovery
// (an interceptor before this one) answers, and the panic goes on to it.
func (m *GRPCMetrics) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		s := m.series(info.FullMethod, "unary")
		start := time.Now()
		s.started.Inc()
		s.received.inc(m.received, s, false, 0)
		defer m.countPanic(s, start)
		resp, err := handler(ctx, req)
		if err == nil {
			s.sent.inc(m.sent, s, false, 0)
		}
		m.done(s, err, start)
		return resp, err
	}
}

// StreamServerInterceptor counts and times streams, and counts the
// messages each way. A panic is counted as in UnaryServerInterceptor.
func (m *GRPCMetrics) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		typ := "bidi_stream"
		switch {
		case !info.IsClientStream && info.IsServerStream:
			typ = "server_stream"
		case info.IsClientStream && !info.IsServerStream:
			typ = "client_stream"
		}
		s := m.series(info.FullMethod, typ)
		start := time.Now()
		s.started.Inc()
		defer m.countPanic(s, start)
		err := handler(srv, &countedStream{ServerStream: ss, m: m, s: s})
		m.done(s, err, start)
		return err
	}
}

// series returns fullMethod's series, made on its first call.
func (m *GRPCMetrics) series(fullMethod, typ string) *methodSeries {
	if s, ok := m.methods.Load(fullMethod); ok {
		return s.(*methodSeries)
	}
	service, method := "unknown", "unknown"
	if sv, me, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/"); ok {
		service, method = sv, me
	}
	s := &methodSeries{labels: [3]string{typ, service, method}}
	s.started = m.started.WithLabelValues(s.labels[:]...)
	s.handling = m.handling.WithLabelValues(s.labels[:]...)
	if typ == "unary" && m.millis.Load() {
		s.ms = new(millisCounts)
	}
	got, _ := m.methods.LoadOrStore(fullMethod, s)
	return got.(*methodSeries)
}

// done counts a call that began at start and ended with err.
func (m *GRPCMetrics) done(s *methodSeries, err error, start time.Time) {
	st, ok := status.FromError(err)
	if !ok {
		// As gRPC answers a handler's context error.
		st = status.FromContextError(err)
	}
	code := st.Code()
	if code < codes.Code(len(s.handled)) {
		s.handled[code].inc(m.handled, s, true, code)
	} else {
		m.handled.WithLabelValues(s.values(true, code)...).Inc()
	}
	d := time.Since(start)
	s.handling.Observe(d.Seconds())
	if s.ms != nil {
		s.ms.add(d)
	}
}

// errPanicked is how a call whose handler panicked ends.
var errPanicked = status.Error(codes.Internal, "internal error")

// countPanic, deferred by the interceptors, counts a call whose handler
// panicked as errPanicked and panics on, so that the recovery outside
// answers it (and sees the handler's stack).
func (m *GRPCMetrics) countPanic(s *methodSeries, start time.Time) {
	if p := recover(); p != nil {
		m.done(s, errPanicked, start)
		panic(p)
	}
}

// countedStream counts the messages a stream sends and receives.
type countedStream struct {
	grpc.ServerStream
	m *GRPCMetrics
	s *methodSeries
}

func (c *countedStream) SendMsg(msg any) error {
	err := c.ServerStream.SendMsg(msg)
	if err == nil {
		c.s.sent.inc(c.m.sent, c.s, false, 0)
	}
	return err
}

func (c *countedStream) RecvMsg(msg any) error {
	err := c.ServerStream.RecvMsg(msg)
	if err == nil {
		c.s.received.inc(c.m.received, c.s, false, 0)
	}
	return err
}
