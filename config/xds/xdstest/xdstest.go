// Package xdstest runs an xDS management server for tests, as Envoy
// Gateway runs the one that feeds its rate-limit service: go-control-plane's
// server (pkg/server/v3) on a snapshot cache keyed by node id, with only
// the aggregated discovery service registered, on a real loopback
// listener. It records every request it receives.
package xdstest

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
)

// Wait bounds every wait for the client.
const Wait = 20 * time.Second

// Server is a running management server.
type Server struct {
	// Addr is the address it listens on.
	Addr string

	cache    cachev3.SnapshotCache
	grpc     *grpc.Server
	requests chan *discoverypb.DiscoveryRequest
	cancel   context.CancelFunc
	done     chan struct{}

	mu sync.Mutex
	md metadata.MD // of the last stream opened
}

// Start serves on addr ("127.0.0.1:0" for any free port; a stopped
// server's Addr to restart it) with TLS when tlsCfg is not nil. The server
// stops when the test ends.
func Start(t testing.TB, addr string, tlsCfg *tls.Config) *Server {
	t.Helper()
	// Go listens with SO_REUSEADDR, and Stop has closed the old listener:
	// a restarted server gets its port back.
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{Addr: lis.Addr().String(), cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil),
		requests: make(chan *discoverypb.DiscoveryRequest, 256), cancel: cancel, done: make(chan struct{})}
	var opts []grpc.ServerOption
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	s.grpc = grpc.NewServer(opts...)
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, req *discoverypb.DiscoveryRequest) error {
		select {
		case s.requests <- req:
		default: // nobody reads them; do not block the server
		}
		return nil
	}, StreamOpenFunc: func(ctx context.Context, _ int64, _ string) error {
		md, _ := metadata.FromIncomingContext(ctx)
		s.mu.Lock()
		defer s.mu.Unlock()
		s.md = md
		return nil
	}}
	discoverypb.RegisterAggregatedDiscoveryServiceServer(s.grpc, serverv3.NewServer(ctx, s.cache, cb))
	go func() {
		defer close(s.done)
		_ = s.grpc.Serve(lis)
	}()
	t.Cleanup(s.Stop)
	return s
}

// Stop closes the listener and every stream. It may be called twice.
func (s *Server) Stop() {
	s.cancel()
	s.grpc.Stop()
	<-s.done
}

// Metadata is the gRPC metadata of the last stream opened.
func (s *Server) Metadata() metadata.MD {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.md
}

// Push sets the snapshot of version for node: these configs, and no
// other, are the node's state of the world.
func (s *Server) Push(t testing.TB, node, version string, cfgs ...*ratelimitpb.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(cfgs))
	for i, c := range cfgs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(context.Background(), node, snap); err != nil {
		t.Fatal(err)
	}
}

// Request waits for the next request the server receives.
func (s *Server) Request(t testing.TB) *discoverypb.DiscoveryRequest {
	t.Helper()
	select {
	case req := <-s.requests:
		return req
	case <-time.After(Wait):
		t.Fatal("xdstest: the client sent no request")
	}
	return nil
}

// Reply waits for the next request that answers a response (an ACK or a
// NACK: it carries the response's nonce), skipping the others.
func (s *Server) Reply(t testing.TB) *discoverypb.DiscoveryRequest {
	t.Helper()
	for {
		if req := s.Request(t); req.GetResponseNonce() != "" {
			return req
		}
	}
}

// Limits is a RateLimitConfig named name for domain with one rule, as
// Envoy Gateway writes them: generic_key=value, perMinute requests a minute.
func Limits(name, domain, value string, perMinute uint32) *ratelimitpb.RateLimitConfig {
	return &ratelimitpb.RateLimitConfig{Name: name, Domain: domain, Descriptors: []*ratelimitpb.RateLimitDescriptor{{
		Key: "generic_key", Value: value,
		RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_MINUTE, RequestsPerUnit: perMinute},
	}}}
}
