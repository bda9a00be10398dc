package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/gen/sluice/v1"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/store"
)

// DefaultMaxBodyBytes bounds an HTTP request body unless
// Options.MaxBodyBytes says otherwise.
const DefaultMaxBodyBytes = 1 << 20

// HTTP serves the HTTP endpoints: GET /healthcheck, POST /json (the
// reference's JSON form of ShouldRateLimit), POST /v1/check (our API) and
// GET /v1/check (our API's peek, which consumes nothing). Mount it on a
// mux beside /metrics.
//
// Only a POST consumes, and only with a body of Content-Type
// application/json: a web page cannot make a browser send one to another
// origin without a CORS preflight, which HTTP never grants (it sends no
// Access-Control-* header), so no page a user opens can spend a limit.
// Forms (application/x-www-form-urlencoded, multipart/form-data),
// text/plain and GETs (an <img>, a link) can be sent cross-site: they get
// 415, or a peek.
type HTTP struct {
	rls     *RLS
	api     *API
	health  *Health
	headers Headers
	ietf    bool
	maxBody int64
	mux     *http.ServeMux
}

var (
	unmarshalJSON = protojson.UnmarshalOptions{DiscardUnknown: true}
	// The reference answers /json with Envoy's camelCase field names.
	marshalRLS = protojson.MarshalOptions{}
	marshalAPI = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}
)

// NewHTTP returns the HTTP endpoints over lim. Health decides
// /healthcheck; opts names the RateLimit-* headers of /v1/check.
func NewHTTP(lim *limiter.Limiter, health *Health, opts Options) *HTTP {
	h := &HTTP{rls: NewRLS(lim, opts), api: NewAPI(lim, opts), health: health,
		headers: opts.HeaderNames.withDefaults(), ietf: opts.IETFHeaders, maxBody: opts.MaxBodyBytes, mux: http.NewServeMux()}
	if h.maxBody <= 0 {
		h.maxBody = DefaultMaxBodyBytes
	}
	h.mux.HandleFunc("GET /healthcheck", h.healthcheck)
	h.mux.HandleFunc("POST /json", h.json)
	h.mux.HandleFunc("GET /v1/check", h.checkQuery)
	h.mux.HandleFunc("POST /v1/check", h.checkJSON)
	return h
}

// ServeHTTP implements http.Handler.
func (h *HTTP) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// Patterns lists the paths HTTP serves, for mounting on a mux.
func (h *HTTP) Patterns() []string { return []string{"/healthcheck", "/json", "/v1/check"} }

func (h *HTTP) healthcheck(w http.ResponseWriter, _ *http.Request) {
	if !h.health.Serving() {
		http.Error(w, "NOT_SERVING", http.StatusServiceUnavailable)
		return
	}
	io.WriteString(w, "OK\n")
}

// json is the reference's /json endpoint: a RateLimitRequest in, a
// RateLimitResponse out, 200 or 429.
func (h *HTTP) json(w http.ResponseWriter, r *http.Request) {
	var in rlspb.RateLimitRequest
	if !readJSON(w, r, h.maxBody, h.rls.bounds, &in) {
		return
	}
	c := h.rls.calls.Get().(*call)
	defer h.rls.calls.Put(c)
	fillRequest(&c.req, &in)
	ctx, cancel, ok := requestContext(w, r)
	if !ok {
		return
	}
	defer cancel()
	if err := h.rls.opts.checkRefunds(ctx, r.Header, &c.req); err != nil {
		writeError(w, err)
		return
	}
	if err := h.rls.opts.Tracing.check(ctx, "POST /json", r.Header, h.rls.lim, &c.req, &c.resp); err != nil {
		writeError(w, err)
		return
	}
	code := http.StatusOK
	if c.resp.Overall == limiter.OverLimit {
		code = http.StatusTooManyRequests
	}
	writeProto(w, code, marshalRLS, h.rls.response(&c.req, &c.resp))
}

// peekOnly answers a GET /v1/check that asks for a cost.
const peekOnly = "GET /v1/check never consumes: leave cost out (or cost=0) to peek, or POST /v1/check with Content-Type: application/json to consume"

// checkQuery is GET /v1/check?domain=D&key=K&value=V: a peek. A GET is
// safe (RFC 9110): browsers send it cross-site (an <img>, a link),
// crawlers and prefetchers follow it, clients retry it. So it never
// consumes; a cost other than 0 is refused, so that a caller written when
// a GET consumed learns it instead of taking peeks for charges.
func (h *HTTP) checkQuery(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	in := &sluicev1.CheckRequest{Domain: q.Get("domain"), Key: q.Get("key"), Value: q.Get("value")}
	if c, ok := q["cost"]; ok && (len(c) != 1 || c[0] != "0") {
		writeError(w, &limiter.InvalidError{Reason: peekOnly})
		return
	}
	in.Cost = new(uint64)
	if in.Key == "" {
		writeError(w, &limiter.InvalidError{Reason: "key is required"})
		return
	}
	h.check(w, r, in)
}

// checkJSON is POST /v1/check with a sluice.v1.CheckRequest as JSON.
func (h *HTTP) checkJSON(w http.ResponseWriter, r *http.Request) {
	in := new(sluicev1.CheckRequest)
	if !readJSON(w, r, h.maxBody, h.api.bounds, in) {
		return
	}
	h.check(w, r, in)
}

