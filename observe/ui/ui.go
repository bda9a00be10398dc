package ui

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path"
	"runtime"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/store"
)

//go:embed assets
var assets embed.FS

// Bounds of the JSON endpoints.
const (
	// MaxRules is the most rules the limits JSON lists.
	MaxRules = 2000
	// MaxProblems is the most problems of a failed load the overview
	// lists; maxErrorBytes bounds the error's message.
	MaxProblems = 20
	// MaxFileNames is the most config file names the overview lists.
	MaxFileNames  = 100
	maxErrorBytes = 4096
)

// Source describes where the limits come from. A file source has Kind
// "file" and the path; a source pushed over xDS would add its server and
// the version of the last push.
type Source struct {
	Kind     string `json:"kind"`
	Location string `json:"location"`
	Version  string `json:"version,omitempty"`
}

// StoreStatus is what the page shows about the counter store: its kind,
// whether it is healthy, and a few named figures shown as they are.
type StoreStatus struct {
	Kind    string `json:"kind"`
	Healthy bool   `json:"healthy"`
	Stats   []Stat `json:"stats"`
}

// Stat is one named figure of the store.
type Stat struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// MemoryStatus reports a memory store's key counts.
func MemoryStatus(st observe.MemoryStatser) func() StoreStatus {
	return func() StoreStatus {
		s := st.Stats()
		return StoreStatus{Kind: "memory", Healthy: true, Stats: []Stat{
			{"keys", fmt.Sprint(s.Keys)}, {"inserts", fmt.Sprint(s.Inserts)},
			{"swept", fmt.Sprint(s.Swept)}, {"evictions", fmt.Sprint(s.Evictions)},
		}}
	}
}

// Options configure the page. Only Tables is required.
type Options struct {
	// Tables gives the config in force.
	Tables limiter.Tables
	// Reload reports the config's load history; nil hides it.
	Reload observe.ReloadStatuser
	// Overlay reports the load history of the overlay on pushed limits
	// (--xds-overlay); nil when there is none.
	Overlay func() config.OverlayStatus
	// Source describes where the config comes from; nil hides it.
	Source func() Source
	// Traffic gives the live traffic; nil shows none.
	Traffic *Traffic
	// Store reports the counter store; nil shows its kind as unknown.
	Store func() StoreStatus
	// Serving reports the health the server answers; nil means serving.
	Serving func() bool
	Build   observe.Build
	// Started is when the server started, for its uptime.
	Started time.Time
	// Clock is the demo limiter's clock; nil means the system clock.
	Clock store.Clock
	// Quota is the Rate Limit Quota Service whose buckets the page lists
	// per rule; nil when the server does not serve RLQS.
	Quota observe.QuotaStatser
	// Counters serves the counter lookup (and reset) endpoints,
	// server.Counters, for the "Look up a client" form; nil hides the
	// form.
	Counters http.Handler
	// Resets reports that Counters resets counters (with the admin
	// token): the form then offers a reset.
	Resets bool
}

// UI serves the status page. Safe for concurrent use.
type UI struct {
	opts  Options
	demo  *demo
	etags map[string]string
}

// New returns the page. It fails only if the built-in demo config does
// not compile.
func New(opts Options) (*UI, error) {
	if opts.Tables == nil {
		return nil, errors.New("ui: Options.Tables is required")
	}
	d, err := newDemo(opts.Clock)
	if err != nil {
		return nil, err
	}
	u := &UI{opts: opts, demo: d, etags: map[string]string{}}
	ents, err := assets.ReadDir("assets")
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		b, _ := assets.ReadFile("assets/" + e.Name())
		sum := sha256.Sum256(b)
		u.etags[e.Name()] = `"` + hex.EncodeToString(sum[:8]) + `"`
	}
	return u, nil
}

