package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/loadgen/harness"
)

// fleet is what the soak runs: one Redis, the management server, and the
// Sluice replicas on both, with a connection to each.
type fleet struct {
	s       settings
	dir     string
	version string // `sluice version`
	redis   *harness.Redis
	xds     *xdsServer
	procs   []*harness.Sluice
	conns   []*grpc.ClientConn
}

// setUp starts the fleet, the first generation of limits already pushed
// (so that each replica starts with it, as a pod that joins a running
// gateway does). On error, what was started is stopped.
func setUp(s settings) (*fleet, error) {
	f := &fleet{s: s}
	if err := f.start(); err != nil {
		f.tearDown()
		return nil, err
	}
	return f, nil
}

func (f *fleet) start() error {
	var err error
	if f.dir, err = os.MkdirTemp("", "sluice-soak-churn-"); err != nil {
		return err
	}
	out, err := exec.Command(f.s.sluice, "version").Output()
	if err != nil {
		return fmt.Errorf("%s version: %w", f.s.sluice, err)
	}
	f.version = strings.TrimSpace(string(out))
	if f.redis, err = harness.StartRedis(f.s.redisServer, f.dir); err != nil {
		return err
	}
	if f.xds, err = startXDS(); err != nil {
		return err
	}
	if err := f.xds.push(1, f.s.renamed); err != nil {
		return err
	}
	return f.startReplicas()
}

func (f *fleet) startReplicas() error {
	env := egEnv(f.xds.addr, f.redis.Addr, f.s.egMapper)
	for i := range f.s.replicas {
		p, err := harness.StartSluice(f.s.sluice, fmt.Sprintf("sluice%d", i+1), f.dir, []string{"serve"}, env)
		if err != nil {
			return err
		}
		f.procs = append(f.procs, p)
		if p.Debug == "" && f.s.heap {
			return fmt.Errorf("%s logged no debug address (DEBUG_PORT):\n%s", p.Name, p.Log())
		}
		cc, err := grpc.NewClient(p.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		f.conns = append(f.conns, cc)
	}
	return nil
}

// egEnv is the environment of Envoy Gateway's default rate-limit
// Deployment (cmd/sluice/testdata/envoy-gateway/deployments.yaml,
// "default") with the soak's addresses, every port 0 on loopback (read
// back from the log), and TLS off: the soak measures memory, limits and
// errors, not handshakes (Envoy Gateway's mTLS set-up is
// TestBinary_EnvoyGateway's). With mapper empty, no reference Prometheus
// endpoint (USE_PROMETHEUS=false).
func egEnv(xdsAddr, redisAddr, mapper string) []string {
	env := []string{
		"RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_IGNOREDOTFILES=true", "RUNTIME_WATCH_ROOT=false",
		"LOG_LEVEL=info", "USE_STATSD=false",
		"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + xdsAddr, "CONFIG_GRPC_XDS_NODE_ID=" + nodeID,
		"GRPC_SERVER_USE_TLS=false", "CONFIG_GRPC_XDS_SERVER_USE_TLS=false", "FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr,
		"HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0",
	}
	if mapper == "" {
		return append(env, "USE_PROMETHEUS=false")
	}
	return append(env, "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:0", "PROMETHEUS_MAPPER_YAML="+mapper)
}

func (f *fleet) rls() []rlspb.RateLimitServiceClient {
	cs := make([]rlspb.RateLimitServiceClient, len(f.conns))
	for i, cc := range f.conns {
		cs[i] = rlspb.NewRateLimitServiceClient(cc)
	}
	return cs
}

func (f *fleet) rlqs() []rlqspb.RateLimitQuotaServiceClient {
	cs := make([]rlqspb.RateLimitQuotaServiceClient, len(f.conns))
	for i, cc := range f.conns {
		cs[i] = rlqspb.NewRateLimitQuotaServiceClient(cc)
	}
	return cs
}

// exited names the replicas that ended before the soak did.
func (f *fleet) exited() error {
	var errs []error
	for _, p := range f.procs {
		if done, err := p.Exited(); done {
			errs = append(errs, fmt.Errorf("%s exited during the soak (%v); its log: %s", p.Name, err, p.LogPath))
		}
	}
	return errors.Join(errs...)
}

// tearDown stops everything started and removes the directory, keeping
// it (and saying where) when keepLogs is set.
func (f *fleet) tearDown() {
	for _, cc := range f.conns {
		cc.Close()
	}
	for _, p := range f.procs {
		p.Stop()
	}
	if f.xds != nil {
		f.xds.close()
	}
	if f.redis != nil {
		f.redis.Kill()
	}
	if f.dir != "" && !f.s.keepLogs {
		os.RemoveAll(f.dir)
	}
}
