package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluicehq/sluice/loadgen"
)

func init() {
	register(command{name: "bench", summary: "load-test an Envoy rate-limit service, or run a no-op one", run: runBench})
}

const benchUsage = `usage: sluice bench [flags]
       sluice bench --noop-listen ADDR

Sends ShouldRateLimit load to --addr and reports requests/s, counts by gRPC
code and by overall_code, and latency quantiles (text, or JSON with --json).
Requests are marshalled once before the run; workers keep --concurrency
calls outstanding (closed loop), or with --rate send on a fixed schedule and
measure latency from each request's scheduled time (open loop).

Workloads (domain --domain, values spread over --keys):
  distinct  one descriptor {k: V}
  hot       one descriptor {hot: hot}, the same every time
  multi     four descriptors {k1: V} {k2: V} {k3: V} {k4: V}
  file      the request(s) in --request-file (JSON or YAML, the proto's JSON
            form: {"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]})

With --rlqs, simulates a fleet of Envoys on Rate Limit Quota Service streams
(--rlqs-* flags) and prints per second the fleet's admitted rate against the
limit, each proxy's share against its max-min fair share and the servers'
CPU per bucket report (docs/RLQS.md).

With --noop-listen, runs an RLS server that answers OK to everything until
interrupted: the floor gRPC-go itself sets on this machine.

flags:
`

type benchFlags struct {
	addr, domain, workload, requestFile string
	keys, concurrency, connections      int
	duration, warmup                    time.Duration
	rate                                float64
	timeout                             time.Duration
	jsonOut                             bool
	noopListen                          string
	tls                                 tlsClientFlags
	rlqs                                rlqsBenchFlags
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var f benchFlags
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, benchUsage); fs.PrintDefaults() }
	fs.StringVar(&f.addr, "addr", "127.0.0.1:8081", "target RLS server `address` (gRPC target syntax)")
	fs.StringVar(&f.domain, "domain", "bench", "rate-limit domain of the built-in workloads")
	fs.StringVar(&f.workload, "workload", "distinct", "`name`: distinct, hot, multi or file")
	fs.StringVar(&f.requestFile, "request-file", "", "JSON or YAML `file` of one request or a list, for --workload file")
	fs.IntVar(&f.keys, "keys", 1000, "distinct descriptor values the workload spreads over")
	fs.IntVar(&f.concurrency, "concurrency", 50, "requests outstanding at once (workers)")
	fs.IntVar(&f.connections, "connections", 1, "HTTP/2 connections the workers share")
	fs.DurationVar(&f.duration, "duration", 10*time.Second, "how long to measure")
	fs.DurationVar(&f.warmup, "warmup", time.Second, "how long to send before measuring")
	fs.DurationVar(&f.timeout, "timeout", 0, "each call's deadline, sent as grpc-timeout as Envoy sends its filter timeout (0: none)")
	fs.Float64Var(&f.rate, "rate", 0, "requests/s on a fixed schedule (open loop); 0 sends as fast as replies come (closed loop)")
	fs.BoolVar(&f.jsonOut, "json", false, "print the result as JSON")
	fs.StringVar(&f.noopListen, "noop-listen", "", "run a no-op RLS server on `address` instead of sending load")
	f.tls.register(fs)
	f.rlqs.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sluice bench: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if f.noopListen != "" {
		return runNoop(ctx, f.noopListen, stderr)
	}
	if f.rlqs.enabled {
		domainSet := false
		fs.Visit(func(fl *flag.Flag) { domainSet = domainSet || fl.Name == "domain" })
		return runBenchRLQS(ctx, &f, domainSet, stdout, stderr)
	}
	opts, err := f.options()
	if err != nil {
		fmt.Fprintf(stderr, "sluice bench: %v\n", err)
		return 2
	}
	res, err := loadgen.Run(ctx, opts)
	if err != nil {
		fmt.Fprintf(stderr, "sluice bench: %v\n", err)
		return 1
	}
	if f.jsonOut {
		out := struct {
			Workload string `json:"workload"`
			Keys     int    `json:"keys,omitempty"`
			*loadgen.Result
		}{Workload: f.workload, Result: res}
		if f.workload == "distinct" || f.workload == "multi" {
			out.Keys = f.keys
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			fmt.Fprintf(stderr, "sluice bench: %v\n", err)
			return 1
		}
		return 0
	}
	printResult(stdout, f, res)
	return 0
}

