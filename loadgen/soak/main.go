// Command soak is the long run behind `make soak`: it starts three
// `sluice serve --store redis` instances on one redis-server of its own
// and one `sluice serve --store memory`, drives them with `sluice bench`
// in the open loop (several workloads, together about 60 % of what one
// Redis instance answers in a closed loop) and with canary requests of
// its own, rewrites the limits file every 10 s and restarts Redis every 2
// minutes. Every 10 s it records each instance's RSS, goroutines, open
// file descriptors and request outcomes in a CSV file; at the end it
// prints a summary and fails (exit 1) unless
//
//   - RSS and goroutines are flat: the median of the last minute is
//     within 10 % of the third minute's (of the last quarter and the
//     second quarter of runs shorter than 4 minutes), per instance;
//
//   - no canary key was granted more than its limit in any window (the
//     canary keys change before each Redis restart, so that no budget
//     spans one);
//
//   - no request failed outside the Redis-down intervals (from the kill
//     to 2 s after the new process answers; a 10 s bench chunk that
//     overlaps one is excused whole).
//
//     go run ./loadgen/soak -sluice bin/sluice -duration 10m -csv soak.csv
package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	ratelimitpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/loadgen/harness"
)

type settings struct {
	sluice, redisServer, csvPath string
	duration                     time.Duration
	restartEvery, rewriteEvery   time.Duration
	sample                       time.Duration
	fraction                     float64
	canaryLimit                  int
	canaryRate                   float64
}

