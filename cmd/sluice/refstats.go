package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/observe"
)

// refStatsFlags send envoyproxy/ratelimit's stats (observe.RefStats) to a
// statsd server and serve them mapped to Prometheus series, as the
// reference's USE_STATSD and USE_PROMETHEUS do, besides Sluice's own
// metrics on /metrics. Part of the observability extension.
type refStatsFlags struct {
	statsdAddr    string
	statsdProto   string
	dogStatsD     bool
	mogrifiers    mogrifierFlags
	interval      time.Duration
	tags          string
	promAddr      string
	promPath      string
	promMapping   string
	promMillisecs bool
}

func (f *refStatsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.statsdAddr, "statsd-addr", "", "send envoyproxy/ratelimit's stats (docs/METRICS.md) to the statsd server at this `host:port` (default off)")
	fs.StringVar(&f.statsdProto, "statsd-protocol", "udp", "how --statsd-addr is reached: udp | tcp (reconnects; lines wait in a 4 MiB buffer, past it they are dropped and counted)")
	fs.BoolVar(&f.dogStatsD, "statsd-dogstatsd", false, "send DogStatsD lines to --statsd-addr: --stats-tags and the mogrifiers' tags as tags (the reference's USE_DOG_STATSD)")
	fs.Var(&f.mogrifiers, "statsd-mogrifier", "with --statsd-dogstatsd, rename the stats a pattern matches into a name and tags, written `NAME|TAGS|PATTERN` "+
		"(e.g. 'ratelimit.service.rate_limit.$3|domain:$1,descriptor:$2|^ratelimit\\.service\\.rate_limit\\.(.*)\\.(.*)\\.(.*)$'; $N is the Nth group); repeatable, the first that matches applies")
	fs.DurationVar(&f.interval, "stats-flush-interval", 10*time.Second, "how often the stats go to --statsd-addr and --ref-prometheus-addr")
	fs.StringVar(&f.tags, "stats-tags", "", "`key:value,...` tags appended to every stat's name as the reference's EXTRA_TAGS are")
	fs.StringVar(&f.promAddr, "ref-prometheus-addr", "", "serve envoyproxy/ratelimit's stats as the Prometheus series of its USE_PROMETHEUS on this `address` (default off)")
	fs.StringVar(&f.promPath, "ref-prometheus-path", "/metrics", "HTTP path of --ref-prometheus-addr")
	fs.StringVar(&f.promMapping, "ref-prometheus-mapping", "", "statsd_exporter mapping `file` for --ref-prometheus-addr (default: the reference's series; a missing file means the default)")
	fs.BoolVar(&f.promMillisecs, "ref-prometheus-response-time-ms", false, "with the default mapping, keep ratelimit_service_response_time_seconds in milliseconds, as the reference's PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS")
}

// setup starts the stats flusher when --statsd-addr or
// --ref-prometheus-addr asks for it.
func (f *refStatsFlags) setup(x *serveContext, rules *observe.Rules, gm *observe.GRPCMetrics) error {
	if f.statsdAddr == "" && (f.dogStatsD || len(f.mogrifiers) > 0) {
		return errors.New("--statsd-dogstatsd and --statsd-mogrifier need --statsd-addr")
	}
	if f.statsdAddr == "" && f.promAddr == "" {
		return nil
	}
	if f.interval <= 0 {
		return errors.New("--stats-flush-interval must be positive")
	}
	tags, err := observe.ParseTags(f.tags)
	if err != nil {
		return fmt.Errorf("--stats-tags: %w", err)
	}
	stats := observe.NewRefStats(rules, gm, x.Config, observe.RefStatsOptions{Tags: tags})
	var sinks []observe.Sink
	var statsd *observe.StatsdSink
	if f.statsdAddr != "" {
		if statsd, err = f.statsdSink(x); err != nil {
			return err
		}
		sinks = append(sinks, statsd)
	}
	var mapped *observe.MappedSink
	if f.promAddr != "" {
		if mapped, err = f.servePrometheus(x); err != nil {
			if statsd != nil {
				statsd.Close()
			}
			return err
		}
		sinks = append(sinks, mapped)
	}
	x.Logger.Info("envoyproxy/ratelimit stats", "statsd", f.statsdAddr, "protocol", f.statsdProto, "dogstatsd", f.dogStatsD,
		"prometheus", f.promAddr, "interval", f.interval)
	x.Run = append(x.Run, func(ctx context.Context) error {
		if mapped != nil {
			mapped.Start()
			defer mapped.Close()
		}
		if statsd != nil {
			statsd.Start()
			defer statsd.Close()
		}
		return stats.Run(ctx, f.interval, func(err error) { x.Logger.Warn("stats not sent", "err", err) }, sinks...)
	})
	return nil
}

