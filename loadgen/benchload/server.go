package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/sluicehq/sluice/loadgen"
	"github.com/sluicehq/sluice/loadgen/harness"
)

// server is a process under test: `sluice serve`, or the no-op server.
type server struct {
	proc  *harness.Sluice
	redis *harness.Redis // the server's store, if Redis; stopped with it
	// counted: proc is `sluice serve`, whose /metrics counts the calls it
	// completed (observe's gRPC metrics) and its heap allocations (Go's
	// collector).
	counted bool
	// localAnswers: proc's /metrics also counts the requests its store
	// answered without Redis (Sluice on Redis).
	localAnswers bool
}

// startServer runs `bin args` (on port 0, the text log) with its log in
// dir and waits until it serves.
func startServer(bin, name, dir string, args ...string) (*server, error) {
	p, err := harness.StartSluice(bin, name, dir, args, nil)
	if err != nil {
		return nil, err
	}
	return &server{proc: p}, nil
}

// startServe runs `bin serve` (a Sluice build) on loopback ports with
// config, and extra.
func startServe(bin, name, dir, config string, extra ...string) (*server, error) {
	args := append([]string{"serve", "--config", config, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--debug-addr", "127.0.0.1:0", "--log-level", "info"}, extra...)
	srv, err := startServer(bin, name, dir, args...)
	if err != nil {
		return nil, err
	}
	srv.counted = true
	return srv, nil
}

// startRedisStore starts a redis-server of its own, its files in
// dir/name-server, and `bin serve --store redis` on it, with extra
// flags.
func startRedisStore(s settings, bin, name, dir string, extra ...string) (*server, error) {
	rdir := filepath.Join(dir, name+"-server")
	if err := os.Mkdir(rdir, 0o755); err != nil {
		return nil, err
	}
	rd, err := harness.StartRedis(s.redisServer, rdir)
	if err != nil {
		return nil, err
	}
	srv, err := startServe(bin, name, dir, s.config, append([]string{"--store", "redis", "--redis-url", "redis://" + rd.Addr}, extra...)...)
	if err != nil {
		rd.Kill()
		return nil, err
	}
	srv.redis, srv.localAnswers = rd, true
	return srv, nil
}

// startReference starts a redis-server of its own, its files in
// dir/reference-redis, and envoyproxy/ratelimit's binary on it with the
// same limits and its documented defaults.
func startReference(s settings, dir string) (*server, error) {
	rdir := filepath.Join(dir, "reference-redis")
	if err := os.Mkdir(rdir, 0o755); err != nil {
		return nil, err
	}
	rd, err := harness.StartRedis(s.redisServer, rdir)
	if err != nil {
		return nil, err
	}
	p, err := harness.StartReference(s.reference, "ref", dir, s.config, rd.Addr)
	if err != nil {
		rd.Kill()
		return nil, err
	}
	return &server{proc: p, redis: rd}, nil
}

func (s *server) name() string { return s.proc.Name }

func (s *server) stop() {
	s.proc.Stop()
	if s.redis != nil {
		s.redis.Kill()
	}
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
	// LocalShare is the share of the calls the server completed in the
	// measured time that its store answered without Redis (its local
	// over-limit cache), if the server counts them.
	LocalShare float64
	// Allocs is the server's heap allocations per call it completed in
	// the measured time, if it counts them (Sluice).
	Allocs float64
}

// counts are what the server and its Redis have counted so far.
type counts struct {
	redis redisStats
	served
}

// served is what a server's /metrics has counted so far: its completed
// calls and heap allocations and, if it counts them, its local answers.
type served struct {
	handled, mallocs, local float64
}

// read reads s's counts: its Redis's INFO, its /metrics.
func (s *server) read(ctx context.Context) (counts, error) {
	var c counts
	var err error
	if s.redis != nil {
		if c.redis, err = redisInfo(s.redis.Addr); err != nil {
			return c, err
		}
	}
	if s.counted {
		c.served, err = s.scrape(ctx)
	}
	return c, err
}

// scrape reads s's /metrics.
func (s *server) scrape(ctx context.Context) (served, error) {
	names := []string{handledMetric, mallocsMetric}
	if s.localAnswers {
		names = append(names, localAnswersMetric)
	}
	vs, err := scrapeCounters(ctx, s.proc.HTTP, names...)
	if err != nil {
		return served{}, err
	}
	c := served{handled: vs[0], mallocs: vs[1]}
	if s.localAnswers {
		c.local = vs[2]
	}
	return c, nil
}

func (s *server) measure(ctx context.Context, o loadgen.Options) (measured, error) {
	o.Target = s.proc.GRPC
	cpu0 := harness.ProcCPU(s.proc.Pid())
	// Redis's counters and the server's are read when the warmup ends (by
	// this process's clock) and after the run, so they cover the measured
	// calls.
	counted := s.redis != nil || s.counted
	var c0 counts
	warm := make(chan error, 1)
	if counted {
		time.AfterFunc(o.Warmup, func() {
			var err error
			c0, err = s.read(ctx)
			warm <- err
		})
	}
	res, err := loadgen.Run(ctx, o)
	if err != nil {
		return measured{}, fmt.Errorf("%s: %w", s.name(), err)
	}
	// Calls in the warmup used CPU too: scale by the whole run's time.
	total := float64(res.Requests) * float64(o.Warmup+o.Duration) / float64(o.Duration)
	m := measured{Result: res}
	if total > 0 {
		m.ServerCPU = float64((harness.ProcCPU(s.proc.Pid()) - cpu0).Microseconds()) / total
	}
	extra := ""
	if counted {
		if err := <-warm; err != nil {
			return measured{}, fmt.Errorf("%s: %w", s.name(), err)
		}
		c1, err := s.read(ctx)
		if err != nil {
			return measured{}, fmt.Errorf("%s: %w", s.name(), err)
		}
		n := float64(res.Requests)
		if s.redis != nil {
			if n > 0 {
				r0, r1 := c0.redis, c1.redis
				m.RedisCPU = float64((r1.cpu - r0.cpu).Microseconds()) / n
				// Less the first INFO, which the second counts.
				m.RedisCommands = float64(r1.commands-r0.commands-1) / n
			}
			extra = fmt.Sprintf("  Redis CPU %5.1f µs/req, %.2f commands/req", m.RedisCPU, m.RedisCommands)
		}
		if s.counted {
			// A scrape allocates in the server: the first one's
			// allocations after its reading and the second's before it
			// are counted, about one scrape's, which a third one right
			// after measures.
			c2, err := s.scrape(ctx)
			if err != nil {
				return measured{}, fmt.Errorf("%s: %w", s.name(), err)
			}
			m.Allocs = allocsPerCall(c0.served, c1.served, c2)
			extra += fmt.Sprintf("  allocs %.1f/req", m.Allocs)
		}
		if s.localAnswers {
			// Both counts are the server's, read at once: the calls in
			// flight at the two ends move the share little.
			m.LocalShare = ratio(c1.local-c0.local, c1.handled-c0.handled)
			extra += fmt.Sprintf("  local answers %.1f %%", 100*m.LocalShare)
		}
	}
	fmt.Fprintf(os.Stderr, "%-12s %-8s c=%-3d rate=%-6.0f %8.0f req/s  p50 %7.0f µs  p99 %7.0f µs  server CPU %5.1f µs/req%s\n",
		s.name(), o.Requests[0].Domain, o.Concurrency, o.Rate, res.RPS, res.Latency.P50, res.Latency.P99, m.ServerCPU, extra)
	return m, nil
}

// allocsPerCall is the heap allocations per completed call between
// scrapes c0 and c1, less one scrape's own allocations (c2 - c1, c2
// scraped right after c1 with no calls in between).
func allocsPerCall(c0, c1, c2 served) float64 {
	return ratio(max(c1.mallocs-c0.mallocs-(c2.mallocs-c1.mallocs), 0), c1.handled-c0.handled)
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
