package tracing

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/store"
)

// Store wraps st so that each Take within a recording span is a child
// span, "store.Take", with the store's kind (kind: "memory", "redis"),
// the batch's size and its total cost. A Take outside a recording span
// (tracing off for the request, or not sampled) goes straight to st.
//
// The wrapper sits between the limiter and the store, not inside a
// store: every store gets the same span, and a store's own hot path
// stays as it is. For a store on the network (Redis), one Take is one
// round trip (a pipeline or a script), so the span is the call.
//
// A store that implements store.Resetter gives a wrapper that does too:
// the limiter's counter resets reach the store, traced or not.
func Store(st store.Store, tracer trace.Tracer, kind string) store.Store {
	t := &tracedStore{st: st, tracer: tracer, kind: kind}
	if rs, ok := st.(store.Resetter); ok {
		return &tracedResetter{tracedStore: t, rs: rs}
	}
	return t
}

// tracedResetter is a tracedStore over a store.Resetter.
type tracedResetter struct {
	*tracedStore
	rs store.Resetter
}

// Reset resets the counters in the store underneath.
func (s *tracedResetter) Reset(ctx context.Context, now int64, hits []store.Hit) error {
	return s.rs.Reset(ctx, now, hits)
}

type tracedStore struct {
	st     store.Store
	tracer trace.Tracer
	kind   string
}

// Attribute keys of the store's span.
const (
	attrStore     = attribute.Key("ratelimit.store")
	attrBatchSize = attribute.Key("ratelimit.store.batch_size")
	attrHits      = attribute.Key("ratelimit.store.hits")
)

func (s *tracedStore) Take(ctx context.Context, now int64, hits []store.Hit, out []store.Decision) error {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return s.st.Take(ctx, now, hits, out)
	}
	var cost uint64
	for i := range hits {
		cost += hits[i].Cost
	}
	ctx, span := s.tracer.Start(ctx, "store.Take", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrStore.String(s.kind), attrBatchSize.Int(len(hits)), attrHits.Int64(int64(min(cost, 1<<63-1)))))
	defer span.End()
	err := s.st.Take(ctx, now, hits, out)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}
