package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/testcert"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store/memory"
)

const queryLimits = `
domain: api
descriptors:
  - key: user
    rate_limit: {name: per-user, unit: minute, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
`

type queryTable struct{ t *config.Table }

// queryClock is the in-process servers' clock: it stands still 30 s into
// a minute, so that the asks of a test, however slow, all fall in one
// window of the per-minute rule.
type queryClock struct{}

func (queryClock) Now() int64 { return time.Date(2026, 1, 2, 3, 4, 30, 0, time.UTC).UnixNano() }

func (q queryTable) Current() *config.Table { return q.t }

// querySluice runs a real Sluice on a loopback port (TLS when tlsCfg is
// set) and returns its address.
func querySluice(t *testing.T, tlsCfg *tls.Config) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(file, []byte(queryLimits), 0o644); err != nil {
		t.Fatal(err)
	}
	tbl, err := config.Load(file, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	lim := limiter.New(queryTable{tbl}, memory.New(memory.Options{}), limiter.Options{Clock: queryClock{}})
	s := server.NewGRPC(lim, server.NewHealth(), server.GRPCOptions{TLS: tlsCfg})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); s.Serve(ln) }()
	t.Cleanup(func() { s.Stop(); <-done })
	return ln.Addr().String()
}

// queryTimeout is the tests' --timeout for sluice query: a call that must
// be answered gets all the time a busy machine needs (the default of 1 s
// is not always enough with -race); a call that must fail fails before it.
const queryTimeout = "60s"

func runQueryCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	code = Main(ctx, append([]string{"query", "--timeout", queryTimeout}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestQuery_TableAndDrain(t *testing.T) {
	addr := querySluice(t, nil)
	code, out, errOut := runQueryCmd(t, "--addr", addr, "--domain", "api",
		"--descriptor", "user=alice", "--descriptor", "free=x", "--repeat", "3")
	if code != 1 {
		t.Fatalf("exit %d, want 1 (over the limit); stderr: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := []struct{ line, fields string }{
		{"#1 OK", ""},
		{"", "DESCRIPTOR CODE LIMIT REMAINING RESET RULE"},
		{"", "user=alice OK 2/minute 1"},
		{"", "free=x OK - - - -"},
		{"#2 OK", ""},
		{"", "DESCRIPTOR CODE LIMIT REMAINING RESET RULE"},
		{"", "user=alice OK 2/minute 0"},
		{"", "free=x OK - - - -"},
		{"#3 OVER_LIMIT", ""},
		{"", "DESCRIPTOR CODE LIMIT REMAINING RESET RULE"},
		{"", "user=alice OVER_LIMIT 2/minute 0"},
		{"", "free=x OK - - - -"},
	}
	if len(lines) != len(want) {
		t.Fatalf("output:\n%s\nwant %d lines", out, len(want))
	}
	for i, w := range want {
		got := strings.Join(strings.Fields(lines[i]), " ")
		if w.line != "" && got != w.line || w.fields != "" && !strings.HasPrefix(got, w.fields) {
			t.Fatalf("line %d: %q, want %q%q\n%s", i+1, got, w.line, w.fields, out)
		}
	}
	f := strings.Fields(lines[2])
	if len(f) != 6 || f[5] != "per-user" {
		t.Fatalf("limited row %q: want six columns ending in the rule name", lines[2])
	}
	if reset, err := time.ParseDuration(f[4]); err != nil || reset < time.Second || reset > time.Minute {
		t.Fatalf("limited row %q: reset %q, want 1s..1m", lines[2], f[4])
	}
}

func TestQuery_OKExitsZero(t *testing.T) {
	addr := querySluice(t, nil)
	if code, out, errOut := runQueryCmd(t, "--addr", addr, "--domain", "api", "--descriptor", "user=bob"); code != 0 || !strings.HasPrefix(out, "OK\n") {
		t.Fatalf("exit %d, output %q, stderr %q; want 0 and OK", code, out, errOut)
	}
}

func TestQuery_JSON(t *testing.T) {
	addr := querySluice(t, nil)
	code, out, errOut := runQueryCmd(t, "--addr", addr, "--domain", "api", "--descriptor", "user=carol,extra=1",
		"--descriptor", "user=dave", "--hits", "2", "--json", "--repeat", "2")
	if code != 1 {
		t.Fatalf("exit %d, want 1; stderr %s", code, errOut)
	}
	var answers []queryJSON
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var a queryJSON
		if err := dec.Decode(&a); err != nil {
			t.Fatalf("%v in %s", err, out)
		}
		answers = append(answers, a)
	}
	if len(answers) != 2 || answers[0].Code != "OK" || answers[1].Code != "OVER_LIMIT" {
		t.Fatalf("answers %+v", answers)
	}
	first := answers[0].Statuses
	// user=carol,extra=1 matches no rule; user=dave takes 2 of 2.
	if first[0].Descriptor != "user=carol,extra=1" || first[0].Limit != 0 || first[0].Remaining != nil ||
		first[1].Rule != "per-user" || first[1].Limit != 2 || first[1].Unit != "minute" || *first[1].Remaining != 0 ||
		*first[1].ResetSeconds < 1 || *first[1].ResetSeconds > 60 {
		t.Fatalf("first answer %+v", first)
	}
	if s := answers[1].Statuses[1]; s.Code != "OVER_LIMIT" {
		t.Fatalf("second answer %+v", answers[1])
	}
}

func TestQuery_Errors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	for _, tc := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"--descriptor", "a=b"}, "--domain is required"},
		{[]string{"--domain", "api"}, "at least one --descriptor"},
		{[]string{"--domain", "api", "--descriptor", "novalue"}, "want key=value"},
		{[]string{"--domain", "api", "--descriptor", "=v"}, "want key=value"},
		{[]string{"--domain", "api", "--descriptor", "a=b", "--hits", "0"}, "--hits"},
		{[]string{"--domain", "api", "--descriptor", "a=b", "--repeat", "0"}, "--repeat"},
		{[]string{"--domain", "api", "--descriptor", "a=b", "extra"}, "unexpected argument"},
		{[]string{"--domain", "api", "--descriptor", "a=b", "--tls-cert", "c.pem"}, "go together"},
		{[]string{"--domain", "api", "--descriptor", "a=b", "--addr", dead}, dead},
	} {
		code, _, errOut := runQueryCmd(t, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.stderr) {
			t.Errorf("query %v: exit %d, stderr %q; want 2 mentioning %q", tc.args, code, errOut, tc.stderr)
		}
	}
}

