package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/sluicehq/sluice/loadgen"
	"github.com/sluicehq/sluice/loadgen/harness"
)

// run is the soak: start the fleet, drive and watch it, judge, write the
// files. ok is the verdict; err a soak that could not run to the end.
func run(ctx context.Context, s settings, out io.Writer) (ok bool, err error) {
	f, err := setUp(s)
	if err != nil {
		return false, err
	}
	defer f.tearDown()
	fmt.Fprintf(out, "churn soak: %s; %d replicas on one Redis over xDS; a push of %d renamed rules every %v; Redis killed every %v; %v\n",
		f.version, s.replicas, s.renamed, s.pushEvery, s.restartEvery, s.duration)
	rec := f.soak(ctx)
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := errors.Join(rec.driverErr, f.exited()); err != nil {
		f.s.keepLogs = true
		return false, fmt.Errorf("%w\n(logs kept in %s)", err, f.dir)
	}
	if s.keepLogs {
		fmt.Fprintf(out, "logs in %s\n", f.dir)
	}
	rep := analyse(s, rec)
	if err := rep.writeFiles(); err != nil {
		return false, err
	}
	rep.summary(out)
	return rep.pass(), nil
}

// record is everything the soak measured.
type record struct {
	version    string
	start, end time.Time
	samples    []sample
	rls        map[int64]*rlsSecond
	rlsErrs    []string
	churn      rlqsChurnResult
	fleet      []loadgen.Second
	lag        map[int64]time.Duration // the soak's own scheduling delay, by Unix second
	fleetErr   error                   // the RLQS fleet's proxies' failure
	xds        xdsState
	down       *harness.Outages
	restarts   int
	// driverErr is a part of the soak that stopped: a push or a Redis
	// start that failed.
	driverErr error
}

// soak drives the fleet for the soak's duration while sampling it.
func (f *fleet) soak(ctx context.Context) *record {
	rec := &record{version: f.version, start: time.Now(), down: &harness.Outages{}}
	runCtx, cancel := context.WithDeadline(ctx, rec.start.Add(f.s.duration))
	defer cancel()
	rls := newRLSTraffic(f.rls(), rec.down, f.s, f.xds.generation)
	churn := &rlqsChurn{clients: f.rlqs(), down: rec.down, gen: f.xds.generation, every: f.s.joinEvery,
		life: f.s.streamLife, fresh: f.s.freshBuckets, renamed: f.s.renamed}
	var fl rlqsFleet
	lm := &lagMonitor{lag: map[int64]time.Duration{}}
	var errMu sync.Mutex
	fail := func(err error) {
		errMu.Lock()
		defer errMu.Unlock()
		rec.driverErr = errors.Join(rec.driverErr, err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := f.xds.pushEvery(runCtx, f.s.pushEvery, f.s.renamed); err != nil {
			fail(fmt.Errorf("xds push: %w", err))
		}
	})
	wg.Go(func() {
		if err := f.redis.RestartEvery(runCtx, f.restartPlan(), rec.down); err != nil {
			fail(err)
		}
	})
	wg.Go(func() { lm.run(runCtx) })
	wg.Go(func() { rls.run(runCtx) })
	wg.Go(func() { churn.run(runCtx) })
	wg.Go(func() { rec.fleetErr = fl.run(runCtx, f.targets(), f.s.rlqsProxies, f.s.duration-2*time.Second) })
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	sp := &sampler{procs: f.procs, client: &http.Client{Transport: tr, Timeout: readTimeout}, heap: f.s.heap, down: rec.down}
	rec.samples = sp.every(runCtx, f.s.sample)
	wg.Wait()
	rec.end = time.Now()
	rec.rls, rec.rlsErrs = rls.result()
	rec.churn, rec.fleet, rec.lag = churn.result(), fl.result(), lm.result()
	rec.xds, rec.restarts = f.xds.state(), f.redis.Restarts()
	return rec
}

// readTimeout bounds each read of a replica's endpoints (Prometheus's
// default scrape timeout is 10 s).
const readTimeout = 20 * time.Second

func (f *fleet) restartPlan() harness.RestartPlan {
	return harness.RestartPlan{Every: f.s.restartEvery, First: f.s.restartEvery / 2, Down: f.s.redisDown, Grace: f.s.grace}
}

func (f *fleet) targets() []string {
	t := make([]string, len(f.procs))
	for i, p := range f.procs {
		t[i] = p.GRPC
	}
	return t
}
