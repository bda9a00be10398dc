package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/logbuf"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

const countersTestLimits = `
domain: shop
descriptors:
  - key: user
    rate_limits:
      - {unit: day, requests_per_unit: 2, name: daily}
      - {unit: day, requests_per_unit: 10, name: daily_cap}
  - key: team
    rate_limit: {unit: day, requests_per_unit: 5}
`

const countersTestToken = "Xq9vT7-admin-token-0123456789abcdef"

// countersServe starts serve with the counters config, resets on, on the
// given store flags; it returns the HTTP address, the token file and the
// logs.
func countersServe(t *testing.T, storeArgs ...string) (string, string, *logbuf.Buffer) {
	t.Helper()
	dir := t.TempDir()
	cfg, tok := filepath.Join(dir, "limits.yaml"), filepath.Join(dir, "token")
	if err := os.WriteFile(cfg, []byte(countersTestLimits), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tok, []byte(countersTestToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &logbuf.Buffer{}
	args := append([]string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--config", cfg,
		"--admin-token-file", tok}, storeArgs...)
	_, httpAddr := startServeLogged(t, nil, logs, args...)
	return httpAddr, tok, logs
}

func runCountersCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := runCounters(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestCountersCommand: `sluice counters get` shows what checks used and
// consumes nothing; `reset` needs the token file, zeroes the counters,
// is logged without the value or the token and counted on /metrics. On
// the memory store and on Redis.
func TestCountersCommand(t *testing.T) {
	stores := map[string][]string{"memory": nil}
	if !testing.Short() {
		srv := redistest.Start(t)
		stores["redis"] = []string{"--store", "redis", "--redis-url", "redis://" + srv.Addr, "--redis-key-prefix", "counters-test:", "--redis-timeout", storeTimeout}
	}
	for name, storeArgs := range stores {
		t.Run(name, func(t *testing.T) {
			addr, tok, logs := countersServe(t, storeArgs...)
			for range 3 {
				res, err := http.Post("http://"+addr+"/v1/check", "application/json", strings.NewReader(`{"domain":"shop","key":"user","value":"alice"}`))
				if err != nil {
					t.Fatal(err)
				}
				res.Body.Close()
			}
			get := []string{"get", "--addr", addr, "--domain", "shop", "--descriptor", "user=alice", "--descriptor", "user=bob,x=y"}
			var out string
			for range 3 {
				code, o, errOut := runCountersCmd(t, get...)
				if code != 0 {
					t.Fatalf("get: exit %d: %s", code, errOut)
				}
				out = o
			}
			for _, want := range []string{"user=alice: shop.user[0]", "daily ", "2/2", "daily_cap", "2/10", "user=bob,x=y: no rule matches"} {
				if !strings.Contains(out, want) {
					t.Errorf("get's output lacks %q:\n%s", want, out)
				}
			}
			if code, _, errOut := runCountersCmd(t, "reset", "--addr", addr, "--domain", "shop", "--descriptor", "user=alice"); code != 2 || !strings.Contains(errOut, "--token-file") {
				t.Errorf("reset without --token-file: exit %d %q, want 2 and a usage error", code, errOut)
			}
			wrong := filepath.Join(t.TempDir(), "wrong")
			os.WriteFile(wrong, []byte("not-the-token-at-all-0123456789"), 0o600)
			if code, _, errOut := runCountersCmd(t, "reset", "--addr", addr, "--domain", "shop", "--descriptor", "user=alice", "--token-file", wrong); code != 2 || !strings.Contains(errOut, "401") {
				t.Errorf("reset with a wrong token: exit %d %q, want 2 and 401", code, errOut)
			}
			code, out, errOut := runCountersCmd(t, "reset", "--addr", addr, "--domain", "shop", "--descriptor", "user=alice", "--token-file", tok)
			if code != 0 || !strings.Contains(out, "0/2") || !strings.Contains(out, "0/10") {
				t.Fatalf("reset: exit %d %q %q, want the counters empty", code, out, errOut)
			}
			if _, out, _ := runCountersCmd(t, get...); !strings.Contains(out, "0/2") {
				t.Errorf("get after the reset:\n%s\nwant 0/2", out)
			}
			l := logs.String()
			if !strings.Contains(l, "counters reset") || !strings.Contains(l, "rule=user[0]") {
				t.Errorf("no reset line in the log:\n%s", l)
			}
			if strings.Contains(l, "alice") || strings.Contains(l, countersTestToken[:12]) {
				t.Errorf("the log names the value or the token:\n%s", l)
			}
			res, err := http.Get("http://" + addr + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			for _, want := range []string{`sluice_counter_resets_total{domain="shop",rule="user[0]"} 1`, `sluice_counter_resets_total{domain="shop",rule="user[1]"} 1`} {
				if !strings.Contains(string(b), want) {
					t.Errorf("/metrics lacks %s", want)
				}
			}
		})
	}
}

// TestCountersCommand_ResetsOff: without --admin-token-file a reset is
// refused (403), and the command says so.
func TestCountersCommand_ResetsOff(t *testing.T) {
	_, httpAddr, _ := startServe(t, nil, "--config", "testdata/serve")
	tok := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tok, []byte(countersTestToken), 0o600)
	code, _, errOut := runCountersCmd(t, "reset", "--addr", httpAddr, "--domain", "e2e", "--descriptor", "path=/login", "--token-file", tok)
	if code != 2 || !strings.Contains(errOut, "403") || !strings.Contains(errOut, "--admin-token-file") {
		t.Errorf("reset while off: exit %d %q, want 2, 403 and the flag to set", code, errOut)
	}
	if code, out, errOut := runCountersCmd(t, "get", "--addr", "http://"+httpAddr, "--domain", "e2e", "--descriptor", "path=/login"); code != 0 || !strings.Contains(out, "login") {
		t.Errorf("get with a URL: exit %d %q %q", code, out, errOut)
	}
	for _, args := range [][]string{{}, {"peek"}, {"get"}, {"get", "--domain", "d"}, {"get", "--descriptor", "a=b"}, {"get", "--domain", "d", "--descriptor", "nokey"}} {
		if code, _, _ := runCountersCmd(t, args...); code != 2 {
			t.Errorf("counters %q: exit %d, want 2", args, code)
		}
	}
}

// TestServe_AdminTokenFile: SLUICE_ADMIN_TOKEN_FILE turns resets on as
// the flag does, and a token file that is missing or too short stops
// serve at start, naming the flag.
func TestServe_AdminTokenFile(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte(countersTestToken), 0o600)
	_, httpAddr, _ := startServe(t, serveEnv{"SLUICE_ADMIN_TOKEN_FILE": tok}, "--config", "testdata/serve")
	if code, out, errOut := runCountersCmd(t, "reset", "--addr", httpAddr, "--domain", "e2e", "--descriptor", "path=/login", "--token-file", tok); code != 0 || !strings.Contains(out, "0/1") {
		t.Errorf("reset with SLUICE_ADMIN_TOKEN_FILE: exit %d %q %q", code, out, errOut)
	}
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("tooshort"), 0o600)
	for _, f := range []string{filepath.Join(dir, "missing"), short} {
		err := serve(testCtx(t), []string{"--config", "testdata/serve", "--admin-token-file", f, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"},
			serveEnv{}.get, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), "--admin-token-file") {
			t.Errorf("--admin-token-file %s: %v, want an error naming the flag", f, err)
		}
	}
}

