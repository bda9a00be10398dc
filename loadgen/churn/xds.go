package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
)

// The limits every push carries. The RLS traffic and the RLQS fleet use
// the fixed rules, which keep their keys (and so their counters in Redis)
// across pushes; the renamed rules beside them get new keys every push.
const (
	domain = "soak"
	nodeID = "envoy-ratelimit" // Envoy Gateway's node id for its rate-limit pods

	routeKey = "route" // RLS: {route: limited[i].name}

	tenantKey   = "tenant" // RLQS: {tenant: shared} for the fleet, {tenant: <fresh>} for churning streams
	sharedValue = "shared"
	rlqsLimit   = 100 // per second, bucket {tenant: shared}
	freshLimit  = 10  // per second, each fresh tenant

	// detailedKey is a detailed_metric rule: its values are labelled,
	// at most --metrics-max-values-per-rule of them (100).
	detailedKey   = "client"
	detailedLimit = 1000 // per second; never reached

	renamedLimit = 1000 // per second; never reached
	leafKey      = "rule-0-match-0"
)

// limitedRule is a fixed RLS rule whose admitted total per window is held
// against its limit.
type limitedRule struct {
	name      string
	perSecond uint32
}

var limited = []limitedRule{{"a", 100}, {"b", 20}}

// renamedRoute is route i's descriptor key (and value) in generation gen,
// as Envoy Gateway names a route rule's descriptor.
func renamedRoute(gen, i int) string {
	return fmt.Sprintf("httproute/soak/route-%d-g%d/rule/0/match/0", i, gen)
}

// limits is generation gen of the config: the fixed rules and renamed
// rules named for gen, as Envoy Gateway writes a listener's
// RateLimitConfig (a route level without a limit, then the rule).
func limits(gen, renamed int) *ratelimitpb.RateLimitConfig {
	perSecond := func(n uint32) *ratelimitpb.RateLimitPolicy {
		return &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_SECOND, RequestsPerUnit: n}
	}
	ds := make([]*ratelimitpb.RateLimitDescriptor, 0, len(limited)+4+renamed)
	for _, r := range limited {
		ds = append(ds, &ratelimitpb.RateLimitDescriptor{Key: routeKey, Value: r.name, RateLimit: perSecond(r.perSecond)})
	}
	ds = append(ds,
		&ratelimitpb.RateLimitDescriptor{Key: tenantKey, Value: sharedValue, RateLimit: perSecond(rlqsLimit)},
		&ratelimitpb.RateLimitDescriptor{Key: tenantKey, RateLimit: perSecond(freshLimit)},
		&ratelimitpb.RateLimitDescriptor{Key: detailedKey, DetailedMetric: true, RateLimit: perSecond(detailedLimit)})
	for i := range renamed {
		r := renamedRoute(gen, i)
		ds = append(ds, &ratelimitpb.RateLimitDescriptor{Key: r, Value: r, Descriptors: []*ratelimitpb.RateLimitDescriptor{{
			Key: leafKey, RateLimit: perSecond(renamedLimit)}}})
	}
	return &ratelimitpb.RateLimitConfig{Name: "soak/gateway/http", Domain: domain, Descriptors: ds}
}

// xdsServer is the soak's management server: go-control-plane's ADS
// server on a snapshot cache, one node id (every replica takes the same
// limits, as with Envoy Gateway), plain TCP on loopback. It counts the
// replies. Safe for concurrent use.
type xdsServer struct {
	addr  string
	cache cachev3.SnapshotCache
	grpc  *grpc.Server
	stop  context.CancelFunc
	done  chan struct{}

	mu       sync.Mutex
	pushed   int           // the last generation pushed
	acked    map[int64]int // by open stream: the last generation ACKed
	acks     int
	nacks    int
	lastNack string
}

func startXDS() (*xdsServer, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	x := &xdsServer{addr: lis.Addr().String(), cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil),
		grpc: grpc.NewServer(), stop: cancel, done: make(chan struct{}), acked: map[int64]int{}}
	cb := serverv3.CallbackFuncs{StreamRequestFunc: x.onRequest, StreamClosedFunc: x.onClosed}
	discoverypb.RegisterAggregatedDiscoveryServiceServer(x.grpc, serverv3.NewServer(ctx, x.cache, cb))
	go func() {
		defer close(x.done)
		_ = x.grpc.Serve(lis)
	}()
	return x, nil
}

func (x *xdsServer) close() {
	x.stop()
	x.grpc.Stop()
	<-x.done
}

// onRequest counts a reply to a response (it carries the response's
// nonce): a NACK has an error_detail, an ACK's version is the one now in
// force on that stream.
func (x *xdsServer) onRequest(id int64, req *discoverypb.DiscoveryRequest) error {
	if req.GetResponseNonce() == "" {
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if d := req.GetErrorDetail(); d != nil {
		x.nacks++
		x.lastNack = d.GetMessage()
		return nil
	}
	x.acks++
	if v, err := strconv.Atoi(req.GetVersionInfo()); err == nil {
		x.acked[id] = v
	}
	return nil
}

func (x *xdsServer) onClosed(id int64, _ *corepb.Node) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.acked, id)
}

// push makes generation gen, of renamed rules, the node's state of the
// world.
func (x *xdsServer) push(gen, renamed int) error {
	snap, err := cachev3.NewSnapshot(strconv.Itoa(gen),
		map[resource.Type][]types.Resource{resource.RateLimitConfigType: {limits(gen, renamed)}})
	if err != nil {
		return err
	}
	if err := x.cache.SetSnapshot(context.Background(), nodeID, snap); err != nil {
		return err
	}
	x.mu.Lock()
	x.pushed = gen
	x.mu.Unlock()
	return nil
}

// generation is the last generation pushed.
func (x *xdsServer) generation() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.pushed
}

// pushEvery pushes the next generation every period until ctx ends.
func (x *xdsServer) pushEvery(ctx context.Context, period time.Duration, renamed int) error {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := x.push(x.generation()+1, renamed); err != nil {
			return err
		}
	}
}

// xdsState is what the server saw.
type xdsState struct {
	Pushed, ACKs, NACKs int
	LastNACK            string
	// Lag is the generations between the last pushed and the oldest in
	// force on an open stream; Streams the open streams.
	Lag, Streams int
}

func (x *xdsServer) state() xdsState {
	x.mu.Lock()
	defer x.mu.Unlock()
	st := xdsState{Pushed: x.pushed, ACKs: x.acks, NACKs: x.nacks, LastNACK: x.lastNack, Streams: len(x.acked)}
	for _, v := range x.acked {
		st.Lag = max(st.Lag, x.pushed-v)
	}
	return st
}
