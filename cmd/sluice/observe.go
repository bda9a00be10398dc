package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/redact"
	"github.com/sluicehq/sluice/observe"
)

// Metrics on the HTTP port's /metrics, per-rule counters, and the debug
// endpoints on --debug-addr.
func init() {
	registerExtension("observability", func(fs *flag.FlagSet) extensionSetup {
		f := &obsFlags{}
		f.register(fs)
		return f.setup
	})
}

type obsFlags struct {
	debugAddr        string
	nearLimitRatio   float64
	maxValuesPerRule int
	ref              refStatsFlags
}

func (f *obsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.debugAddr, "debug-addr", "", "serve /debug/pprof/, /rlconfig, /debug/keys and /debug/build on this `address` (default off; keep it private)")
	fs.Float64Var(&f.nearLimitRatio, "near-limit-ratio", observe.DefaultNearLimitRatio, "count an allowed hit as near the limit when usage reaches this fraction of it")
	fs.IntVar(&f.maxValuesPerRule, "metrics-max-values-per-rule", observe.DefaultMaxValuesPerRule, "distinct descriptor values a detailed_metric rule labels; the rest count as _other")
	f.ref.register(fs)
}

func (f *obsFlags) setup(_ context.Context, x *serveContext) error {
	if f.nearLimitRatio <= 0 || f.nearLimitRatio > 1 || f.maxValuesPerRule < 1 {
		return errors.New("--near-limit-ratio must be in (0, 1] and --metrics-max-values-per-rule at least 1")
	}
	reg, build := x.Registry, observe.Build{Version: buildVersion(), Commit: buildCommit()}
	if err := observe.RegisterProcess(reg, build); err != nil {
		return err
	}
	if err := observe.RegisterConfig(reg, x.Config); err != nil {
		return err
	}
	if x.Config.HasOverlay() {
		if err := observe.RegisterOverlay(reg, x.Config); err != nil {
			return err
		}
	}
	if ms, ok := x.Store.(observe.MemoryStatser); ok {
		if err := observe.RegisterMemory(reg, ms); err != nil {
			return err
		}
	}
	rules, err := observe.NewRules(reg, observe.Options{NearLimitRatio: f.nearLimitRatio, MaxValuesPerRule: f.maxValuesPerRule,
		Tables: x.Config})
	if err != nil {
		return err
	}
	rules.SetTable(x.Config.Current())
	x.Config.OnReload(func(t *config.Table, _ error) { rules.SetTable(t) })
	x.Observers = append(x.Observers, rules)
	gm, err := observe.NewGRPCMetrics(reg)
	if err != nil {
		return err
	}
	x.GRPCOptions = append(x.GRPCOptions,
		grpc.ChainUnaryInterceptor(gm.UnaryServerInterceptor()), grpc.ChainStreamInterceptor(gm.StreamServerInterceptor()))
	if err := f.ref.setup(x, rules, gm); err != nil {
		return err
	}
	x.HTTP.Handle("GET /metrics", observe.Handler(reg))
	if x.HTTPRoot, err = observe.InstrumentHTTP(reg, x.HTTP); err != nil {
		return err
	}

	if f.debugAddr == "" {
		return nil
	}
	lis, err := net.Listen("tcp", f.debugAddr)
	if err != nil {
		return fmt.Errorf("--debug-addr: %w", err)
	}
	dbg := &observe.Debug{Tables: x.Config, Build: build, Clock: x.Clock, Cmdline: redact.Args(os.Args, flagSecrecy)}
	if kr, ok := x.Store.(observe.KeyRanger); ok {
		dbg.Keys = kr
	}
	srv := x.HTTPBounds.server(dbg.Handler(), x.Logger, false)
	x.Logger.Info("debug endpoints", "addr", lis.Addr().String())
	x.Run = append(x.Run, func(ctx context.Context) error {
		stop := context.AfterFunc(ctx, func() { srv.Close() })
		defer stop()
		if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	return nil
}

// perRule is the per-rule counters among x's observers (the
// observability extension's, set up before the counter endpoints and
// the status page: files initialise in name order), nil if none.
func perRule(x *serveContext) *observe.Rules {
	for _, o := range x.Observers {
		if r, ok := o.(*observe.Rules); ok {
			return r
		}
	}
	return nil
}
