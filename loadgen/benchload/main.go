// Command benchload is the load benchmark behind `make bench-load`.
//
// It starts `sluice serve` with the bench limits (memory store) and a
// no-op RLS server (`sluice bench --noop-listen`, the floor gRPC-go sets
// on the machine), both on loopback, and drives them with the loadgen
// library in this process: every workload at every concurrency against
// each server in turn (the order alternating from cell to cell); then,
// if redis-server is installed, the same against `sluice serve --store
// redis` on a redis-server of its own for the distinct and multi
// workloads; then open-loop runs at fractions of the no-op server's
// throughput, then a cross-check of the latencies against ghz at a fixed
// rate. It writes the results, with the machine's description, as
// Markdown.
//
//	go run ./loadgen/benchload -sluice bin/sluice -out docs/BENCHMARKS.md
package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	ratelimitpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/loadgen"
)

type settings struct {
	sluice, config, out, ghz    string
	cpuProfile, redisServer     string
	duration, warmup            time.Duration
	concurrency, redisConc      []int
	workloads                   []string
	connections, keys, openConc int
	repeat                      int
	openFractions               []float64
	ghzRate                     float64
	starveBusy                  int
	starveTimeout               time.Duration
}

// busyEnv makes this program a CPU-bound process of the starvation runs.
const busyEnv = "SLUICE_BENCHLOAD_BUSY"

func main() {
	if os.Getenv(busyEnv) != "" {
		spin()
	}
	var s settings
	var conc, redisConc, workloads, fractions string
	flag.StringVar(&s.sluice, "sluice", "bin/sluice", "the sluice binary")
	flag.StringVar(&s.config, "config", "examples/bench.yaml", "limits for sluice serve")
	flag.StringVar(&s.out, "out", "docs/BENCHMARKS.md", "Markdown file to write (- for stdout)")
	flag.StringVar(&s.ghz, "ghz", ".bin/ghz", "ghz binary for the cross-check; skipped if absent")
	flag.DurationVar(&s.duration, "duration", 5*time.Second, "measured time per run")
	flag.DurationVar(&s.warmup, "warmup", time.Second, "warmup per run")
	flag.StringVar(&conc, "concurrency", "1,50,200", "closed-loop concurrencies")
	flag.StringVar(&s.redisServer, "redis-server", "redis-server", "redis-server binary for the Redis store's runs; skipped if absent")
	flag.StringVar(&redisConc, "redis-concurrency", "50,200", "closed-loop concurrencies of the Redis store's runs")
	flag.StringVar(&workloads, "workloads", "distinct,hot,multi", "workloads")
	flag.IntVar(&s.connections, "connections", 2, "HTTP/2 connections per run")
	flag.IntVar(&s.keys, "keys", 10000, "distinct values of the distinct and multi workloads")
	flag.IntVar(&s.openConc, "open-concurrency", 200, "request slots of the open-loop runs")
	flag.IntVar(&s.repeat, "repeat", 1, "runs per cell and server; the median is reported")
	flag.StringVar(&fractions, "open-fractions", "0.8,0.5", "open-loop rates as fractions of the no-op server's closed-loop throughput at concurrency 50")
	flag.Float64Var(&s.ghzRate, "ghz-rate", 1000, "requests/s of the ghz cross-check")
	flag.IntVar(&s.starveBusy, "starve-busy", 3, "CPU-bound processes beside the Redis store's starvation runs (0 skips them)")
	flag.DurationVar(&s.starveTimeout, "starve-timeout", time.Second, "each call's deadline (grpc-timeout) in the starvation runs")
	flag.StringVar(&s.cpuProfile, "cpuprofile", "", "write sluice's CPU profile during the multi run at concurrency 50 to this file")
	flag.Parse()
	s.concurrency = positives("concurrency", conc)
	s.redisConc = positives("redis-concurrency", redisConc)
	s.workloads = strings.Split(workloads, ",")
	for _, f := range strings.Split(fractions, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v <= 0 {
			fatal(fmt.Errorf("-open-fractions %q: want positive numbers", fractions))
		}
		s.openFractions = append(s.openFractions, v)
	}
	if s.repeat < 1 {
		fatal(errors.New("-repeat must be at least 1"))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, s)
	if err != nil {
		fatal(err)
	}
	w := io.Writer(os.Stdout)
	if s.out != "-" {
		f, err := os.Create(s.out)
		if err != nil {
			fatal(err)
		}
		defer f.Close()
		w = f
	}
	if err := rep.write(w); err != nil {
		fatal(err)
	}
	if s.out != "-" {
		fmt.Fprintln(os.Stderr, "wrote", s.out)
	}
}

