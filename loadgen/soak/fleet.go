package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/loadgen/harness"
)

// instances are the soak's `sluice serve` processes: each one's store and
// the workload of its bench chunks.
var instances = []struct{ store, workload string }{
	{"redis", "distinct"}, {"redis", "multi"}, {"redis", "hot"}, {"memory", "distinct"},
}

// fleet is what the soak runs: a directory with the limits, one Redis and
// the instances.
type fleet struct {
	s      settings
	dir    string
	limits string // the directory of the limits file
	redis  *harness.Redis
	insts  []*instance
}

// setUp writes the first limits and starts Redis and the instances. On
// error, what was started is stopped.
func setUp(s settings) (*fleet, error) {
	f := &fleet{s: s}
	if err := f.start(); err != nil {
		f.tearDown()
		return nil, err
	}
	return f, nil
}

func (f *fleet) start() (err error) {
	if f.dir, err = os.MkdirTemp("", "sluice-soak-"); err != nil {
		return err
	}
	f.limits = filepath.Join(f.dir, "limits")
	if err := os.Mkdir(f.limits, 0o755); err != nil {
		return err
	}
	if err := writeLimits(f.limits, 0, f.s.canaryLimit); err != nil {
		return err
	}
	if f.redis, err = harness.StartRedis(f.s.redisServer, f.dir); err != nil {
		return err
	}
	for i, c := range instances {
		in, err := startInstance(f.s.sluice, fmt.Sprintf("%s%d", c.store, i+1), c.store, f.limits, f.redis.Addr, f.dir)
		if err != nil {
			return err
		}
		in.workload = c.workload
		f.insts = append(f.insts, in)
	}
	return nil
}

// tearDown stops everything started and removes the directory.
func (f *fleet) tearDown() {
	for _, in := range f.insts {
		in.stop()
	}
	if f.redis != nil {
		f.redis.Kill()
	}
	if f.dir != "" {
		os.RemoveAll(f.dir)
	}
}

// calibrate measures one Redis instance's closed-loop throughput, and
// returns each instance's open-loop rate: -fraction of it, shared by the
// instances, at least 100/s.
func (f *fleet) calibrate(ctx context.Context, out io.Writer) (float64, error) {
	cal, err := bench(ctx, f.s.sluice, f.insts[0].proc.GRPC, "distinct", 0, 5*time.Second, "--concurrency", "50")
	if err != nil {
		return 0, fmt.Errorf("calibration: %w", err)
	}
	perStream := math.Max(100, math.Floor(f.s.fraction*cal.RPS/float64(len(f.insts))))
	fmt.Fprintf(out, "capacity %.0f req/s (one Redis instance, closed loop at 50); open loop %.0f req/s on each of %d instances\n",
		cal.RPS, perStream, len(f.insts))
	return perStream, nil
}

// instance is one sluice serve process.
type instance struct {
	name, store     string
	proc            *harness.Sluice
	conn            *grpc.ClientConn
	workload        string
	mu              sync.Mutex
	window          outcomes // since the last sample
	rss, goroutines []float64
	times           []float64 // seconds since the start, per sample
}

func startInstance(bin, name, st, limits, redisAddr, dir string) (*instance, error) {
	args := []string{"serve", "--config", limits, "--store", st, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-level", "info"}
	if st == "redis" {
		args = append(args, "--redis-url", "redis://"+redisAddr)
	}
	p, err := harness.StartSluice(bin, name, dir, args, nil)
	if err != nil {
		return nil, err
	}
	in := &instance{name: name, store: st, proc: p}
	in.conn, err = grpc.NewClient(p.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		in.stop()
		return nil, err
	}
	return in, nil
}

func (in *instance) stop() {
	if in.conn != nil {
		in.conn.Close()
	}
	in.proc.Stop()
}

// count adds o to the outcomes since the last sample.
func (in *instance) count(o outcomes) {
	in.mu.Lock()
	in.window.add(o)
	in.mu.Unlock()
}

// take returns the outcomes since the last sample and starts anew.
func (in *instance) take() outcomes {
	in.mu.Lock()
	defer in.mu.Unlock()
	o := in.window
	in.window = outcomes{}
	return o
}

// outcomes counts requests by result.
type outcomes struct {
	requests, ok, overLimit, failed uint64 // bench chunks
	excused                         uint64 // failed, in chunks that overlap a Redis-down interval
	canaryOK, canaryFailed          uint64
	canaryExcused                   uint64
}

func (o *outcomes) add(p outcomes) {
	o.requests += p.requests
	o.ok += p.ok
	o.overLimit += p.overLimit
	o.failed += p.failed
	o.excused += p.excused
	o.canaryOK += p.canaryOK
	o.canaryFailed += p.canaryFailed
	o.canaryExcused += p.canaryExcused
}

// writeLimits writes generation gen of the limits (it changes the hot
// key's limit, so each rewrite is a real reload), by rename, as a
// Kubernetes ConfigMap update swaps the file.
func writeLimits(dir string, gen, canaryLimit int) error {
	y := fmt.Sprintf(`# generation %d
domain: soak
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: hot
    value: hot
    rate_limit: {unit: second, requests_per_unit: %d}
  - key: k1
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: k2
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: k3
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: k4
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: canary
    rate_limit: {unit: minute, requests_per_unit: %d}
`, gen, 10+gen%2, canaryLimit)
	tmp := filepath.Join(dir, ".limits.yaml.tmp")
	if err := os.WriteFile(tmp, []byte(y), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "limits.yaml"))
}

// benchResult is the part of `sluice bench --json` the soak reads.
type benchResult struct {
	Requests   uint64            `json:"requests"`
	RPS        float64           `json:"rps"`
	Unfinished uint64            `json:"unfinished"`
	Codes      map[string]uint64 `json:"grpc_codes"`
	Overall    map[string]uint64 `json:"overall_codes"`
}

// bench runs one `sluice bench` (rate 0: closed loop) of d.
func bench(ctx context.Context, bin, addr, workload string, rate float64, d time.Duration, extra ...string) (*benchResult, error) {
	args := append([]string{"bench", "--addr", addr, "--domain", "soak", "--workload", workload, "--keys", "10000",
		"--duration", d.String(), "--warmup", "0s", "--rate", strconv.FormatFloat(rate, 'f', 0, 64), "--json"}, extra...)
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("sluice bench: %w: %s", err, stderr.String())
	}
	var r benchResult
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("sluice bench: %w", err)
	}
	return &r, nil
}

// outcomes counts a chunk's requests; excused puts its failures
// (unanswered included) among those excused.
func (r *benchResult) outcomes(excused bool) outcomes {
	o := outcomes{requests: r.Requests, ok: r.Codes["OK"], overLimit: r.Overall["OVER_LIMIT"]}
	failed := r.Requests - o.ok + r.Unfinished
	if excused {
		o.excused = failed
	} else {
		o.failed = failed
	}
	return o
}
