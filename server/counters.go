package server

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/config"
	sluicev1 "github.com/sluicehq/sluice/gen/sluice/v1"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/store"
)

// CountersOptions configure Counters. The zero value serves lookups and
// refuses resets.
type CountersOptions struct {
	// Auth, if not nil, turns resets on: a reset then needs
	// "Authorization: Bearer <token>" with a token Auth finds valid. Nil
	// answers every reset 403.
	Auth Authorizer
	// Logger gets one INFO line per descriptor reset: the client's
	// address, the domain, the rule's path and name, and the descriptor's
	// entries only if the rule has detailed_metric. Nil logs nothing.
	Logger *slog.Logger
	// OnReset, if not nil, is called once per limit reset, with the
	// domain and the limit's rule (its own, not the descriptor's: a
	// rate_limits list's second is "user[1]"), nil for a limit override:
	// for a metric (observe.Rules.Reset).
	OnReset func(domain string, rule *config.Rule)
	// MaxBodyBytes bounds a POST body; 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// RefusedDelay is how long a reset without the right token waits
	// before its 401: it slows a guesser, costs a client that has the
	// token nothing, and holds no lock (a flood of wrong tokens delays
	// no one else). 0 means DefaultRefusedDelay; negative, none.
	RefusedDelay time.Duration
	// Now and Sleep tell the time (for the rate of the refusals' log
	// lines) and wait RefusedDelay; nil means the system's.
	Now   func() time.Time
	Sleep func(ctx context.Context, d time.Duration)
}

// DefaultRefusedDelay is CountersOptions.RefusedDelay's default.
const DefaultRefusedDelay = 250 * time.Millisecond

// refusedLogEvery is the most often a refused reset is logged; the line
// counts the refusals since the last one.
const refusedLogEvery = time.Minute

// Counters serves the counter endpoints over a limiter:
//
//	GET  /v1/counters?domain=D&key=K&value=V[&key=K2&value=V2...]
//	POST /v1/counters        (a sluice.v1.CheckRequest as JSON)
//	POST /v1/counters/reset  (the same body; needs the admin token)
//
// A lookup answers, per descriptor, the rule it matches and every limit's
// counter now (used, remaining, reset and retry times) and consumes
// nothing (limiter.Counters). A reset sets those counters back to empty
// (limiter.Reset). Safe for concurrent use.
type Counters struct {
	lim  CounterLimiter
	opts CountersOptions
	mux  *http.ServeMux
	// refused resets not yet logged, and when the next line may be
	mu       sync.Mutex
	refusals int
	nextLog  time.Time
}

// Authorizer decides which bearer tokens may reset counters (the admin
// token of --admin-token-file). Implementations compare in constant time
// and are safe for concurrent use.
type Authorizer interface {
	// Valid reports whether token, a reset's bearer token (nil without
	// one), allows the reset.
	Valid(token []byte) bool
}

// CounterLimiter is what Counters needs of a *limiter.Limiter.
type CounterLimiter interface {
	Counters(ctx context.Context, req *limiter.Request) ([]limiter.Lookup, error)
	Reset(ctx context.Context, req *limiter.Request) ([]limiter.Lookup, error)
	// Bounds are the most descriptors in a request and entries in a
	// descriptor.
	Bounds() (descriptors, entries int)
}

var _ CounterLimiter = (*limiter.Limiter)(nil)

