package observe

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/pprof"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/store"
)

// KeyRanger is a store that can list its live counters.
type KeyRanger interface {
	// RangeKeys calls fn with each live key that starts with prefix and
	// the decision a zero-cost check of it would get at now, in no
	// particular order, until fn returns false.
	RangeKeys(prefix string, now int64, fn func(key string, d store.Decision) bool)
}

// Key listing bounds for /debug/keys.
const (
	DefaultKeyLimit = 100
	MaxKeyLimit     = 1000
)

// Debug serves the debug endpoints. Mount its Handler on a listener of its
// own (--debug-addr), never on a public one: pprof and the live keys tell
// a lot.
type Debug struct {
	// Tables gives the config in force, for /rlconfig.
	Tables limiter.Tables
	// Keys lists live counters for /debug/keys; nil when the store
	// cannot (it then answers 501).
	Keys KeyRanger
	// Clock tells the time for /debug/keys; nil means time.Now.
	Clock store.Clock
	Build Build
	// Cmdline is what /debug/pprof/cmdline shows: the process's command
	// line with its secrets redacted (pprof's own handler shows os.Args
	// as it is, passwords included). Nil shows nothing.
	Cmdline []string
}

// Handler serves:
//
//	/debug/pprof/              Go's profiles (net/http/pprof); cmdline
//	                           is Cmdline, not os.Args
//	/rlconfig                  the loaded config, one rule a line
//	/debug/keys?domain=D&prefix=P&limit=N
//	                           up to N (default 100, at most 1000) live
//	                           counters of domain D whose key continues
//	                           with P, as JSON
//	/debug/build               version, commit and the Go build info
func (d *Debug) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", d.cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /rlconfig", d.rlconfig)
	mux.HandleFunc("GET /debug/keys", d.keys)
	mux.HandleFunc("GET /debug/build", d.build)
	return mux
}

// cmdline answers as pprof.Cmdline does (the arguments separated by NUL
// bytes), with Cmdline.
func (d *Debug) cmdline(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprint(w, strings.Join(d.Cmdline, "\x00"))
}

func (d *Debug) rlconfig(w http.ResponseWriter, _ *http.Request) {
	t := d.Tables.Current()
	if t == nil {
		http.Error(w, "no configuration loaded", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprint(w, t.String())
}

// KeyInfo is one counter in /debug/keys.
type KeyInfo struct {
	Key       string  `json:"key"`
	Limit     uint64  `json:"limit"`
	Remaining uint64  `json:"remaining"`
	ResetS    float64 `json:"reset_after_s"`
}

// KeyList is /debug/keys's answer. Truncated reports that more keys
// matched than Limit.
type KeyList struct {
	Keys      []KeyInfo `json:"keys"`
	Limit     int       `json:"limit"`
	Truncated bool      `json:"truncated"`
}

func (d *Debug) keys(w http.ResponseWriter, r *http.Request) {
	if d.Keys == nil {
		http.Error(w, "this store cannot list its counters", http.StatusNotImplemented)
		return
	}
	q := r.URL.Query()
	domain := q.Get("domain")
	if domain == "" {
		http.Error(w, "domain is required: /debug/keys?domain=D[&prefix=P][&limit=N]", http.StatusBadRequest)
		return
	}
	limit := DefaultKeyLimit
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxKeyLimit {
			http.Error(w, fmt.Sprintf("limit must be 1..%d", MaxKeyLimit), http.StatusBadRequest)
			return
		}
		limit = n
	}
	now := time.Now().UnixNano()
	if d.Clock != nil {
		now = d.Clock.Now()
	}
	out := KeyList{Keys: []KeyInfo{}, Limit: limit}
	// Before a config has loaded there are no counters to show.
	if t := d.Tables.Current(); t != nil {
		d.Keys.RangeKeys(t.KeyPrefix(domain)+q.Get("prefix"), now, func(key string, dec store.Decision) bool {
			if len(out.Keys) == limit {
				out.Truncated = true
				return false
			}
			out.Keys = append(out.Keys, KeyInfo{Key: key, Limit: dec.Limit, Remaining: dec.Remaining, ResetS: dec.ResetAfter.Seconds()})
			return true
		})
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(out)
}

func (d *Debug) build(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "sluice %s (commit %s, %s)\n\n", d.Build.Version, d.Build.Commit, runtime.Version())
	if bi, ok := debug.ReadBuildInfo(); ok {
		fmt.Fprint(w, bi.String())
	}
}
