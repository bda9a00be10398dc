package main

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestBinary_HostGuard: over a real socket, the status page, its API and
// /v1/counters refuse a Host that is not an IP address, localhost or an
// allowed name (a DNS rebinding page's), with 403 naming the setting;
// Envoy's and applications' endpoints answer whatever the Host; a name
// allowed by SLUICE_HTTP_ALLOWED_HOSTS is answered.
func TestBinary_HostGuard(t *testing.T) {
	p := startBinary(t, "--config", "testdata/serve")
	port := p.httpAddr[strings.LastIndexByte(p.httpAddr, ':'):]
	do := func(addr, method, path, host, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s Host %s: %v", method, path, host, err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	const rebind = "rebind.attacker.example"
	check := `{"domain":"e2e","key":"path","value":"/guard"}`
	for _, c := range []struct {
		method, path, host, body string
		want                     int
	}{
		{"GET", "/ui/api/overview", rebind + port, "", http.StatusForbidden},
		{"GET", "/ui/api/limits", rebind, "", http.StatusForbidden},
		{"GET", "/", rebind + port, "", http.StatusForbidden},
		{"POST", "/ui/demo/v1/check", rebind, check, http.StatusForbidden},
		{"POST", "/v1/counters", rebind + port, check, http.StatusForbidden},
		{"GET", "/ui/api/overview", "127.0.0.1" + port, "", http.StatusOK},
		{"GET", "/ui/api/overview", "localhost" + port, "", http.StatusOK},
		{"GET", "/ui/api/overview", "[::1]" + port, "", http.StatusOK},
		{"POST", "/v1/counters", "localhost" + port, check, http.StatusOK},
		// Envoy's and applications' endpoints, whatever the Host
		{"POST", "/v1/check", rebind, check, http.StatusOK},
		{"POST", "/json", rebind, `{"domain":"e2e","descriptors":[{"entries":[{"key":"path","value":"/guard"}]}]}`, http.StatusOK},
		{"GET", "/healthcheck", rebind, "", http.StatusOK},
		{"GET", "/metrics", rebind, "", http.StatusOK},
	} {
		code, body := do(p.httpAddr, c.method, c.path, c.host, c.body)
		if code != c.want {
			t.Errorf("%s %s Host %s: %d, want %d\n%s", c.method, c.path, c.host, code, c.want, body)
		}
		if c.want == http.StatusForbidden && !strings.Contains(body, "--http-allowed-hosts (SLUICE_HTTP_ALLOWED_HOSTS)") {
			t.Errorf("%s %s Host %s: body %q, want it to name the setting", c.method, c.path, c.host, body)
		}
	}

	cmd := exec.Command(sluiceBinary(t), "serve", "--config", "testdata/serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "SLUICE_LOG_FORMAT=text", "SLUICE_HTTP_ALLOWED_HOSTS=sluice.example.com, *.svc.cluster.local")
	q := startCmd(t, cmd)
	for _, c := range []struct {
		host string
		want int
	}{
		{"sluice.example.com" + port, http.StatusOK},
		{"sluice.ratelimit.svc.cluster.local", http.StatusOK},
		{rebind, http.StatusForbidden},
	} {
		if code, body := do(q.httpAddr, "GET", "/ui/api/overview", c.host, ""); code != c.want {
			t.Errorf("with SLUICE_HTTP_ALLOWED_HOSTS, Host %s: %d, want %d\n%s", c.host, code, c.want, body)
		}
	}

	out, err := exec.Command(sluiceBinary(t), "serve", "--config", "testdata/serve", "--http-allowed-hosts", "http://x.example").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "http-allowed-hosts") {
		t.Errorf("--http-allowed-hosts with a URL: %v\n%s", err, out)
	}
}