func TestQuery_TLS(t *testing.T) {
	// The certificate names only sluice.test, so --tls-server-name is needed.
	certs := testcert.NewCA(t)
	ca := certs.WriteFile(t, t.TempDir())
	addr := querySluice(t, &tls.Config{Certificates: []tls.Certificate{certs.Server(t, "sluice.test").TLS(t)}, MinVersion: tls.VersionTLS12})
	if code, out, errOut := runQueryCmd(t, "--addr", addr, "--domain", "api", "--descriptor", "user=erin",
		"--tls-ca", ca, "--tls-server-name", "sluice.test"); code != 0 || !strings.HasPrefix(out, "OK") {
		t.Fatalf("over TLS: exit %d, %q, %q", code, out, errOut)
	}
	// Without the CA the server is not trusted; in plaintext it cannot be spoken to.
	for _, args := range [][]string{{"--tls"}, {}} {
		args = append([]string{"--addr", addr, "--domain", "api", "--descriptor", "user=erin"}, args...)
		if code, _, _ := runQueryCmd(t, args...); code != 2 {
			t.Fatalf("query %v: exit %d, want 2", args, code)
		}
	}
}

// The real binaries on both ends: `sluice serve` and `sluice query`. The
// server's clock is the wall clock and the rule counts per minute: an
// attempt whose three asks straddle a minute's end is done again with
// another user.
func TestQuery_Binary(t *testing.T) {
	limits := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(limits, []byte(queryLimits), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startBinary(t, "--config", limits)
	for attempt := range 5 {
		user := fmt.Sprintf("user=ivy-%d", attempt)
		var errs []string
		if !inOneMinute(func() {
			for i, want := range []struct {
				code      int
				remaining uint64
			}{{0, 1}, {0, 0}, {1, 0}} {
				cmd := exec.Command(sluiceBinary(t), "query", "--addr", p.grpcAddr, "--domain", "api", "--descriptor", user, "--json", "--timeout", queryTimeout)
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				out, err := cmd.Output()
				code := 0
				var exit *exec.ExitError
				if errors.As(err, &exit) {
					code = exit.ExitCode()
				} else if err != nil {
					t.Fatal(err)
				}
				var a queryJSON
				if jerr := json.Unmarshal(out, &a); code != want.code || jerr != nil || len(a.Statuses) != 1 ||
					a.Statuses[0].Remaining == nil || *a.Statuses[0].Remaining != want.remaining {
					errs = append(errs, fmt.Sprintf("%s: query %d: exit %d, output %s, stderr %s; want exit %d, remaining %d",
						user, i+1, code, out, stderr.Bytes(), want.code, want.remaining))
				}
			}
		}) {
			t.Logf("attempt %d straddled a minute's end: again", attempt)
			continue
		}
		for _, e := range errs {
			t.Error(e)
		}
		return
	}
	t.Fatal("no attempt fitted in one minute")
}
