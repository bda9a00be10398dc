package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"strings"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/sluicehq/sluice/observe/tracing"
	"github.com/sluicehq/sluice/server"
)

// Traces over OTLP (--tracing): a span per decision and RLQS report,
// children of the caller's trace, and one per store call.
func init() {
	registerExtension("tracing", func(fs *flag.FlagSet) extensionSetup {
		f := &tracingFlags{}
		f.register(fs)
		return f.setup
	})
}

type tracingFlags struct {
	on           bool
	protocol     string
	service      string
	namespace    string
	instance     string
	samplingRate float64
	parentCap    float64
}

func (f *tracingFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.on, "tracing", false, "export traces over OTLP to the endpoint of OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (docs/TRACING.md)")
	fs.StringVar(&f.protocol, "tracing-protocol", "http", "OTLP transport of --tracing: http|grpc")
	fs.StringVar(&f.service, "tracing-service-name", "", "service.name of the traces (default: OTEL_SERVICE_NAME, else sluice)")
	fs.StringVar(&f.namespace, "tracing-service-namespace", "", "service.namespace of the traces")
	fs.StringVar(&f.instance, "tracing-service-instance-id", "", "service.instance.id of the traces (default: a random UUID)")
	fs.Float64Var(&f.samplingRate, "tracing-sampling-rate", 1, "fraction of the traces that start here to sample, 0 to 1; a caller's sampled or unsampled trace context is followed")
	fs.Float64Var(&f.parentCap, "tracing-parent-sampled-per-second", 0, "most traces a second that a caller's sampled flag (traceparent, B3) makes Sluice record; past it they are not; 0: no cap, every sampled parent is followed as in the reference")
}

// traceShutdownTimeout bounds the flush of the spans not yet sent when
// serve stops.
const traceShutdownTimeout = 5 * time.Second

func (f *tracingFlags) setup(ctx context.Context, x *serveContext) error {
	if !f.on {
		return nil
	}
	if p := strings.ToLower(f.protocol); p != "http" && p != "grpc" {
		return fmt.Errorf("--tracing-protocol %q: want http or grpc", f.protocol)
	}
	if math.IsNaN(f.samplingRate) || f.samplingRate < 0 || f.samplingRate > 1 {
		return fmt.Errorf("--tracing-sampling-rate %v: want a number from 0 to 1", f.samplingRate)
	}
	if math.IsNaN(f.parentCap) || math.IsInf(f.parentCap, 0) || f.parentCap < 0 {
		return fmt.Errorf("--tracing-parent-sampled-per-second %v: want 0 (no cap) or more", f.parentCap)
	}
	p, err := tracing.New(ctx, tracing.Options{Protocol: f.protocol, ServiceName: f.service, ServiceNamespace: f.namespace,
		ServiceInstanceID: f.instance, SamplingRate: f.samplingRate, ParentSampledPerSecond: f.parentCap})
	if err != nil {
		return err
	}
	x.Tracing = server.Tracing{Tracer: p.Tracer, Propagator: tracing.Propagator()}
	// OpenTelemetry reports failed exports to a process-wide handler; it
	// would print them in a format of its own.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { x.Logger.Warn("tracing", "err", err) }))
	var service, instance string
	for _, kv := range p.Resource.Attributes() {
		switch kv.Key {
		case "service.name":
			service = kv.Value.String()
		case "service.instance.id":
			instance = kv.Value.String()
		}
	}
	x.Logger.Info("tracing", "protocol", strings.ToLower(f.protocol), "service", service, "instance", instance, "sampling_rate", f.samplingRate, "parent_sampled_per_second", f.parentCap)
	// Shut down (send the spans still queued) once serve has drained:
	// requests that end during the drain have spans too.
	x.Stop = append(x.Stop, func() error {
		sctx, cancel := context.WithTimeout(context.Background(), traceShutdownTimeout)
		defer cancel()
		if err := p.Shutdown(sctx); err != nil {
			x.Logger.Warn("spans not sent", "err", err)
		}
		return nil
	})
	return nil
}
