// Command benchload is the load benchmark behind `make bench-load`.
//
// It starts `sluice serve` with the bench limits (memory store) and a
// no-op RLS server (`sluice bench --noop-listen`, the floor gRPC-go sets
// on the machine), both on loopback, and drives them with the loadgen
// library in this process: every workload at every concurrency against
// each server in turn (the order alternating from cell to cell); then,
// if redis-server is installed, the same against `sluice serve --store
// redis` on a redis-server of its own for the distinct, multi and hot
// workloads (with the share of calls its local over-limit cache
// answered, from its /metrics); then open-loop runs at fractions of the
// no-op server's throughput, then a cross-check of the latencies against
// ghz at a fixed rate. Sluice's allocations per call come from its
// /metrics. With -reference, envoyproxy/ratelimit runs beside Sluice on
// Redis; with -baseline, an older Sluice build runs beside the current
// one in the closed loop and on Redis (before and after). It writes the
// results, with the machine's description, as Markdown.
//
//	go run ./loadgen/benchload -sluice bin/sluice -out docs/BENCHMARKS.md
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/loadgen"
)

type settings struct {
	sluice, config, out, ghz    string
	cpuProfile, redisServer     string
	reference, baseline         string
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
	s := parseFlags()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, s)
	if err != nil {
		fatal(err)
	}
	if err := writeReport(rep, s.out); err != nil {
		fatal(err)
	}
}

// parseFlags reads the command line; a bad value ends the program.
func parseFlags() settings {
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
	flag.StringVar(&s.reference, "reference", "", "envoyproxy/ratelimit's binary (built by hand: docs/BENCHMARKS.md), run on a redis-server of its own beside Sluice's in the Redis store's runs; skipped if empty")
	flag.StringVar(&s.baseline, "baseline", "", "an older sluice binary (built by hand: docs/BENCHMARKS.md), run beside -sluice in the closed loop and the Redis store's runs (on a redis-server of its own) for before and after; skipped if empty")
	flag.StringVar(&redisConc, "redis-concurrency", "50,200", "closed-loop concurrencies of the Redis store's runs")
	flag.StringVar(&workloads, "workloads", "distinct,hot,multi", "workloads, in the closed loop and on Redis")
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
	return s
}