// Handler serves, relative to where it is mounted:
//
//	/                      the page
//	/ui/assets/NAME        its script, style sheet and icon
//	/ui/api/overview       build, uptime, health, store, config source and last load
//	/ui/api/limits         every rule of the config in force (at most MaxRules)
//	/ui/api/traffic        each rule's rates over the last minute and totals
//	/ui/api/rlqs           each rule's RLQS buckets (at most MaxRules rules)
//	/ui/api/demo           the demo's rules
//	/ui/demo/v1/check      the demo limiter's /v1/check (server.HTTP)
//	/ui/counters/v1/...    Options.Counters: the server's /v1/counters and
//	                       /v1/counters/reset, for the lookup form
//
// Every URL in the page is relative, so mount it at "/" or behind a path
// prefix with http.StripPrefix.
func (u *UI) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { u.asset(w, r, "index.html") })
	mux.HandleFunc("GET /ui/assets/{name}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		if name == "index.html" {
			http.NotFound(w, r)
			return
		}
		u.asset(w, r, name)
	})
	mux.HandleFunc("GET /ui/api/overview", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, u.Overview()) })
	mux.HandleFunc("GET /ui/api/limits", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, u.Limits()) })
	mux.HandleFunc("GET /ui/api/traffic", func(w http.ResponseWriter, _ *http.Request) {
		v := TrafficView{Rules: []RuleTraffic{}}
		if u.opts.Traffic != nil {
			v = u.opts.Traffic.View()
		}
		writeJSON(w, v)
	})
	mux.HandleFunc("GET /ui/api/rlqs", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, u.Quota()) })
	mux.HandleFunc("GET /ui/api/demo", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, limits(u.demo.table)) })
	mux.Handle("/ui/demo/", u.demo.check)
	if u.opts.Counters != nil {
		mux.Handle("/ui/counters/", http.StripPrefix("/ui/counters", u.opts.Counters))
	}
	return securityHeaders(mux)
}

// securityHeaders keeps the page to its own origin's scripts and styles
// and out of frames.
func securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		h.ServeHTTP(w, r)
	})
}