// TestServe_CounterResetsDroppedOnReload: the series of
// sluice_counter_resets_total are bounded by the config in force (issue
// 23): a reload without the reset rule drops them from /metrics, and a
// rule that stays keeps its count.
func TestServe_CounterResetsDroppedOnReload(t *testing.T) {
	addr, tok, _ := countersServe(t)
	for _, d := range []string{"user=alice", "team=a"} {
		if code, _, errOut := runCountersCmd(t, "reset", "--addr", addr, "--domain", "shop", "--descriptor", d, "--token-file", tok); code != 0 {
			t.Fatalf("reset %s: exit %d %q", d, code, errOut)
		}
	}
	for _, want := range []string{`sluice_counter_resets_total{domain="shop",rule="user[0]"} 1`, `sluice_counter_resets_total{domain="shop",rule="team"} 1`} {
		if m := httpGet(t, "http://"+addr+"/metrics"); !strings.Contains(m, want) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}
	cfg := filepath.Join(filepath.Dir(tok), "limits.yaml")
	if err := os.WriteFile(cfg, []byte("domain: shop\ndescriptors:\n  - {key: team, rate_limit: {unit: day, requests_per_unit: 5}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, mustWithin, "config reloaded", func() bool {
		return strings.Contains(httpGet(t, "http://"+addr+"/metrics"), `sluice_config_reloads_total{result="success"} 2`)
	})
	m := httpGet(t, "http://"+addr+"/metrics")
	if strings.Contains(m, `rule="user[0]"`) || strings.Contains(m, `rule="user[1]"`) {
		t.Errorf("/metrics keeps the reset series of rules that left the config:\n%s", grepLines(m, "sluice_counter_resets_total"))
	}
	if !strings.Contains(m, `sluice_counter_resets_total{domain="shop",rule="team"} 1`) {
		t.Errorf("the rule that stays lost its count:\n%s", grepLines(m, "sluice_counter_resets_total"))
	}
}

// grepLines is the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestServe_ResetsOverPlainHTTPWarn: resets on with HTTP in plain text
// (no --tls-cert) are warned about at start: the admin token would cross
// the network in the clear.
func TestServe_ResetsOverPlainHTTPWarn(t *testing.T) {
	_, _, logs := countersServe(t)
	if l := logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "counter resets over plain HTTP") {
		t.Errorf("logs %q, want a WARN about resets over plain HTTP", l)
	}
}

// TestServe_RefundsFlag: --refunds takes allow, token or deny; token
// needs the admin token file.
func TestServe_RefundsFlag(t *testing.T) {
	base := []string{"--config", "testdata/serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--refunds", "maybe"}, "--refunds"},
		{[]string{"--refunds", "token"}, "--admin-token-file"},
	} {
		err := serve(testCtx(t), append(slices.Clone(base), c.args...), serveEnv(nil).get, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error naming %s", c.args, err, c.want)
		}
	}
}