func (h *HTTP) check(w http.ResponseWriter, r *http.Request, in *sluicev1.CheckRequest) {
	c := h.api.calls.Get().(*call)
	defer h.api.calls.Put(c)
	if err := fillCheck(&c.req, in); err != nil {
		writeError(w, err)
		return
	}
	ctx, cancel, ok := requestContext(w, r)
	if !ok {
		return
	}
	defer cancel()
	if err := h.api.opts.checkRefunds(ctx, r.Header, &c.req); err != nil {
		writeError(w, err)
		return
	}
	if err := h.api.tracing.check(ctx, checkSpan(r), r.Header, h.api.lim, &c.req, &c.resp); err != nil {
		writeError(w, err)
		return
	}
	resp := &c.resp
	code := http.StatusOK
	if i := resp.MostRestrictive(); i >= 0 {
		st := &resp.Statuses[i]
		hd := w.Header()
		hd.Set(h.headers.Limit, strconv.FormatUint(st.Decision.Limit, 10))
		hd.Set(h.headers.Remaining, strconv.FormatUint(st.Decision.Remaining, 10))
		hd.Set(h.headers.Reset, strconv.FormatInt(int64(st.ResetAfter().Seconds()), 10))
	}
	if h.ietf {
		if policy, limits := ietfFields(resp); len(policy) > 0 {
			w.Header().Set(ietfPolicyHeader, string(policy))
			w.Header().Set(ietfHeader, string(limits))
		}
	}
	if resp.Overall == limiter.OverLimit {
		code = http.StatusTooManyRequests
		if d := resp.RetryAfter(); d > 0 && d != store.Never {
			w.Header().Set("Retry-After", strconv.FormatInt(int64(d.Seconds()), 10))
		}
	}
	writeProto(w, code, marshalAPI, checkResponse(resp))
}

// checkSpan names the span of a /v1/check request.
func checkSpan(r *http.Request) string {
	if r.Method == http.MethodGet {
		return "GET /v1/check"
	}
	return "POST /v1/check"
}

// TimeoutHeader states how long an HTTP caller waits for its answer, as
// a Go duration ("20ms", "1s"): the HTTP form of gRPC's grpc-timeout. A
// store that waits on the network (Redis) gives up in time to answer
// within it, by the failure mode if need be.
const TimeoutHeader = "Sluice-Timeout"

// maxTimeout bounds TimeoutHeader (a store's own ceiling applies anyway).
const maxTimeout = time.Hour

// requestContext returns r's context, with the deadline TimeoutHeader
// states if any. A malformed header is answered 400 (ok false).
func requestContext(w http.ResponseWriter, r *http.Request) (ctx context.Context, cancel context.CancelFunc, ok bool) {
	v := r.Header.Get(TimeoutHeader)
	if v == "" {
		return r.Context(), func() {}, true
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 || d > maxTimeout {
		writeError(w, &limiter.InvalidError{Reason: TimeoutHeader + " must be a positive duration of at most 1h, such as 20ms"})
		return nil, nil, false
	}
	ctx, cancel = context.WithTimeout(r.Context(), d)
	return ctx, cancel, true
}

// readJSON reads r's body, of Content-Type application/json and at most
// maxBody bytes, into m, a RateLimitRequest or a CheckRequest: one with
// more descriptors or entries than b is refused before it is decoded.
// Otherwise it answers 415, 413, 408 or 400 (ok false).
func readJSON(w http.ResponseWriter, r *http.Request, maxBody int64, b bounds, m proto.Message) bool {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		writeJSONError(w, http.StatusUnsupportedMediaType, "Content-Type must be application/json (curl: -H 'Content-Type: application/json')")
		return false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	var tooLarge *http.MaxBytesError
	var netErr net.Error
	switch {
	case errors.As(err, &tooLarge):
		writeJSONError(w, http.StatusRequestEntityTooLarge, "request body larger than "+strconv.FormatInt(tooLarge.Limit, 10)+" bytes")
		return false
	case errors.As(err, &netErr) && netErr.Timeout():
		// The server's read timeout passed (a body sent too slowly).
		writeJSONError(w, http.StatusRequestTimeout, "request body not received in time")
		return false
	}
	if err == nil {
		if err := jsonShape(body, b); err != nil {
			writeError(w, err)
			return false
		}
		err = unmarshalJSON.Unmarshal(body, m)
	}
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid request body: "+err.Error())
		return false
	}
	return true
}

func writeProto(w http.ResponseWriter, code int, opts protojson.MarshalOptions, m proto.Message) {
	b, err := opts.Marshal(m)
	if err != nil {
		writeJSONError(w, http.StatusInternalServerError, err.Error())
		return
	}
	// protojson varies its whitespace on purpose; compact it so that the
	// output is stable.
	var out bytes.Buffer
	json.Compact(&out, b)
	out.WriteByte('\n')
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(out.Bytes())
}

// writeError answers a limiter error: 400 for a bad request, 503 when the
// store failed or no config is loaded.
func writeError(w http.ResponseWriter, err error) {
	var inv *limiter.InvalidError
	var re *RefusedError
	switch {
	case errors.As(err, &inv):
		writeJSONError(w, http.StatusBadRequest, inv.Reason)
	case errors.As(err, &re):
		writeJSONError(w, http.StatusForbidden, re.Reason)
	default:
		writeJSONError(w, http.StatusServiceUnavailable, err.Error())
	}
}

func writeJSONError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(struct {
		Error string `json:"error"`
	}{msg})
}