func main() {
	var s settings
	flag.StringVar(&s.sluice, "sluice", "bin/sluice", "the sluice binary")
	flag.StringVar(&s.redisServer, "redis-server", "redis-server", "redis-server binary")
	flag.StringVar(&s.csvPath, "csv", "soak.csv", "CSV file of the 10 s samples")
	flag.DurationVar(&s.duration, "duration", 10*time.Minute, "how long to soak")
	flag.DurationVar(&s.restartEvery, "restart-every", 2*time.Minute, "Redis is killed and restarted this often")
	flag.DurationVar(&s.rewriteEvery, "rewrite-every", 10*time.Second, "the limits file is rewritten this often")
	flag.DurationVar(&s.sample, "sample", 10*time.Second, "sampling interval (and bench chunk length)")
	flag.Float64Var(&s.fraction, "fraction", 0.6, "open-loop load as a fraction of one Redis instance's closed-loop throughput")
	flag.IntVar(&s.canaryLimit, "canary-limit", 20, "requests per minute of each canary key")
	flag.Float64Var(&s.canaryRate, "canary-rate", 40, "canary requests per second, over all instances")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ok, err := run(ctx, s, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
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

func run(ctx context.Context, s settings, out io.Writer) (bool, error) {
	dir, err := os.MkdirTemp("", "sluice-soak-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(dir)
	limits := filepath.Join(dir, "limits")
	if err := os.Mkdir(limits, 0o755); err != nil {
		return false, err
	}
	if err := writeLimits(limits, 0, s.canaryLimit); err != nil {
		return false, err
	}
	rd, err := harness.StartRedis(s.redisServer, dir)
	if err != nil {
		return false, err
	}
	defer rd.Kill()

	var insts []*instance
	defer func() {
		for _, in := range insts {
			in.stop()
		}
	}()
	for i, st := range []string{"redis", "redis", "redis", "memory"} {
		in, err := startInstance(s.sluice, fmt.Sprintf("%s%d", st, i+1), st, limits, rd.Addr, dir)
		if err != nil {
			return false, err
		}
		insts = append(insts, in)
	}
	// Capacity: one Redis instance in a closed loop.
	cal, err := bench(ctx, s.sluice, insts[0].proc.GRPC, "distinct", 0, 5*time.Second, "--concurrency", "50")
	if err != nil {
		return false, fmt.Errorf("calibration: %w", err)
	}
	perStream := math.Max(100, math.Floor(s.fraction*cal.RPS/float64(len(insts))))
	fmt.Fprintf(out, "capacity %.0f req/s (one Redis instance, closed loop at 50); open loop %.0f req/s on each of %d instances\n",
		cal.RPS, perStream, len(insts))

	start := time.Now()
	end := start.Add(s.duration)
	runCtx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	var down harness.Outages
	var wg sync.WaitGroup
	var chunkErr error
	var errMu sync.Mutex
	workloads := []string{"distinct", "multi", "hot", "distinct"}
	for i, in := range insts {
		in.workload = workloads[i%len(workloads)]
		wg.Go(func() {
			for runCtx.Err() == nil {
				left := time.Until(end)
				if left < time.Second {
					return
				}
				t0 := time.Now()
				r, err := bench(runCtx, s.sluice, in.proc.GRPC, in.workload, perStream, min(s.sample, left), "--concurrency", "100", "--timeout", "1s")
				t1 := time.Now()
				if err != nil {
					if runCtx.Err() == nil {
						errMu.Lock()
						chunkErr = errors.Join(chunkErr, fmt.Errorf("%s: %w", in.name, err))
						errMu.Unlock()
					}
					return
				}
				var o outcomes
				o.requests, o.ok = r.Requests, r.Codes["OK"]
				o.overLimit = r.Overall["OVER_LIMIT"]
				failed := r.Requests - o.ok + r.Unfinished
				if in.store == "redis" && down.Overlaps(t0, t1) {
					o.excused = failed
				} else {
					o.failed = failed
				}
				in.mu.Lock()
				in.window.add(o)
				in.mu.Unlock()
			}
		})
	}
	can := newCanaries(s.canaryLimit)
	wg.Go(func() { can.run(runCtx, insts, s.canaryRate, &down) })
	wg.Go(func() {
		if err := rd.RestartEvery(runCtx, restartPlan(s.restartEvery, can), &down); err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
		}
	})
	wg.Go(func() {
		t := time.NewTicker(s.rewriteEvery)
		defer t.Stop()
		for gen := 1; ; gen++ {
			select {
			case <-runCtx.Done():
				return
			case <-t.C:
			}
			if err := writeLimits(limits, gen, s.canaryLimit); err != nil {
				errMu.Lock()
				chunkErr = errors.Join(chunkErr, err)
				errMu.Unlock()
			}
		}
	})

	f, err := os.Create(s.csvPath)
	if err != nil {
		return false, err
	}
	defer f.Close()
	w := csv.NewWriter(f)
	w.Write([]string{"t_s", "instance", "store", "workload", "rss_kib", "goroutines", "open_fds", "requests", "ok", "over_limit",
		"failed", "failed_redis_down", "canary_ok", "canary_failed", "canary_failed_redis_down", "redis_down"})
	var total outcomes
	// RSS, goroutines and descriptors are read every second; each row
	// holds the median of its interval's readings, so that the requests
	// in flight at one instant do not decide it.
	tick := time.NewTicker(time.Second)
	type reading struct{ rss, gor, fds []float64 }
	readings := make([]reading, len(insts))
	nextRow := start.Add(s.sample)
	for done := false; !done; {
		select {
		case <-runCtx.Done():
			done = true
		case <-tick.C:
		}
		for i, in := range insts {
			rss, fds := harness.ProcStats(in.proc.Pid())
			r := &readings[i]
			r.rss, r.gor, r.fds = append(r.rss, rss), append(r.gor, goroutines(in.proc.HTTP)), append(r.fds, float64(fds))
		}
		now := time.Now()
		if now.Before(nextRow) && !done {
			continue
		}
		nextRow = nextRow.Add(s.sample)
		el := now.Sub(start).Seconds()
		isDown := down.Overlaps(now.Add(-s.sample), now)
		for i, in := range insts {
			r := &readings[i]
			rss, gor, fds := median(r.rss), median(r.gor), median(r.fds)
			*r = reading{r.rss[:0], r.gor[:0], r.fds[:0]}
			in.mu.Lock()
			o := in.window
			in.window = outcomes{}
			in.mu.Unlock()
			in.rss, in.goroutines, in.times = append(in.rss, rss), append(in.goroutines, gor), append(in.times, el)
			total.add(o)
			w.Write([]string{strconv.FormatFloat(el, 'f', 0, 64), in.name, in.store, in.workload,
				strconv.FormatFloat(rss, 'f', 0, 64), strconv.FormatFloat(gor, 'f', 0, 64), strconv.FormatFloat(fds, 'f', 0, 64),
				u(o.requests), u(o.ok), u(o.overLimit), u(o.failed), u(o.excused), u(o.canaryOK), u(o.canaryFailed), u(o.canaryExcused),
				strconv.FormatBool(isDown)})
		}
		w.Flush()
	}
	tick.Stop()
	wg.Wait()
	// The last chunks ended after the last sample.
	for _, in := range insts {
		total.add(in.window)
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	errMu.Lock()
	defer errMu.Unlock()
	if chunkErr != nil {
		return false, chunkErr
	}
	return summarise(out, s, insts, total, can, &down, rd.Restarts()), w.Error()
}

// restartPlan kills Redis every period for 2 s. Canary requests pause
// from a second before the kill until the new process answers, and then
// use new keys, so that no canary budget spans a restart (Redis forgets
// its counters). The outage lasts 2 s more, for the breakers to close
// (their probe runs every 100 ms while open).
func restartPlan(period time.Duration, can *canaries) harness.RestartPlan {
	return harness.RestartPlan{Every: period, Down: 2 * time.Second, Grace: 2 * time.Second,
		Before: func() {
			can.pause()
			time.Sleep(1100 * time.Millisecond) // canaries under way end (1 s timeout)
		},
		After: can.nextEpoch}
}

func u(v uint64) string { return strconv.FormatUint(v, 10) }

// summarise prints the pass/fail table and reports whether all passed.
func summarise(out io.Writer, s settings, insts []*instance, total outcomes, can *canaries, down *harness.Outages, restarts int) bool {
	pass := true
	check := func(ok bool) string {
		if ok {
			return "pass"
		}
		pass = false
		return "**FAIL**"
	}
	d := s.duration.Seconds()
	refFrom, refTo, lastFrom := 120.0, 180.0, d-60
	if d < 240 {
		refFrom, refTo, lastFrom = d/4, d/2, d*3/4
	}
	fmt.Fprintf(out, "\n| check | instance | reference median | final median | change | result |\n|---|---|---:|---:|---:|---|\n")
	for _, in := range insts {
		for _, m := range []struct {
			name string
			v    []float64
			unit string
		}{{"RSS", in.rss, " KiB"}, {"goroutines", in.goroutines, ""}} {
			ref, last := medianIn(in.times, m.v, refFrom, refTo), medianIn(in.times, m.v, lastFrom, d+1)
			change := (last - ref) / ref
			fmt.Fprintf(out, "| %s flat (≤ 10 %%) | %s (%s) | %.0f%s | %.0f%s | %+.1f %% | %s |\n", m.name, in.name, in.store,
				ref, m.unit, last, m.unit, 100*change, check(ref > 0 && math.Abs(change) <= 0.10))
		}
	}
	over, windows, grants := can.overGrants()
	fmt.Fprintf(out, "| canary over-grants | all | | | %d of %d key windows over the limit of %d, %d grants | %s |\n", len(over), windows, s.canaryLimit, grants, check(len(over) == 0 && grants > 0))
	fmt.Fprintf(out, "| failed outside Redis-down intervals | all | | | %d of %d bench + %d of %d canary | %s |\n",
		total.failed, total.requests, total.canaryFailed, total.canaryOK+total.canaryFailed+total.canaryExcused, check(total.failed == 0 && total.canaryFailed == 0))
	for _, o := range over {
		fmt.Fprintf(out, "over-granted: %s\n", o)
	}
	can.mu.Lock()
	for _, f := range can.failures {
		fmt.Fprintf(out, "canary failed: %s\n", f)
	}
	can.mu.Unlock()
	downFor := down.Total()
	fmt.Fprintf(out, "\n%v soak, %d Redis restarts (down %v in all, grace included); %d bench requests (%d OK, %d over limit), %d failed while Redis was down (excused); %d canary requests failed while Redis was down (excused).\n",
		s.duration, restarts, downFor.Round(time.Millisecond), total.requests, total.ok, total.overLimit, total.excused, total.canaryExcused)
	if pass {
		fmt.Fprintln(out, "PASS")
	} else {
		fmt.Fprintln(out, "FAIL")
	}
	return pass
}

// medianIn is the median of v at times in [from, to).
func medianIn(times, v []float64, from, to float64) float64 {
	var sel []float64
	for i, t := range times {
		if t >= from && t < to {
			sel = append(sel, v[i])
		}
	}
	return median(sel)
}

// median sorts v and returns its median (0 if empty).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[len(v)/2]
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

// goroutines reads go_goroutines from an instance's /metrics.
func goroutines(httpAddr string) float64 {
	m, err := harness.Scrape(context.Background(), http.DefaultClient, "http://"+httpAddr+"/metrics", "go_goroutines")
	if err != nil {
		return 0
	}
	return m.Sum["go_goroutines"]
}

// canaries sends requests on keys whose budgets are exact and checks that
// no window of any key was granted more than its limit: the Redis
// instances share one budget per key, the memory instance has its own.
type canaries struct {
	limit  int
	mu     sync.Mutex
	epoch  int
	paused bool
	// failures outside the Redis-down intervals, for the summary
	failures []string
	// grants per "group/key/window end (unix minutes)".
	grants map[string]int
}

func newCanaries(limit int) *canaries { return &canaries{limit: limit, grants: map[string]int{}} }

// pause stops new canary requests until nextEpoch.
func (c *canaries) pause() {
	c.mu.Lock()
	c.paused = true
	c.mu.Unlock()
}

// nextEpoch resumes canary requests on new keys.
func (c *canaries) nextEpoch() {
	c.mu.Lock()
	c.epoch++
	c.paused = false
	c.mu.Unlock()
}

func (c *canaries) run(ctx context.Context, insts []*instance, rate float64, down *harness.Outages) {
	const keys, workers = 4, 8
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) * workers / rate)
	for wk := range workers {
		wg.Go(func() {
			t := time.NewTicker(interval)
			defer t.Stop()
			for n := wk; ; n++ {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				in := insts[n%len(insts)]
				group := "redis"
				if in.store == "memory" {
					group = "memory"
				}
				c.mu.Lock()
				// (Each key goes to every instance in turn.)
				key, paused := fmt.Sprintf("%s-e%d-k%d", group, c.epoch, n/len(insts)%keys), c.paused
				c.mu.Unlock()
				if !paused {
					c.send(ctx, in, group, key, down)
				}
			}
		})
	}
	wg.Wait()
}

func (c *canaries) send(ctx context.Context, in *instance, group, key string, down *harness.Outages) {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	t0 := time.Now()
	resp, err := rlspb.NewRateLimitServiceClient(in.conn).ShouldRateLimit(cctx, &rlspb.RateLimitRequest{Domain: "soak",
		Descriptors: []*ratelimitpb.RateLimitDescriptor{{Entries: []*ratelimitpb.RateLimitDescriptor_Entry{{Key: "canary", Value: key}}}}})
	t1 := time.Now()
	if ctx.Err() != nil {
		return // the end of the soak, not a failure
	}
	var o outcomes
	switch {
	case err != nil:
		if group == "redis" && down.Overlaps(t0, t1) {
			o.canaryExcused = 1
		} else {
			o.canaryFailed = 1
			c.mu.Lock()
			c.failures = append(c.failures, fmt.Sprintf("%s %s after %v: %v", t0.Format(time.TimeOnly), in.name, t1.Sub(t0).Round(time.Millisecond), err))
			c.mu.Unlock()
		}
	case resp.OverallCode == rlspb.RateLimitResponse_OK:
		o.canaryOK = 1
		st := resp.Statuses[0]
		// The window's end, to the minute: the reply's time plus the
		// time until the reset, rounded.
		endMin := int64(math.Round(float64(t1.Add(st.DurationUntilReset.AsDuration()).Unix()) / 60))
		c.mu.Lock()
		c.grants[group+"/"+key+"/"+strconv.FormatInt(endMin, 10)]++
		c.mu.Unlock()
	}
	in.mu.Lock()
	in.window.add(o)
	in.mu.Unlock()
}

// overGrants returns the key windows granted more than the limit (as
// "group/key/window: grants"), the key windows seen and the grants.
func (c *canaries) overGrants() (over []string, windows, grants int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, n := range c.grants {
		if n > c.limit {
			over = append(over, fmt.Sprintf("%s: %d", k, n))
		}
		grants += n
	}
	slices.Sort(over)
	return over, len(c.grants), grants
}