// statsdSink makes the sink of --statsd-addr and counts its dropped
// lines on Sluice's registry.
func (f *refStatsFlags) statsdSink(x *serveContext) (*observe.StatsdSink, error) {
	if len(f.mogrifiers) > 0 && !f.dogStatsD {
		return nil, errors.New("--statsd-mogrifier needs --statsd-dogstatsd")
	}
	if f.statsdProto != "udp" && f.statsdProto != "tcp" {
		return nil, fmt.Errorf("--statsd-protocol %q: want udp or tcp", f.statsdProto)
	}
	sink, err := observe.NewStatsdSink(f.statsdAddr, observe.StatsdOptions{Protocol: f.statsdProto, DogStatsD: f.dogStatsD, Mogrifiers: f.mogrifiers})
	if err != nil {
		return nil, fmt.Errorf("--statsd-addr: %w", err)
	}
	dropped := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_statsd_dropped_lines_total",
		Help: "Lines of the reference's stats dropped on the way to --statsd-addr over TCP: the buffer was full or a connection broke midway."},
		func() float64 { return float64(sink.Dropped()) })
	if err := x.Registry.Register(dropped); err != nil {
		sink.Close()
		return nil, err
	}
	return sink, nil
}

// mogrifierFlags are the --statsd-mogrifier flags, each parsed when set.
type mogrifierFlags []observe.Mogrifier

func (m *mogrifierFlags) String() string {
	var s []string
	for _, x := range *m {
		s = append(s, x.String())
	}
	return strings.Join(s, " ")
}

func (m *mogrifierFlags) Set(v string) error {
	x, err := observe.ParseMogrifier(v)
	if err != nil {
		return err
	}
	*m = append(*m, x)
	return nil
}

// servePrometheus makes the mapped sink and serves its registry on
// --ref-prometheus-addr.
func (f *refStatsFlags) servePrometheus(x *serveContext) (*observe.MappedSink, error) {
	if !strings.HasPrefix(f.promPath, "/") {
		return nil, fmt.Errorf("--ref-prometheus-path %q: want a path starting with /", f.promPath)
	}
	mapping := ""
	if f.promMapping != "" {
		b, err := os.ReadFile(f.promMapping)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// Envoy Gateway mounts its mapping from an optional ConfigMap.
			x.Logger.Warn("no statsd mapping file: using the default mapping", "file", f.promMapping)
		case err != nil:
			return nil, fmt.Errorf("--ref-prometheus-mapping: %w", err)
		default:
			mapping = string(b)
		}
	}
	if mapping == "" && f.promMillisecs {
		mapping = strings.Replace(observe.DefaultStatsdMapping, "    scale: 0.001\n", "", 1)
	}
	reg := prometheus.NewRegistry()
	if err := observe.RegisterProcess(reg, observe.Build{Version: buildVersion(), Commit: buildCommit()}); err != nil {
		return nil, err
	}
	sink, err := observe.NewMappedSink(reg, mapping, x.Logger)
	if err != nil {
		return nil, fmt.Errorf("--ref-prometheus-mapping %s: %w", f.promMapping, err)
	}
	lis, err := net.Listen("tcp", f.promAddr)
	if err != nil {
		return nil, fmt.Errorf("--ref-prometheus-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+f.promPath, observe.Handler(reg))
	srv := x.HTTPBounds.server(mux, x.Logger, true)
	x.Logger.Info("envoyproxy/ratelimit metrics", "addr", lis.Addr().String(), "path", f.promPath)
	x.Run = append(x.Run, func(ctx context.Context) error {
		stop := context.AfterFunc(ctx, func() { srv.Close() })
		defer stop()
		if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	return sink, nil
}