// options turns the flags into a run.
func (f *benchFlags) options() (loadgen.Options, error) {
	o := loadgen.Options{Target: f.addr, Concurrency: f.concurrency, Connections: f.connections,
		Duration: f.duration, Warmup: f.warmup, Rate: f.rate, Timeout: f.timeout}
	switch {
	case f.concurrency < 1 || f.connections < 1:
		return o, errors.New("--concurrency and --connections must be at least 1")
	case f.duration <= 0 || f.warmup < 0:
		return o, errors.New("--duration must be positive and --warmup not negative")
	case f.rate < 0:
		return o, errors.New("--rate must not be negative")
	case f.timeout < 0:
		return o, errors.New("--timeout must not be negative")
	case (f.workload == "file") != (f.requestFile != ""):
		return o, errors.New("--request-file goes with --workload file, and only with it")
	}
	var err error
	if f.workload == "file" {
		o.Requests, err = loadgen.ReadRequests(f.requestFile)
	} else {
		o.Requests, err = loadgen.Workload(f.workload, f.domain, f.keys)
	}
	if err != nil {
		return o, err
	}
	cfg, err := f.tls.config()
	if err != nil {
		return o, err
	}
	if cfg != nil {
		o.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(cfg))}
	}
	return o, nil
}

func runNoop(ctx context.Context, addr string, stderr io.Writer) int {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(stderr, "sluice bench: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "no-op RLS server listening on %s\n", lis.Addr())
	if err := loadgen.ServeNoop(ctx, lis); err != nil {
		fmt.Fprintf(stderr, "sluice bench: %v\n", err)
		return 1
	}
	return 0
}

func printResult(w io.Writer, f benchFlags, r *loadgen.Result) {
	mode := fmt.Sprintf("closed loop, concurrency %d", r.Concurrency)
	if r.Rate > 0 {
		mode = fmt.Sprintf("open loop at %g/s, concurrency %d", r.Rate, r.Concurrency)
	}
	fmt.Fprintf(w, "target      %s, workload %s, %s, %d connection(s), %gs\n", r.Target, f.workload, mode, r.Connections, r.Seconds)
	fmt.Fprintf(w, "requests    %d, %.0f/s, generator CPU %.1f µs/request\n", r.Requests, r.RPS, r.CPUPerRequest)
	fmt.Fprintf(w, "grpc codes  %s\n", counts(r.Codes))
	fmt.Fprintf(w, "overall     %s\n", counts(r.Overall))
	if r.StatusMismatches > 0 {
		fmt.Fprintf(w, "mismatches  %d replies with a status count other than the descriptors'\n", r.StatusMismatches)
	}
	l := r.Latency
	fmt.Fprintf(w, "latency µs  mean %.0f  p50 %.0f  p90 %.0f  p99 %.0f  p99.9 %.0f  max %.0f\n", l.Mean, l.P50, l.P90, l.P99, l.P999, l.Max)
	if s := r.Service; s != nil {
		fmt.Fprintf(w, "  from send mean %.0f  p50 %.0f  p90 %.0f  p99 %.0f  p99.9 %.0f  max %.0f (latency above runs from the scheduled time)\n",
			s.Mean, s.P50, s.P90, s.P99, s.P999, s.Max)
	}
}

// counts prints a count map in a stable order: "OK 10, OVER_LIMIT 2".
func counts(m map[string]uint64) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
