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
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

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

// run is the soak: start Redis and the instances, calibrate the load,
// drive and sample them for the duration, and judge. ok is the verdict;
// err a soak that could not run to the end.
func run(ctx context.Context, s settings, out io.Writer) (bool, error) {
	f, err := setUp(s)
	if err != nil {
		return false, err
	}
	defer f.tearDown()
	perStream, err := f.calibrate(ctx, out)
	if err != nil {
		return false, err
	}
	csvFile, err := os.Create(s.csvPath)
	if err != nil {
		return false, err
	}
	defer csvFile.Close()
	w := csv.NewWriter(csvFile)
	rec := f.soak(ctx, perStream, w)
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := rec.err(); err != nil {
		return false, err
	}
	return summarise(out, s, f.insts, rec.total, rec.can, &rec.down, f.redis.Restarts()), w.Error()
}

// record is what the soak measured beside the instances' own series.
type record struct {
	start time.Time
	down  harness.Outages
	can   *canaries
	total outcomes // the rows' and the chunks' that ended after the last row

	mu        sync.Mutex
	driverErr error // a bench chunk or a limits rewrite that failed
}

func (r *record) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.driverErr = errors.Join(r.driverErr, err)
}

func (r *record) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.driverErr
}