// NewCounters returns the counter endpoints over lim.
func NewCounters(lim CounterLimiter, opts CountersOptions) *Counters {
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.RefusedDelay == 0 {
		opts.RefusedDelay = DefaultRefusedDelay
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Sleep == nil {
		opts.Sleep = sleep
	}
	c := &Counters{lim: lim, opts: opts, mux: http.NewServeMux()}
	c.mux.HandleFunc("GET /v1/counters", c.lookupQuery)
	c.mux.HandleFunc("POST /v1/counters", c.lookupJSON)
	c.mux.HandleFunc("POST /v1/counters/reset", c.reset)
	return c
}

// ServeHTTP implements http.Handler.
func (c *Counters) ServeHTTP(w http.ResponseWriter, r *http.Request) { c.mux.ServeHTTP(w, r) }

// Patterns lists the paths Counters serves, for mounting on a mux.
func (c *Counters) Patterns() []string { return []string{"/v1/counters", "/v1/counters/reset"} }

// Resets reports whether resets are on.
func (c *Counters) Resets() bool { return c.opts.Auth != nil }

// ParseCountersQuery reads GET /v1/counters's query: a domain and one
// descriptor whose entries are the key and value parameters, paired in
// order (key=a&value=1&key=b&value=2 is the descriptor a=1, b=2). Every
// key needs its value (value= for an empty one); more than maxEntries
// keys are refused.
func ParseCountersQuery(q url.Values, req *limiter.Request, maxEntries int) error {
	req.Reset()
	for name := range q {
		if name != "domain" && name != "key" && name != "value" {
			return &limiter.InvalidError{Reason: "unknown parameter " + quote(name) + " (want domain, key and value)"}
		}
	}
	if d := q["domain"]; len(d) > 1 {
		return &limiter.InvalidError{Reason: "domain given more than once"}
	}
	req.Domain = q.Get("domain")
	keys, values := q["key"], q["value"]
	switch {
	case len(keys) == 0:
		return &limiter.InvalidError{Reason: "key is required"}
	case len(keys) != len(values):
		return &limiter.InvalidError{Reason: "every key needs a value, in order: key=K&value=V (value= for an empty one)"}
	case len(keys) > maxEntries:
		return limiter.TooManyEntries(0, maxEntries)
	}
	d := req.AddDescriptor()
	for i, k := range keys {
		d.Entries = append(d.Entries, config.Entry{Key: k, Value: values[i]})
	}
	return nil
}

// quote quotes s for an error, at most 64 bytes of it.
func quote(s string) string {
	b, _ := json.Marshal(truncateBytes(s, 64))
	return string(b)
}

func truncateBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func (c *Counters) lookupQuery(w http.ResponseWriter, r *http.Request) {
	var req limiter.Request
	_, maxEntries := c.lim.Bounds()
	if err := ParseCountersQuery(r.URL.Query(), &req, maxEntries); err != nil {
		writeError(w, err)
		return
	}
	c.answer(w, r, &req, c.lim.Counters)
}

func (c *Counters) lookupJSON(w http.ResponseWriter, r *http.Request) {
	req, ok := c.readRequest(w, r)
	if !ok {
		return
	}
	c.answer(w, r, req, c.lim.Counters)
}

// readRequest reads a POST body as POST /v1/check takes it.
func (c *Counters) readRequest(w http.ResponseWriter, r *http.Request) (*limiter.Request, bool) {
	in := new(sluicev1.CheckRequest)
	d, e := c.lim.Bounds()
	if !readJSON(w, r, c.opts.MaxBodyBytes, bounds{descriptors: d, entries: e}, in) {
		return nil, false
	}
	req := new(limiter.Request)
	if err := fillCheck(req, in); err != nil {
		writeError(w, err)
		return nil, false
	}
	return req, true
}

// reset is POST /v1/counters/reset: 403 while resets are off, 401
// without the token, then a lookup's answer after the reset.
func (c *Counters) reset(w http.ResponseWriter, r *http.Request) {
	if c.opts.Auth == nil {
		writeJSONError(w, http.StatusForbidden, "counter resets are off: start sluice with --admin-token-file")
		return
	}
	if !c.opts.Auth.Valid(bearer(r)) {
		c.refused(r)
		w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
		writeJSONError(w, http.StatusUnauthorized, "a reset needs Authorization: Bearer <the admin token>")
		return
	}
	req, ok := c.readRequest(w, r)
	if !ok {
		return
	}
	c.answer(w, r, req, func(ctx context.Context, req *limiter.Request) ([]limiter.Lookup, error) {
		got, err := c.lim.Reset(ctx, req)
		if err == nil {
			c.logReset(r, req, got)
		}
		return got, err
	})
}

// refused logs a reset refused for its token, at most once per
// refusedLogEvery (counting the others), and waits RefusedDelay.
func (c *Counters) refused(r *http.Request) {
	now := c.opts.Now()
	c.mu.Lock()
	c.refusals++
	n := 0
	if !now.Before(c.nextLog) {
		n, c.refusals, c.nextLog = c.refusals, 0, now.Add(refusedLogEvery)
	}
	c.mu.Unlock()
	if n > 0 && c.opts.Logger != nil {
		c.opts.Logger.Warn("counter reset refused: missing or wrong admin token", "client", r.RemoteAddr,
			"refused", n, "since", "the last such line (at most one a minute)")
	}
	if c.opts.RefusedDelay > 0 {
		c.opts.Sleep(r.Context(), c.opts.RefusedDelay)
	}
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// bearer is the token of r's Authorization header, nil if none.
func bearer(r *http.Request) []byte {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return nil
	}
	return []byte(strings.TrimSpace(tok))
}

// logReset logs and counts the limits a reset set back.
func (c *Counters) logReset(r *http.Request, req *limiter.Request, got []limiter.Lookup) {
	for i := range got {
		lk := &got[i]
		if len(lk.Counters) == 0 {
			continue
		}
		rule, name, detailed := "override", "", false
		if lk.Rule != nil {
			rule, name, detailed = lk.Rule.Path, lk.Rule.Name, lk.Rule.DetailedMetric
		}
		if c.opts.Logger != nil {
			attrs := []any{"client", r.RemoteAddr, "domain", req.Domain, "rule", rule, "limits", len(lk.Counters)}
			if name != "" {
				attrs = append(attrs, "name", name)
			}
			if detailed {
				attrs = append(attrs, "descriptor", entriesString(req.Descriptors[i].Entries))
			}
			c.opts.Logger.Info("counters reset", attrs...)
		}
		if c.opts.OnReset == nil {
			continue
		}
		for j := range lk.Counters {
			if !lk.Counters[j].Replaced || lk.Counters[j].Rule == nil {
				c.opts.OnReset(req.Domain, lk.Counters[j].Rule)
			}
		}
	}
}

// answer runs fn (a lookup or a reset) and writes its JSON.
func (c *Counters) answer(w http.ResponseWriter, r *http.Request, req *limiter.Request,
	fn func(context.Context, *limiter.Request) ([]limiter.Lookup, error)) {
	ctx, cancel, ok := requestContext(w, r)
	if !ok {
		return
	}
	defer cancel()
	got, err := fn(ctx, req)
	switch {
	case errors.Is(err, limiter.ErrNoReset):
		writeJSONError(w, http.StatusNotImplemented, "this store cannot reset counters")
		return
	case err != nil:
		writeError(w, err)
		return
	}
	out := CountersResponse{Domain: req.Domain, Descriptors: make([]DescriptorCounters, len(got))}
	for i := range got {
		out.Descriptors[i] = descriptorCounters(&req.Descriptors[i], &got[i])
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

// CountersResponse is the JSON of a lookup or a reset.
type CountersResponse struct {
	Domain      string               `json:"domain"`
	Descriptors []DescriptorCounters `json:"descriptors"`
}

// DescriptorCounters is one descriptor's rule and counters.
type DescriptorCounters struct {
	Entries []Entry `json:"entries"`
	// Matched reports that a rule matched (or the descriptor has a limit
	// override).
	Matched   bool   `json:"matched"`
	Override  bool   `json:"override,omitempty"`
	Unlimited bool   `json:"unlimited,omitempty"`
	Path      string `json:"path,omitempty"` // the matched rule's
	Name      string `json:"name,omitempty"`
	// Limits has one element per limit of the rule, in the config's
	// order.
	Limits []CounterJSON `json:"limits"`
}

// Entry is one descriptor entry.
type Entry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// CounterJSON is one limit and its counter now.
type CounterJSON struct {
	Path            string `json:"path,omitempty"`
	Name            string `json:"name,omitempty"`
	Algorithm       string `json:"algorithm"`
	RequestsPerUnit uint64 `json:"requests_per_unit"`
	Unit            string `json:"unit"`
	UnitMultiplier  uint32 `json:"unit_multiplier"`
	// Per spells the period ("minute", "30*second", "calendar month
	// (UTC)").
	Per    string `json:"per"`
	Shadow bool   `json:"shadow_mode,omitempty"`
	// Replaced reports a limit another descriptor of the request
	// replaces: not counted, so no counter is shown.
	Replaced bool `json:"replaced,omitempty"`
	// Limit is the counter's size: requests per window, or the bucket's
	// capacity (burst).
	Limit     uint64 `json:"limit"`
	Used      uint64 `json:"used"`
	Remaining uint64 `json:"remaining"`
	// Allowed reports whether one more request would fit now.
	Allowed bool `json:"allowed"`
	// ResetAfterS is the seconds until the window ends, the bucket is
	// full again, or a sliding window's oldest counted part leaves it.
	ResetAfterS float64 `json:"reset_after_s"`
	// RetryAfterS, when one more does not fit, is the seconds until it
	// would; omitted when it fits or never can (Never).
	RetryAfterS float64 `json:"retry_after_s,omitempty"`
	Never       bool    `json:"never,omitempty"`
}

func descriptorCounters(d *limiter.Descriptor, lk *limiter.Lookup) DescriptorCounters {
	out := DescriptorCounters{Entries: make([]Entry, len(d.Entries)), Override: lk.Override, Unlimited: lk.Unlimited,
		Limits: make([]CounterJSON, 0, len(lk.Counters))}
	for i, e := range d.Entries {
		out.Entries[i] = Entry{e.Key, e.Value}
	}
	out.Matched = lk.Rule != nil || lk.Override || len(lk.Counters) > 0
	if lk.Rule != nil {
		out.Path, out.Name = lk.Rule.Path, lk.Rule.Name
	}
	for i := range lk.Counters {
		out.Limits = append(out.Limits, counterJSON(d, &lk.Counters[i]))
	}
	return out
}

func counterJSON(d *limiter.Descriptor, c *limiter.Counter) CounterJSON {
	var j CounterJSON
	if r := c.Rule; r != nil {
		j.Path, j.Name, j.RequestsPerUnit, j.Unit, j.UnitMultiplier = r.Path, r.Name, r.RequestsPerUnit, r.Unit.String(), r.UnitMultiplier
		j.Per, j.Shadow, j.Algorithm = r.Per(), r.ShadowMode, r.Algorithm.String()
	} else {
		o := d.Override
		j.RequestsPerUnit, j.Unit, j.UnitMultiplier = uint64(o.RequestsPerUnit), o.Unit.String(), max(o.UnitMultiplier, 1)
		j.Per, j.Algorithm = o.Unit.String(), store.FixedWindow.String()
		if o.UnitMultiplier > 1 {
			j.Per = strconv.FormatUint(uint64(o.UnitMultiplier), 10) + "*" + j.Per
		}
	}
	j.Limit = c.Limit.Capacity()
	if c.Replaced {
		j.Replaced = true
		return j
	}
	dec := &c.Decision
	j.Used, j.Remaining, j.Allowed = c.Used(), dec.Remaining, dec.Allowed
	j.ResetAfterS = dec.ResetAfter.Seconds()
	switch {
	case dec.RetryAfter == store.Never:
		j.Never = true
	case !dec.Allowed:
		j.RetryAfterS = dec.RetryAfter.Seconds()
	}
	return j
}