// positives parses the comma-separated value of flag name.
func positives(name, list string) []int {
	var ns []int
	for _, c := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 1 {
			fatal(fmt.Errorf("-%s %q: want positive integers", name, list))
		}
		ns = append(ns, n)
	}
	return ns
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "benchload:", err)
	os.Exit(1)
}

// server is a process under test.
type server struct {
	name  string
	cmd   *exec.Cmd
	addr  string
	log   []string     // stderr up to the line that named addr
	redis *redisServer // the server's store, if Redis
}

// start runs the command and waits for the stderr line that names its
// gRPC address: the text after marker, up to the next space.
func start(ctx context.Context, name, marker string, bin string, args ...string) (*server, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	srv := &server{name: name, cmd: cmd}
	found := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			if found == nil {
				continue
			}
			if i := strings.Index(line, marker); i >= 0 {
				srv.addr = strings.Fields(line[i+len(marker):])[0]
				found <- true
				found = nil
			} else {
				srv.log = append(srv.log, line)
			}
		}
		if found != nil {
			fmt.Fprintf(os.Stderr, "%s exited before serving:\n%s\n", name, strings.Join(srv.log, "\n"))
			close(found)
		}
	}()
	select {
	case ok := <-found:
		if !ok {
			cmd.Wait()
			return nil, fmt.Errorf("%s did not start", name)
		}
		return srv, nil
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("%s did not report its address within 30s", name)
	}
}

func (s *server) stop() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	s.cmd.Wait()
}

// cpu is the CPU time the process has used, from /proc (Linux).
func (s *server) cpu() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// Fields after the parenthesised command name: state is field 3,
	// utime and stime are fields 14 and 15, in clock ticks (100 a second
	// on Linux).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// measured is one run against one server.
type measured struct {
	*loadgen.Result
	// ServerCPU is the server's CPU time per request in µs, warmup
	// included.
	ServerCPU float64
	// RedisCPU (µs) and RedisCommands are Redis's CPU time and commands
	// per request in the measured time, if the server's store is Redis.
	RedisCPU, RedisCommands float64
}

func (s *server) measure(ctx context.Context, o loadgen.Options) (measured, error) {
	o.Target = s.addr
	c0 := s.cpu()
	// Redis's counters are read when the warmup ends (by this process's
	// clock) and after the run, so they cover the measured calls.
	var r0 redisStats
	warm := make(chan error, 1)
	if s.redis != nil {
		time.AfterFunc(o.Warmup, func() {
			var err error
			r0, err = s.redis.stats()
			warm <- err
		})
	}
	res, err := loadgen.Run(ctx, o)
	if err != nil {
		return measured{}, fmt.Errorf("%s: %w", s.name, err)
	}
	// Calls in the warmup used CPU too: scale by the whole run's time.
	total := float64(res.Requests) * float64(o.Warmup+o.Duration) / float64(o.Duration)
	m := measured{Result: res}
	if total > 0 {
		m.ServerCPU = float64((s.cpu() - c0).Microseconds()) / total
	}
	extra := ""
	if s.redis != nil {
		if err := <-warm; err != nil {
			return measured{}, fmt.Errorf("%s: %w", s.name, err)
		}
		r1, err := s.redis.stats()
		if err != nil {
			return measured{}, fmt.Errorf("%s: %w", s.name, err)
		}
		if res.Requests > 0 {
			m.RedisCPU = float64((r1.cpu - r0.cpu).Microseconds()) / float64(res.Requests)
			// Less the first INFO, which the second counts.
			m.RedisCommands = float64(r1.commands-r0.commands-1) / float64(res.Requests)
		}
		extra = fmt.Sprintf("  Redis CPU %5.1f µs/req, %.2f commands/req", m.RedisCPU, m.RedisCommands)
	}
	fmt.Fprintf(os.Stderr, "%-6s %-8s c=%-3d rate=%-6.0f %8.0f req/s  p50 %7.0f µs  p99 %7.0f µs  server CPU %5.1f µs/req%s\n",
		s.name, o.Requests[0].Domain, o.Concurrency, o.Rate, res.RPS, res.Latency.P50, res.Latency.P99, m.ServerCPU, extra)
	return m, nil
}

