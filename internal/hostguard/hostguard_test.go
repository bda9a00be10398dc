package hostguard

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
)

func TestGuard_Allowed(t *testing.T) {
	g, err := New([]string{"sluice.example.com", " *.svc.cluster.local ", "Ingress.Example.ORG."}, "--http-allowed-hosts")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		host string
		want bool
	}{
		{"", true},
		{"127.0.0.1", true},
		{"127.0.0.1:8080", true},
		{"10.1.2.3:80", true},
		{"[::1]:8080", true},
		{"[::1]", true},
		{"::1", true},
		{"[fe80::1%25eth0]:8080", true},
		{"localhost", true},
		{"LOCALHOST:8080", true},
		{"localhost.", true},
		{"app.localhost:3000", true},
		{"sluice.example.com", true},
		{"sluice.example.com:8080", true},
		{"SLUICE.example.com.", true},
		{"ingress.example.org", true},
		{"sluice.ratelimit.svc.cluster.local:8080", true},
		{"rebind.attacker.example", false},
		{"rebind.attacker.example:8080", false},
		{"svc.cluster.local", false},
		{"localhost.attacker.example", false},
		{"evil-localhost", false},
		{"sluice.example.com.attacker.example", false},
		{"127.0.0.1.attacker.example", false},
		{"x.sluice.example.com", false},
	} {
		if got := g.Allowed(c.host); got != c.want {
			t.Errorf("Allowed(%q) = %v, want %v", c.host, got, c.want)
		}
	}
}

func TestGuard_Any(t *testing.T) {
	g, err := New([]string{"*"}, "x")
	if err != nil {
		t.Fatal(err)
	}
	if !g.Allowed("rebind.attacker.example") {
		t.Error(`"*" refused a name`)
	}
}

func TestNew_BadNames(t *testing.T) {
	for _, a := range []string{"http://x.example", "x.example:8080", "*.", "a..b", "*x.example", "x/y"} {
		if _, err := New([]string{a}, "x"); err == nil || !strings.Contains(err.Error(), a) {
			t.Errorf("New(%q): %v, want an error naming it", a, err)
		}
	}
}

func TestGuard_Wrap(t *testing.T) {
	g, err := New(nil, "--http-allowed-hosts (SLUICE_HTTP_ALLOWED_HOSTS)")
	if err != nil {
		t.Fatal(err)
	}
	h := g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) }))
	r := httptest.NewRequest("GET", "/ui/api/overview", nil)
	r.Host = "rebind.attacker.example"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "--http-allowed-hosts (SLUICE_HTTP_ALLOWED_HOSTS)") {
		t.Errorf("%d %q, want 403 naming the setting", w.Code, w.Body)
	}
	r.Host = "localhost:8080"
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK || w.Body.String() != "ok" {
		t.Errorf("localhost: %d %q, want 200 ok", w.Code, w.Body)
	}
}

// FuzzGuard_Allowed: no Host header panics, an IP literal is always
// allowed, and a name is allowed with no list only if it is localhost's.
func FuzzGuard_Allowed(f *testing.F) {
	for _, s := range []string{"", "127.0.0.1:1", "[::1]:80", "localhost", "a.localhost", "rebind.example", "[", "]:", ":::", "%", "[::1%25x]"} {
		f.Add(s)
	}
	g, err := New(nil, "x")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, host string) {
		ok := g.Allowed(host)
		name := strings.ToLower(strings.TrimSuffix(hostOnly(host), "."))
		if ok && host != "" && name != "localhost" && !strings.HasSuffix(name, ".localhost") && !isIP(hostOnly(host)) {
			t.Errorf("Allowed(%q) with no names allowed", host)
		}
	})
}

func isIP(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil
}