var contentTypes = map[string]string{".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
	".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}

func (u *UI) asset(w http.ResponseWriter, r *http.Request, name string) {
	etag, ok := u.etags[name]
	if !ok {
		http.NotFound(w, r)
		return
	}
	b, _ := assets.ReadFile("assets/" + name)
	w.Header().Set("Content-Type", contentTypes[path.Ext(name)])
	w.Header().Set("ETag", etag)
	w.Header().Set("Cache-Control", "no-cache")
	if r.Header.Get("If-None-Match") == etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Write(b)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(v)
}

// Overview is the overview JSON.
type Overview struct {
	Version   string       `json:"version"`
	Commit    string       `json:"commit"`
	Go        string       `json:"go"`
	StartedAt time.Time    `json:"started_at"`
	UptimeS   float64      `json:"uptime_s"`
	Serving   bool         `json:"serving"`
	Store     StoreStatus  `json:"store"`
	Config    ConfigStatus `json:"config"`
	// RLQS is nil when the server does not serve RLQS.
	RLQS *QuotaSummary `json:"rlqs"`
	// Counters says what the lookup form may do.
	Counters CountersStatus `json:"counters"`
}

// CountersStatus says whether the page can look up counters and whether
// the server resets them (with the admin token).
type CountersStatus struct {
	Lookup bool `json:"lookup"`
	Resets bool `json:"resets"`
}

// ConfigStatus is the config's source and load history.
type ConfigStatus struct {
	Source *Source `json:"source"`
	Loaded bool    `json:"loaded"` // a config is in force
	Hash   string  `json:"hash"`
	Files  int     `json:"files"`
	// FileNames are the files that define rules, at most MaxFileNames.
	FileNames   []string   `json:"file_names"`
	Domains     int        `json:"domains"`
	Rules       int        `json:"rules"`
	LastOK      bool       `json:"last_ok"`
	LastSuccess *time.Time `json:"last_success"`
	Successes   uint64     `json:"successes"`
	Failures    uint64     `json:"failures"`
	// LastError is the last attempt's failure; nil if it succeeded.
	LastError *LoadError `json:"last_error"`
	// Overlay is the overlay on pushed limits; nil without one.
	Overlay *OverlayStatus `json:"overlay"`
}

// OverlayStatus is the overlay's load history and what it did to the
// config in force.
type OverlayStatus struct {
	// Files and Entries count the overlay in force (before a first
	// push too).
	Files     int        `json:"files"`
	Entries   int        `json:"entries"`
	Hash      string     `json:"hash"`
	LastOK    bool       `json:"last_ok"`
	Successes uint64     `json:"successes"`
	Failures  uint64     `json:"failures"`
	LastError *LoadError `json:"last_error"`
	// Unmatched are the entries that change no rule; Problems the
	// entries that cannot apply to a rule they match. At most
	// MaxProblems each.
	Unmatched []OverlayMiss `json:"unmatched"`
	Problems  []OverlayMiss `json:"problems"`
}

// OverlayMiss is an overlay entry not applied (config.OverlayMiss).
type OverlayMiss struct {
	File   string `json:"file"`
	Line   int    `json:"line"`
	Match  string `json:"match"`
	Rule   string `json:"rule,omitempty"`
	Reason string `json:"reason"`
}

// RuleOverlay is what an overlay changed in a rule, and where.
type RuleOverlay struct {
	File   string   `json:"file"`
	Line   int      `json:"line"`
	Fields []string `json:"fields"`
}

// LoadError is a failed load: its message and, for a config that did not
// validate, its problems with their file and line.
type LoadError struct {
	Message  string    `json:"message"`
	Problems []Problem `json:"problems"`
	// More counts the problems past MaxProblems.
	More int `json:"more"`
}

// Problem is one problem of a limits file (config.Error).
type Problem struct {
	File string `json:"file"`
	Line int    `json:"line"`
	Path string `json:"path"`
	Msg  string `json:"msg"`
}

// Overview reports the build, the uptime, health, the store, the config
// and the RLQS streams.
func (u *UI) Overview() Overview {
	o := Overview{Version: u.opts.Build.Version, Commit: u.opts.Build.Commit, Go: runtime.Version(),
		StartedAt: u.opts.Started, Serving: true, Store: StoreStatus{Kind: "unknown", Stats: []Stat{}}}
	if !u.opts.Started.IsZero() {
		o.UptimeS = time.Since(u.opts.Started).Seconds()
	}
	if u.opts.Serving != nil {
		o.Serving = u.opts.Serving()
	}
	if u.opts.Store != nil {
		o.Store = u.opts.Store()
	}
	o.RLQS = u.quotaSummary()
	o.Counters = CountersStatus{Lookup: u.opts.Counters != nil, Resets: u.opts.Counters != nil && u.opts.Resets}
	c := &o.Config
	if u.opts.Source != nil {
		s := u.opts.Source()
		c.Source = &s
	}
	if t := u.opts.Tables.Current(); t != nil {
		c.Loaded, c.Hash, c.Files = true, t.Hash(), t.Files()
		c.Domains, c.Rules = len(t.Domains()), len(t.Rules())
		c.FileNames = fileNames(t)
	}
	if u.opts.Overlay != nil {
		c.Overlay = overlayStatus(u.opts.Overlay(), u.opts.Tables.Current())
	}
	if u.opts.Reload == nil {
		c.LastOK = c.Loaded
		return o
	}
	s := u.opts.Reload.Status()
	c.LastOK, c.Successes, c.Failures = s.LastOK, s.Successes, s.Failures
	if !s.LastSuccess.IsZero() {
		c.LastSuccess = &s.LastSuccess
	}
	if s.LastError != nil {
		c.LastError = loadError(s.LastError)
	}
	return o
}

// overlayStatus describes the overlay whose load history is s, applied
// to t (nil before the first config).
func overlayStatus(s config.OverlayStatus, t *config.Table) *OverlayStatus {
	o := &OverlayStatus{Files: s.Files, Entries: s.Entries, Hash: s.Hash, LastOK: s.LastOK, Successes: s.Successes,
		Failures: s.Failures, Unmatched: []OverlayMiss{}, Problems: []OverlayMiss{}}
	if s.LastError != nil {
		o.LastError = loadError(s.LastError)
	}
	if t == nil {
		return o
	}
	rep := t.Overlay()
	for _, l := range []struct {
		from []config.OverlayMiss
		to   *[]OverlayMiss
	}{{rep.Unmatched, &o.Unmatched}, {rep.Problems, &o.Problems}} {
		for i, m := range l.from {
			if i == MaxProblems {
				break
			}
			*l.to = append(*l.to, OverlayMiss{File: m.File, Line: m.Line, Match: truncate(m.Match, maxErrorBytes),
				Rule: truncate(m.Rule, maxErrorBytes), Reason: truncate(m.Reason, maxErrorBytes)})
		}
	}
	return o
}

// fileNames lists the files that define t's rules, sorted, at most
// MaxFileNames.
func fileNames(t *config.Table) []string {
	seen := map[string]bool{}
	names := []string{}
	for _, r := range t.Rules() {
		if !seen[r.File] && len(names) < MaxFileNames {
			seen[r.File] = true
			names = append(names, r.File)
		}
	}
	slices.Sort(names)
	return names
}

func loadError(err error) *LoadError {
	e := &LoadError{Message: truncate(err.Error(), maxErrorBytes), Problems: []Problem{}}
	var es *config.Errors
	if errors.As(err, &es) {
		for i, p := range es.List {
			if i == MaxProblems {
				e.More = len(es.List) - i
				break
			}
			e.Problems = append(e.Problems, Problem{File: p.File, Line: p.Line, Path: p.Path, Msg: truncate(p.Msg, maxErrorBytes)})
		}
	}
	return e
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// RuleInfo is one rule of the config as the limits JSON shows it.
type RuleInfo struct {
	Domain string `json:"domain"`
	// Path is the rule's key path (config.Rule.Path): the name its
	// traffic goes by.
	Path string `json:"path"`
	Name string `json:"name,omitempty"`
	// Limit summarises the limit in words ("100 per second", "10 per
	// minute, burst 20", "unlimited").
	Limit           string   `json:"limit"`
	Algorithm       string   `json:"algorithm,omitempty"`
	Unit            string   `json:"unit,omitempty"`
	RequestsPerUnit uint64   `json:"requests_per_unit"`
	Burst           uint64   `json:"burst,omitempty"`
	UnitMultiplier  uint32   `json:"unit_multiplier,omitempty"`
	Unlimited       bool     `json:"unlimited"`
	Shadow          bool     `json:"shadow_mode"`
	Replaces        []string `json:"replaces,omitempty"`
	// TimeZone is a calendar rule's zone ("Europe/Berlin"): its windows
	// are calendar periods there. Empty for windows aligned to the epoch.
	TimeZone string `json:"time_zone,omitempty"`
	// Flags lists the rule's other options that are set
	// (detailed_metric, value_to_metric, quota_mode).
	Flags []string `json:"flags,omitempty"`
	File  string   `json:"file"`
	Line  int      `json:"line"`
	// Overlay is what the overlay on pushed limits changed, and where;
	// nil if it changed nothing.
	Overlay *RuleOverlay `json:"overlay,omitempty"`
}

// LimitsView is the limits JSON.
type LimitsView struct {
	Hash    string     `json:"hash"`
	Domains []string   `json:"domains"`
	Rules   []RuleInfo `json:"rules"`
	// Total counts every rule; Truncated reports that Rules stops at
	// MaxRules.
	Total     int  `json:"total"`
	Truncated bool `json:"truncated"`
}

// Limits lists the rules of the config in force.
func (u *UI) Limits() LimitsView { return limits(u.opts.Tables.Current()) }

func limits(t *config.Table) LimitsView {
	v := LimitsView{Domains: []string{}, Rules: []RuleInfo{}}
	if t == nil {
		return v
	}
	v.Hash, v.Domains = t.Hash(), t.Domains()
	rules := t.Rules()
	v.Total = len(rules)
	if len(rules) > MaxRules {
		rules, v.Truncated = rules[:MaxRules], true
	}
	for _, r := range rules {
		v.Rules = append(v.Rules, ruleInfo(r))
	}
	return v
}

// ruleInfo describes r field by field; a new kind of limit adds its
// fields and its words here.
func ruleInfo(r *config.Rule) RuleInfo {
	i := RuleInfo{Domain: r.Domain, Path: r.Path, Name: r.Name, Unlimited: r.Unlimited, Shadow: r.ShadowMode,
		Replaces: r.Replaces, File: r.File, Line: r.Line}
	if ov := r.Overlay; ov != nil {
		i.Overlay = &RuleOverlay{File: ov.File, Line: ov.Line, Fields: ov.Fields}
	}
	for _, f := range []struct {
		on   bool
		name string
	}{{r.DetailedMetric, "detailed_metric"}, {r.ValueToMetric, "value_to_metric"}, {r.QuotaMode, "quota_mode"}} {
		if f.on {
			i.Flags = append(i.Flags, f.name)
		}
	}
	if r.Unlimited {
		i.Limit = "unlimited"
		return i
	}
	i.Algorithm, i.Unit, i.RequestsPerUnit = r.Algorithm.String(), r.Unit.String(), r.RequestsPerUnit
	i.Limit = fmt.Sprintf("%d per %s", r.RequestsPerUnit, r.Unit)
	if r.UnitMultiplier > 1 {
		i.UnitMultiplier = r.UnitMultiplier
		i.Limit = fmt.Sprintf("%d per %d %ss", r.RequestsPerUnit, r.UnitMultiplier, r.Unit)
	}
	if r.Calendar {
		i.TimeZone = r.TimeZone.String()
		i.Limit = fmt.Sprintf("%d per %s", r.RequestsPerUnit, r.Per())
	}
	if r.Algorithm == store.TokenBucket {
		i.Burst = r.Burst
		i.Limit += fmt.Sprintf(", burst %d", r.Burst)
	}
	return i
}