// report is everything the Markdown shows.
type report struct {
	settings
	machine machine
	closed  []cell
	redis   []cell // sluice is the Redis-backed server
	starved []cell // the Redis-backed server beside busy processes; no no-op run
	noRedis string // why redis is empty
	open    []cell
	ghz     *crossCheck
	genCPU  float64 // the generator's CPU per request at concurrency 50
}

// cell is one workload and load against a Sluice server and the no-op.
type cell struct {
	workload     string
	concurrency  int
	rate         float64
	fraction     float64 // open loop: rate / the no-op's closed-loop throughput at 50
	sluice, noop measured
	paired       []float64 // each repetition's Sluice req/s / the no-op's beside it
}

type crossCheck struct {
	rate        float64
	concurrency int
	bench       measured
	ghz         ghzResult
}

func run(ctx context.Context, s settings) (*report, error) {
	rep := &report{settings: s, machine: describe()}
	sl, err := start(ctx, "sluice", "msg=serving grpc=", s.sluice, "serve", "--config", s.config,
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0", "--log-level", "info")
	if err != nil {
		return nil, err
	}
	defer sl.stop()
	var debugAddr string
	for _, l := range sl.log {
		if _, a, ok := strings.Cut(l, `msg="debug endpoints" addr=`); ok {
			debugAddr = strings.Fields(a)[0]
		}
	}
	noop, err := start(ctx, "no-op", "listening on ", s.sluice, "bench", "--noop-listen", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer noop.stop()

	opts := func(workload string, conc int, rate float64) (loadgen.Options, error) {
		reqs, err := loadgen.Workload(workload, "bench", s.keys)
		return loadgen.Options{Requests: reqs, Concurrency: conc, Connections: s.connections,
			Duration: s.duration, Warmup: s.warmup, Rate: rate}, err
	}
	// both runs o against target and the no-op server -repeat times, the
	// order alternating from run to run, and keeps each server's median
	// run (by throughput, or by p99 in an open loop). With a profile
	// file, sl's CPU profile during its first run goes there.
	both := func(i int, target *server, o loadgen.Options, profileTo string) (sm, nm measured, paired []float64, err error) {
		var sruns, nruns []measured
		for rep := range s.repeat {
			order := []*server{target, noop}
			if (i+rep)%2 == 1 {
				order = []*server{noop, target}
			}
			for _, srv := range order {
				var prof chan error
				if srv == sl && profileTo != "" && rep == 0 {
					prof = make(chan error, 1)
					go func() { prof <- profile(ctx, debugAddr, o.Warmup+o.Duration, profileTo) }()
				}
				m, err := srv.measure(ctx, o)
				if prof != nil {
					if perr := <-prof; err == nil {
						err = perr
					}
				}
				if err != nil {
					return sm, nm, nil, err
				}
				if srv != noop {
					sruns = append(sruns, m)
				} else {
					nruns = append(nruns, m)
				}
			}
			paired = append(paired, ratio(sruns[rep].RPS, nruns[rep].RPS))
		}
		key := func(m measured) float64 { return m.RPS }
		if o.Rate > 0 {
			key = func(m measured) float64 { return m.Latency.P99 }
		}
		return median(sruns, key), median(nruns, key), paired, nil
	}

	i := 0
	noopAt50 := map[string]float64{}
	for _, w := range s.workloads {
		for _, c := range s.concurrency {
			o, err := opts(w, c, 0)
			if err != nil {
				return nil, err
			}
			profileTo := ""
			if w == "multi" && c == 50 {
				profileTo = s.cpuProfile
			}
			sm, nm, paired, err := both(i, sl, o, profileTo)
			if err != nil {
				return nil, err
			}
			i++
			rep.closed = append(rep.closed, cell{workload: w, concurrency: c, sluice: sm, noop: nm, paired: paired})
			if c == 50 {
				noopAt50[w] = nm.RPS
				if w == "distinct" {
					rep.genCPU = nm.CPUPerRequest
				}
			}
		}
	}
	if _, err := exec.LookPath(s.redisServer); err != nil {
		rep.noRedis = fmt.Sprintf("No `%s` was found on this machine, so the Redis store was not measured.", s.redisServer)
		fmt.Fprintf(os.Stderr, "no %s: Redis store skipped\n", s.redisServer)
	} else if err := func() error {
		rd, err := startRedis(ctx, s.redisServer)
		if err != nil {
			return err
		}
		defer rd.stop()
		sr, err := start(ctx, "redis", "msg=serving grpc=", s.sluice, "serve", "--config", s.config,
			"--store", "redis", "--redis-url", "redis://"+rd.addr, "--grpc-addr", "127.0.0.1:0",
			"--http-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0", "--log-level", "info")
		if err != nil {
			return err
		}
		defer sr.stop()
		sr.redis = rd
		for _, w := range []string{"distinct", "multi"} {
			for _, c := range s.redisConc {
				o, err := opts(w, c, 0)
				if err != nil {
					return err
				}
				sm, nm, paired, err := both(i, sr, o, "")
				if err != nil {
					return err
				}
				i++
				rep.redis = append(rep.redis, cell{workload: w, concurrency: c, sluice: sm, noop: nm, paired: paired})
			}
		}
		if s.starveBusy == 0 {
			return nil
		}
		stop, err := busy(s.starveBusy)
		if err != nil {
			return err
		}
		defer stop()
		for _, w := range []string{"distinct", "multi"} {
			for _, c := range s.redisConc {
				o, err := opts(w, c, 0)
				if err != nil {
					return err
				}
				o.Timeout = s.starveTimeout
				m, err := sr.measure(ctx, o)
				if err != nil {
					return err
				}
				rep.starved = append(rep.starved, cell{workload: w, concurrency: c, sluice: m})
			}
		}
		return nil
	}(); err != nil {
		return nil, err
	}
	for _, frac := range s.openFractions {
		for _, w := range []string{"distinct", "multi"} {
			if noopAt50[w] == 0 {
				continue
			}
			rate := float64(int(frac*noopAt50[w]/100)) * 100 // rounded down to 100/s
			o, err := opts(w, s.openConc, rate)
			if err != nil {
				return nil, err
			}
			sm, nm, _, err := both(i, sl, o, "")
			if err != nil {
				return nil, err
			}
			i++
			rep.open = append(rep.open, cell{workload: w, concurrency: s.openConc, rate: rate, fraction: frac, sluice: sm, noop: nm})
		}
	}
	if _, err := os.Stat(s.ghz); err == nil {
		cc, err := crossCheckGhz(ctx, s, sl)
		if err != nil {
			return nil, err
		}
		rep.ghz = cc
	} else {
		fmt.Fprintf(os.Stderr, "no ghz at %s: cross-check skipped\n", s.ghz)
	}
	return rep, nil
}

// busy starts n copies of this program that only burn CPU, as noisy
// neighbours; stop kills them.
func busy(n int) (stop func(), err error) {
	var procs []*exec.Cmd
	stop = func() {
		for _, c := range procs {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}
	for range n {
		c := exec.Command(os.Args[0])
		c.Env = append(os.Environ(), busyEnv+"=1")
		if err := c.Start(); err != nil {
			stop()
			return nil, fmt.Errorf("busy process: %w", err)
		}
		procs = append(procs, c)
	}
	return stop, nil
}

// spin burns one CPU until killed or its parent is gone.
func spin() {
	parent := os.Getppid()
	x := uint64(1)
	for i := 0; ; i++ {
		x = x*6364136223846793005 + 1442695040888963407
		if i%(1<<26) == 0 && os.Getppid() != parent {
			os.Exit(0)
		}
	}
}

// median returns the run whose key is the median (the lower one of an
// even count).
func median(runs []measured, key func(measured) float64) measured {
	slices.SortFunc(runs, func(a, b measured) int { return cmp.Compare(key(a), key(b)) })
	return runs[(len(runs)-1)/2]
}

// profile writes the CPU profile sluice serves at debugAddr, taken over
// d in whole seconds, to file.
func profile(ctx context.Context, debugAddr string, d time.Duration, file string) error {
	if debugAddr == "" {
		return errors.New("sluice logged no debug address: cannot profile")
	}
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", debugAddr, max(int(d.Seconds()), 1))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile: %s", resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote sluice's CPU profile to %s\n", file)
	return f.Close()
}

// ghzRequest is the one request both tools send in the cross-check.
var ghzRequest = &rlspb.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitpb.RateLimitDescriptor{
	{Entries: []*ratelimitpb.RateLimitDescriptor_Entry{{Key: "k", Value: "ghz"}}}}}

type ghzResult struct {
	RPS     float64 `json:"rps"`
	Average float64 `json:"average"` // ns
	Count   uint64  `json:"count"`
	Dist    []struct {
		Percentage float64 `json:"percentage"`
		Latency    float64 `json:"latency"` // ns
	} `json:"latencyDistribution"`
	StatusCodeDistribution map[string]uint64 `json:"statusCodeDistribution"`
}

// quantile returns ghz's latency at percentage p, in µs.
func (g ghzResult) quantile(p float64) float64 {
	for _, d := range g.Dist {
		if d.Percentage == p {
			return d.Latency / 1e3
		}
	}
	return 0
}

// crossCheckGhz runs ghz and then loadgen at the same fixed rate,
// concurrency and request against sluice. ghz finds the method through
// server reflection.
func crossCheckGhz(ctx context.Context, s settings, sl *server) (*crossCheck, error) {
	const conc = 50
	data, err := protojson.Marshal(ghzRequest)
	if err != nil {
		return nil, err
	}
	total := int((s.warmup + s.duration).Seconds() * s.ghzRate)
	out, err := exec.CommandContext(ctx, s.ghz, "--insecure", "--format", "json",
		"--call", "envoy.service.ratelimit.v3.RateLimitService.ShouldRateLimit",
		"-d", string(data), "--rps", strconv.Itoa(int(s.ghzRate)), "-c", strconv.Itoa(conc),
		"--connections", strconv.Itoa(s.connections), "-n", strconv.Itoa(total), sl.addr).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("ghz: %w: %s", err, ee.Stderr)
		}
		return nil, fmt.Errorf("ghz: %w", err)
	}
	cc := &crossCheck{rate: s.ghzRate, concurrency: conc}
	if err := json.Unmarshal(out, &cc.ghz); err != nil {
		return nil, fmt.Errorf("ghz output: %w", err)
	}
	fmt.Fprintf(os.Stderr, "ghz    rate=%.0f  %8.0f req/s  p50 %7.0f µs  p99 %7.0f µs\n", s.ghzRate, cc.ghz.RPS, cc.ghz.quantile(50), cc.ghz.quantile(99))
	cc.bench, err = sl.measure(ctx, loadgen.Options{Requests: []*rlspb.RateLimitRequest{ghzRequest}, Concurrency: conc,
		Connections: s.connections, Duration: s.duration, Warmup: s.warmup, Rate: s.ghzRate})
	return cc, err
}

// machine describes where the benchmark ran.
type machine struct {
	cpu, kernel, memory, load, goVersion, date, commit string
	cores                                              int
}

func describe() machine {
	m := machine{cores: runtime.NumCPU(), goVersion: runtime.Version(), date: time.Now().UTC().Format("2006-01-02 15:04 MST")}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			if kb, err := strconv.ParseFloat(f[1], 64); err == nil {
				m.memory = fmt.Sprintf("%.0f GiB", kb/(1<<20))
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = "Linux " + strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		m.commit = strings.TrimSpace(string(out))
	}
	return m
}
