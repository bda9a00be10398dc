// Package hostguard refuses HTTP requests whose Host header names a host
// the operator did not allow: the defence of browser-facing pages against
// DNS rebinding, where an attacker's name, made to resolve to 127.0.0.1,
// turns the attacker's page and Sluice's status page into one origin.
package hostguard

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Guard decides which Host headers a browser-facing handler answers. Safe
// for concurrent use; immutable once made.
type Guard struct {
	any      bool
	names    map[string]bool
	suffixes []string // ".example.com" for "*.example.com"
	setting  string
}

// New returns a Guard that allows IP literals (v4 or v6, with or without
// a port), localhost and its subdomains (which browsers resolve to
// loopback themselves), a request without a Host, and the names in
// allowed: exact names, "*.domain" for any name below domain, or "*" for
// every name (no guard). Names are compared without case and without a
// trailing dot. setting names the setting that lists them, for the error
// page.
func New(allowed []string, setting string) (*Guard, error) {
	g := &Guard{names: map[string]bool{}, setting: setting}
	for _, a := range allowed {
		raw := strings.TrimSpace(a)
		a = normalize(raw)
		switch {
		case raw == "":
			continue
		case raw == "*":
			g.any = true
		case strings.HasPrefix(a, "*."):
			if !validName(a[2:]) {
				return nil, fmt.Errorf("hostguard: %q: want a host name, *.domain or *", a)
			}
			g.suffixes = append(g.suffixes, a[1:])
		default:
			if !validName(a) {
				return nil, fmt.Errorf("hostguard: %q: want a host name, *.domain or * (no port or scheme)", a)
			}
			g.names[a] = true
		}
	}
	return g, nil
}

// Allowed reports whether host, a request's Host header, may be answered.
func (g *Guard) Allowed(host string) bool {
	if g.any || host == "" {
		return true
	}
	name := hostOnly(host)
	if _, err := netip.ParseAddr(name); err == nil {
		return true
	}
	name = normalize(name)
	if name == "localhost" || strings.HasSuffix(name, ".localhost") || g.names[name] {
		return true
	}
	for _, s := range g.suffixes {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// Wrap returns h answering only requests whose Host is allowed; others
// get 403 with a body naming the setting that allows a name.
func (g *Guard) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.Allowed(r.Host) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprintf(w, "sluice: Host %q is not allowed here: the status page and /v1/counters answer only IP addresses, localhost and the names in %s (a guard against DNS rebinding); add this name there to reach them by it\n", r.Host, g.setting)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// hostOnly is host without its port and, for an IPv6 literal, brackets.
func hostOnly(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		return h
	}
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		return host[1 : len(host)-1]
	}
	return host
}

func normalize(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}

// validName reports whether s is a host name: dot-separated labels of
// letters, digits, '-' and '_'.
func validName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}