// writeReport writes the Markdown to path, or to stdout for "-".
func writeReport(rep *report, path string) error {
	if path == "-" {
		return rep.write(os.Stdout)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := rep.write(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "wrote", path)
	return nil
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
	// after and before name the builds of -sluice and -baseline (see
	// buildName); before is empty without -baseline.
	after, before string
}

// cell is one workload and load against a Sluice server and the no-op.
type cell struct {
	workload     string
	concurrency  int
	rate         float64
	fraction     float64 // open loop: rate / the no-op's closed-loop throughput at 50
	sluice, noop measured
	paired       []float64 // each repetition's Sluice req/s / the no-op's beside it
	// ref is envoyproxy/ratelimit's run (Redis store runs with
	// -reference), refPaired each repetition's reference req/s / the
	// no-op's, and refSluice each repetition's Sluice req/s / the
	// reference's.
	ref                  *measured
	refPaired, refSluice []float64
	// base is the older Sluice build's run (-baseline), basePaired each
	// repetition's base req/s / the no-op's, and afterBefore each
	// repetition's Sluice req/s / base's.
	base                    *measured
	basePaired, afterBefore []float64
	// refKeys: Sluice (and the older build) ran with --key-format
	// reference (Redis store runs).
	refKeys bool
}

// name is c's workload, and the key layout if not Sluice's own.
func (c cell) name() string {
	if c.refKeys {
		return c.workload + ", reference's keys"
	}
	return c.workload
}

type crossCheck struct {
	rate        float64
	concurrency int
	bench       measured
	ghz         ghzResult
}

// run is the benchmark: describe the machine, start the servers, and run
// each step, every one adding its section to the report.
func run(ctx context.Context, s settings) (*report, error) {
	rep := &report{settings: s, machine: describe(), after: buildName(s.sluice)}
	if s.baseline != "" {
		rep.before = buildName(s.baseline)
	}
	b, err := startBench(s)
	if err != nil {
		return nil, err
	}
	defer b.stop()
	for _, step := range []func(context.Context, *report) error{b.closedLoop, b.redisStore, b.openLoop, b.crossCheck} {
		if err := step(ctx, rep); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// bench is the benchmark under way: its directory, Sluice on the memory
// store, the older build on it (-baseline; nil without) and the no-op
// server, and what the cells so far measured that later ones need.
type bench struct {
	s                  settings
	dir                string
	sluice, base, noop *server
	// cells counts the cells run on two servers: the order of each
	// cell's first repetition alternates with it.
	cells int
	// noopAt50 is the no-op server's closed-loop throughput at
	// concurrency 50, by workload: the open loop's rates are fractions of
	// it.
	noopAt50 map[string]float64
}

// keyWorkloads are the workloads over many keys, which the Redis store
// and the open loop run.
var keyWorkloads = []string{"distinct", "multi"}

// redisWorkloads are the Redis store's: the key workloads, whose calls
// all reach Redis, and hot, which its local over-limit cache answers.
var redisWorkloads = append(slices.Clone(keyWorkloads), "hot")

// chosen is those of ws that -workloads names, in ws's order.
func (b *bench) chosen(ws []string) []string {
	var out []string
	for _, w := range ws {
		if slices.Contains(b.s.workloads, w) {
			out = append(out, w)
		}
	}
	return out
}

// startBench starts Sluice, the older build if any, and the no-op
// server, their logs in a directory of their own. On error, what was
// started is stopped.
func startBench(s settings) (*bench, error) {
	b := &bench{s: s, noopAt50: map[string]float64{}}
	if err := b.start(); err != nil {
		b.stop()
		return nil, err
	}
	return b, nil
}

func (b *bench) start() (err error) {
	if b.dir, err = os.MkdirTemp("", "benchload-"); err != nil {
		return err
	}
	if b.sluice, err = startServe(b.s.sluice, "sluice", b.dir, b.s.config); err != nil {
		return err
	}
	if b.s.baseline != "" {
		if b.base, err = startServe(b.s.baseline, "before", b.dir, b.s.config); err != nil {
			return err
		}
	}
	b.noop, err = startServer(b.s.sluice, "no-op", b.dir, "bench", "--noop-listen", "127.0.0.1:0")
	return err
}

func (b *bench) stop() {
	for _, srv := range []*server{b.noop, b.base, b.sluice} {
		if srv != nil {
			srv.stop()
		}
	}
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}

func (b *bench) options(workload string, conc int, rate float64) (loadgen.Options, error) {
	reqs, err := loadgen.Workload(workload, "bench", b.s.keys)
	return loadgen.Options{Requests: reqs, Concurrency: conc, Connections: b.s.connections,
		Duration: b.s.duration, Warmup: b.s.warmup, Rate: rate}, err
}

// closedLoop runs every workload at every concurrency on Sluice, the
// older build if any, and the no-op server. The multi workload at 50 is
// profiled if asked.
func (b *bench) closedLoop(ctx context.Context, rep *report) error {
	for _, w := range b.s.workloads {
		for _, c := range b.s.concurrency {
			profileTo := ""
			if w == "multi" && c == 50 {
				profileTo = b.s.cpuProfile
			}
			cl, err := b.cell(ctx, lineup{sluice: b.sluice, base: b.base}, w, c, 0, profileTo)
			if err != nil {
				return err
			}
			rep.closed = append(rep.closed, cl)
			if c == 50 {
				b.noopAt50[w] = cl.noop.RPS
				if w == "distinct" {
					rep.genCPU = cl.noop.CPUPerRequest
				}
			}
		}
	}
	return nil
}

// redisStore runs the Redis workloads at each Redis concurrency on Sluice
// with a redis-server of its own and on the no-op server (and, with
// -baseline, on the older build and with -reference on
// envoyproxy/ratelimit, each with a redis-server of its own), then on
// that Sluice alone beside busy processes. Without redis-server it says
// why.
func (b *bench) redisStore(ctx context.Context, rep *report) error {
	if _, err := exec.LookPath(b.s.redisServer); err != nil {
		rep.noRedis = fmt.Sprintf("No `%s` was found on this machine, so the Redis store was not measured.", b.s.redisServer)
		fmt.Fprintf(os.Stderr, "no %s: Redis store skipped\n", b.s.redisServer)
		return nil
	}
	sr, err := startRedisStore(b.s, b.s.sluice, "redis", b.dir)
	if err != nil {
		return err
	}
	defer sr.stop()
	var base *server
	if b.s.baseline != "" {
		if base, err = startRedisStore(b.s, b.s.baseline, "before-redis", b.dir); err != nil {
			return err
		}
		defer base.stop()
		// An older build may not count its local answers; the before
		// and after table does not show them.
		base.localAnswers = false
	}
	var ref *server
	if b.s.reference != "" {
		if ref, err = startReference(b.s, b.dir); err != nil {
			return err
		}
		defer ref.stop()
	}
	for _, w := range b.chosen(redisWorkloads) {
		for _, c := range b.s.redisConc {
			cl, err := b.cell(ctx, lineup{sluice: sr, base: base, ref: ref}, w, c, 0, "")
			if err != nil {
				return err
			}
			rep.redis = append(rep.redis, cl)
		}
	}
	if err := b.redisRefKeys(ctx, ref, rep); err != nil {
		return err
	}
	return b.starved(ctx, sr, rep)
}

// redisRefKeys runs the key workloads at each Redis concurrency as
// redisStore does, with Sluice (and the older build) counting in the
// reference's keys (--key-format reference, what a drop-in /bin/ratelimit
// with REDIS_URL selects), each on a redis-server of its own.
func (b *bench) redisRefKeys(ctx context.Context, ref *server, rep *report) error {
	ws := b.chosen(keyWorkloads)
	if len(ws) == 0 {
		return nil
	}
	flags := []string{"--key-format", "reference"}
	sr, err := startRedisStore(b.s, b.s.sluice, "redis-refkeys", b.dir, flags...)
	if err != nil {
		return err
	}
	defer sr.stop()
	var base *server
	if b.s.baseline != "" {
		if base, err = startRedisStore(b.s, b.s.baseline, "before-redis-refkeys", b.dir, flags...); err != nil {
			return err
		}
		defer base.stop()
		base.localAnswers = false
	}
	for _, w := range ws {
		for _, c := range b.s.redisConc {
			cl, err := b.cell(ctx, lineup{sluice: sr, base: base, ref: ref}, w, c, 0, "")
			if err != nil {
				return err
			}
			cl.refKeys = true
			rep.redis = append(rep.redis, cl)
		}
	}
	return nil
}

// starved runs the Redis workloads on sr alone while -starve-busy
// processes burn CPU, each call with the -starve-timeout deadline.
func (b *bench) starved(ctx context.Context, sr *server, rep *report) error {
	if b.s.starveBusy == 0 {
		return nil
	}
	stop, err := busy(b.s.starveBusy)
	if err != nil {
		return err
	}
	defer stop()
	for _, w := range b.chosen(redisWorkloads) {
		for _, c := range b.s.redisConc {
			o, err := b.options(w, c, 0)
			if err != nil {
				return err
			}
			o.Timeout = b.s.starveTimeout
			m, err := sr.measure(ctx, o)
			if err != nil {
				return err
			}
			rep.starved = append(rep.starved, cell{workload: w, concurrency: c, sluice: m})
		}
	}
	return nil
}

// openLoop runs the key workloads in an open loop on Sluice and the no-op
// server at each fraction of the no-op server's closed-loop throughput
// at concurrency 50 (a workload not run at 50 is left out).
func (b *bench) openLoop(ctx context.Context, rep *report) error {
	for _, frac := range b.s.openFractions {
		for _, w := range keyWorkloads {
			if b.noopAt50[w] == 0 {
				continue
			}
			rate := float64(int(frac*b.noopAt50[w]/100)) * 100 // rounded down to 100/s
			cl, err := b.cell(ctx, lineup{sluice: b.sluice}, w, b.s.openConc, rate, "")
			if err != nil {
				return err
			}
			cl.fraction = frac
			rep.open = append(rep.open, cl)
		}
	}
	return nil
}

// crossCheck compares the latencies with ghz's, if there is a ghz.
func (b *bench) crossCheck(ctx context.Context, rep *report) error {
	if _, err := os.Stat(b.s.ghz); err != nil {
		fmt.Fprintf(os.Stderr, "no ghz at %s: cross-check skipped\n", b.s.ghz)
		return nil
	}
	cc, err := crossCheckGhz(ctx, b.s, b.sluice)
	if err != nil {
		return err
	}
	rep.ghz = cc
	return nil
}

// lineup is the servers a cell runs on besides the no-op server: Sluice,
// and the older build (-baseline) and the reference (-reference) unless
// nil.
type lineup struct{ sluice, base, ref *server }

// cell runs a workload at concurrency conc (and rate, if an open loop)
// on l's servers and the no-op server; profileTo is as runs'.
func (b *bench) cell(ctx context.Context, l lineup, workload string, conc int, rate float64, profileTo string) (cell, error) {
	o, err := b.options(workload, conc, rate)
	if err != nil {
		return cell{}, err
	}
	servers := []*server{l.sluice, b.noop}
	// at is srv's index in servers, -1 if nil.
	at := func(srv *server) int {
		if srv == nil {
			return -1
		}
		servers = append(servers, srv)
		return len(servers) - 1
	}
	bi, ri := at(l.base), at(l.ref)
	med, runs, err := b.runs(ctx, servers, o, profileTo)
	if err != nil {
		return cell{}, err
	}
	cl := cell{workload: workload, concurrency: conc, rate: rate, sluice: med[0], noop: med[1]}
	for i := range runs[0] {
		cl.paired = append(cl.paired, ratio(runs[0][i].RPS, runs[1][i].RPS))
		if bi >= 0 {
			cl.basePaired = append(cl.basePaired, ratio(runs[bi][i].RPS, runs[1][i].RPS))
			cl.afterBefore = append(cl.afterBefore, ratio(runs[0][i].RPS, runs[bi][i].RPS))
		}
		if ri >= 0 {
			cl.refPaired = append(cl.refPaired, ratio(runs[ri][i].RPS, runs[1][i].RPS))
			cl.refSluice = append(cl.refSluice, ratio(runs[0][i].RPS, runs[ri][i].RPS))
		}
	}
	if bi >= 0 {
		cl.base = &med[bi]
	}
	if ri >= 0 {
		cl.ref = &med[ri]
	}
	return cl, nil
}

// runs runs o against each server -repeat times, the order rotating from
// run to run and cell to cell, and returns each server's median run (by
// throughput, or by p99 in an open loop) and all its runs in repetition
// order. With a profile file, Sluice's CPU profile during its first run
// goes there.
func (b *bench) runs(ctx context.Context, servers []*server, o loadgen.Options, profileTo string) (med []measured, runs [][]measured, err error) {
	runs = make([][]measured, len(servers))
	for rep := range b.s.repeat {
		for k := range servers {
			i := (b.cells + rep + k) % len(servers)
			srv := servers[i]
			file := ""
			if srv == b.sluice && rep == 0 {
				file = profileTo
			}
			m, err := measureProfiled(ctx, srv, o, file)
			if err != nil {
				return nil, nil, err
			}
			runs[i] = append(runs[i], m)
		}
	}
	b.cells++
	key := func(m measured) float64 { return m.RPS }
	if o.Rate > 0 {
		key = func(m measured) float64 { return m.Latency.P99 }
	}
	for i := range servers {
		med = append(med, median(slices.Clone(runs[i]), key))
	}
	return med, runs, nil
}

// measureProfiled measures o on srv and, given a file, writes srv's CPU
// profile over the run there.
func measureProfiled(ctx context.Context, srv *server, o loadgen.Options, file string) (measured, error) {
	if file == "" {
		return srv.measure(ctx, o)
	}
	prof := make(chan error, 1)
	go func() { prof <- profile(ctx, srv.proc.Debug, o.Warmup+o.Duration, file) }()
	m, err := srv.measure(ctx, o)
	if perr := <-prof; err == nil {
		err = perr
	}
	return m, err
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
