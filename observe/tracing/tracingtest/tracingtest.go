// Package tracingtest is an OTLP trace receiver for tests: a real gRPC
// server implementing OpenTelemetry's collector TraceService, or an HTTP
// one taking POST /v1/traces, on a loopback port, that keeps every span
// it is sent.
package tracingtest

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// Span is one received span with its resource's attributes.
type Span struct {
	*tracepb.Span
	Resource map[string]string
}

// TraceID and SpanID are the span's ids in hex, as in traceparent.
func (s Span) TraceID() string      { return hex.EncodeToString(s.Span.GetTraceId()) }
func (s Span) SpanID() string       { return hex.EncodeToString(s.Span.GetSpanId()) }
func (s Span) ParentSpanID() string { return hex.EncodeToString(s.Span.GetParentSpanId()) }

// Attr returns the attribute key's value as a string (a string, a
// number, a bool, or the values of a list joined by "|"), and whether the
// span has it.
func (s Span) Attr(key string) (string, bool) {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() == key {
			return valueString(kv.GetValue()), true
		}
	}
	return "", false
}

func valueString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_ArrayValue:
		var b bytes.Buffer
		for i, e := range x.ArrayValue.GetValues() {
			if i > 0 {
				b.WriteByte('|')
			}
			b.WriteString(valueString(e))
		}
		return b.String()
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_BoolValue:
		return strconv.FormatBool(x.BoolValue)
	case *commonpb.AnyValue_DoubleValue:
		return strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
	}
	return v.String()
}

// Receiver keeps the spans sent to it. Safe for concurrent use.
type Receiver struct {
	// Addr is host:port; URL is http://Addr, an OTLP endpoint for
	// OTEL_EXPORTER_OTLP_ENDPOINT (plain text).
	Addr, URL string

	mu      sync.Mutex
	spans   []Span
	exports int
	header  map[string][]string // of the last export, keys in lower case
	changed chan struct{}
}

func newReceiver(lis net.Listener) *Receiver {
	return &Receiver{Addr: lis.Addr().String(), URL: "http://" + lis.Addr().String(), changed: make(chan struct{})}
}

func (r *Receiver) add(req *collectorpb.ExportTraceServiceRequest, header map[string][]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exports++
	r.header = map[string][]string{}
	for k, v := range header {
		r.header[strings.ToLower(k)] = v
	}
	for _, rs := range req.GetResourceSpans() {
		res := map[string]string{}
		for _, kv := range rs.GetResource().GetAttributes() {
			res[kv.GetKey()] = valueString(kv.GetValue())
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				r.spans = append(r.spans, Span{Span: sp, Resource: res})
			}
		}
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Header returns the first value of the header (HTTP) or metadata (gRPC)
// key of the last export.
func (r *Receiver) Header(key string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if v := r.header[strings.ToLower(key)]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Exports is the number of export requests received.
func (r *Receiver) Exports() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exports
}

// Wait returns the first span received for which match holds, failing t
// when none comes within 15 seconds.
func (r *Receiver) Wait(t testing.TB, what string, match func(Span) bool) Span {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		r.mu.Lock()
		for _, s := range r.spans {
			if match(s) {
				r.mu.Unlock()
				return s
			}
		}
		changed, n := r.changed, len(r.spans)
		r.mu.Unlock()
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no span %s within 15s (%d received)", what, n)
		}
	}
}

// StartGRPC starts a receiver of OTLP over gRPC (plain text) on a
// loopback port, stopped when t ends.
func StartGRPC(t testing.TB) *Receiver {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := newReceiver(lis)
	s := grpc.NewServer()
	collectorpb.RegisterTraceServiceServer(s, &traceService{r: r})
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return r
}

type traceService struct {
	collectorpb.UnimplementedTraceServiceServer
	r *Receiver
}

func (s *traceService) Export(ctx context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.r.add(req, md)
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

// StartHTTP starts a receiver of OTLP over HTTP (protobuf, plain text,
// gzip or not) on a loopback port, serving POST /v1/traces, stopped when
// t ends.
func StartHTTP(t testing.TB) *Receiver {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := newReceiver(lis)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, req *http.Request) {
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		in := new(collectorpb.ExportTraceServiceRequest)
		if err == nil {
			err = proto.Unmarshal(b, in)
		}
		if err != nil || req.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "want an ExportTraceServiceRequest as application/x-protobuf", http.StatusBadRequest)
			return
		}
		r.add(in, req.Header)
		out, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	return r
}
