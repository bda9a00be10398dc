package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/testcert"
	"github.com/sluicehq/sluice/store/memcache/memcachetest"
)

func TestServeMemcache_RefEnv(t *testing.T) {
	cases := []struct {
		env  serveEnv
		want map[string]string
	}{
		{serveEnv{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "m1:11211, m2:11211", "MEMCACHE_MAX_IDLE_CONNS": "7", "CACHE_KEY_PREFIX": "rl_"},
			map[string]string{"store": "memcache", "memcache-servers": "m1:11211,m2:11211", "memcache-max-idle-conns": "7", "memcache-key-prefix": "rl_", "redis-key-prefix": "rl_"}},
		{serveEnv{"BACKEND_TYPE": "MEMCACHE", "MEMCACHE_SRV": "_memcache._tcp.mc.svc", "MEMCACHE_SRV_REFRESH": "30s"},
			map[string]string{"store": "memcache", "memcache-srv": "_memcache._tcp.mc.svc", "memcache-srv-refresh": "30s"}},
		{serveEnv{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "m:1", "MEMCACHE_TLS": "true", "MEMCACHE_TLS_CLIENT_CERT": "/c.pem",
			"MEMCACHE_TLS_CLIENT_KEY": "/k.pem", "MEMCACHE_TLS_CACERT": "/ca.pem", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION": "true"},
			map[string]string{"memcache-tls": "true", "memcache-tls-cert": "/c.pem", "memcache-tls-key": "/k.pem", "memcache-tls-ca": "/ca.pem",
				"memcache-tls-skip-hostname-verification": "true"}},
		// The TLS files are read only with MEMCACHE_TLS=true, as the
		// reference reads them.
		{serveEnv{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "m:1", "MEMCACHE_TLS_CACERT": "/ca.pem"},
			map[string]string{"memcache-tls": "false", "memcache-tls-ca": ""}},
	}
	for i, c := range cases {
		fs, _, err := parseServe(t, nil, c.env)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		for name, want := range c.want {
			if got := flagValue(fs, name); got != want {
				t.Errorf("case %d: --%s = %q, want %q", i, name, got, want)
			}
		}
	}
	// Without BACKEND_TYPE=memcache the variables are warned about and
	// not read.
	fs, warnings, err := parseServe(t, nil, serveEnv{"MEMCACHE_HOST_PORT": "m:1"})
	if err != nil || flagValue(fs, "memcache-servers") != "" || flagValue(fs, "store") != "memory" {
		t.Errorf("MEMCACHE_HOST_PORT alone: err %v, servers %q, store %q", err, flagValue(fs, "memcache-servers"), flagValue(fs, "store"))
	}
	if !slices.ContainsFunc(warnings, func(w string) bool { return strings.Contains(w, "MEMCACHE_HOST_PORT is ignored") }) {
		t.Errorf("MEMCACHE_HOST_PORT alone: warnings %q", warnings)
	}
}

func TestServeMemcache_Options(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--memcache-servers", "a:1", "--memcache-srv", "_m._tcp.x"},
		{"--memcache-servers", "a:1", "--memcache-timeout", "0s"},
		{"--memcache-servers", "a:1", "--memcache-max-idle-conns", "0"},
		{"--memcache-srv", "_m._tcp.x", "--memcache-srv-resolver", "no-port"},
		{"--memcache-servers", "a:1", "--memcache-tls-cert", "/c.pem"},
		{"--memcache-servers", "a:1", "--memcache-tls-ca", "/nonexistent.pem"},
	} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		c := newMemcacheConfig(fs).(*memcacheConfig)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if _, err := c.options(); err == nil {
			t.Errorf("%q: accepted", args)
		}
	}
}

// TestServeMemcache_TLSFlags: each --memcache-tls* flag turns TLS on,
// the key one too (so without its certificate it is refused, not
// ignored), and the name is verified or skipped, not both, as Redis's.
func TestServeMemcache_TLSFlags(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t).WriteFile(t, dir)
	for _, c := range []struct {
		args []string
		err  string // "": TLS on
	}{
		{[]string{"--memcache-tls"}, ""},
		{[]string{"--memcache-tls-ca", ca}, ""},
		{[]string{"--memcache-tls-server-name", "memcached.internal"}, ""},
		{[]string{"--memcache-tls-skip-hostname-verification"}, ""},
		{[]string{"--memcache-tls-key", "/k.pem"}, "--memcache-tls-cert and --memcache-tls-key go together"},
		{[]string{"--memcache-tls-cert", "/c.pem"}, "--memcache-tls-cert and --memcache-tls-key go together"},
		{[]string{"--memcache-tls-skip-hostname-verification", "--memcache-tls-server-name", "memcached.internal"},
			"--memcache-tls-skip-hostname-verification and --memcache-tls-server-name: give one"},
	} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		mc := newMemcacheConfig(fs).(*memcacheConfig)
		if err := fs.Parse(append([]string{"--memcache-servers", "a:1"}, c.args...)); err != nil {
			t.Fatal(err)
		}
		o, err := mc.options()
		switch {
		case c.err == "" && (err != nil || o.TLS == nil):
			t.Errorf("%q: err %v, TLS %v; want TLS on", c.args, err, o.TLS != nil)
		case c.err != "" && (err == nil || err.Error() != c.err):
			t.Errorf("%q: err %v, want %q", c.args, err, c.err)
		}
	}
	// No flag: plain TCP.
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	mc := newMemcacheConfig(fs).(*memcacheConfig)
	if err := fs.Parse([]string{"--memcache-servers", "a:1"}); err != nil {
		t.Fatal(err)
	}
	if o, err := mc.options(); err != nil || o.TLS != nil {
		t.Errorf("no TLS flag: err %v, TLS %v; want plain TCP", err, o.TLS != nil)
	}
}

// TestMemcache_TLSSkipHostnameVerification: the name is not checked, the
// chain still is.
func TestMemcache_TLSSkipHostnameVerification(t *testing.T) {
	ca, other, dir := testcert.NewCA(t), testcert.NewCA(t), t.TempDir()
	cert, key := ca.Server(t, "memcached.internal").WriteFiles(t, dir, "server")
	probe := ca.ClientConfig(t)
	probe.ServerName = "memcached.internal"
	srv := memcachetest.StartTLS(t, cert, key, ca.WriteFile(t, dir), probe)
	clientCert, clientKey := ca.Client(t).WriteFiles(t, dir, "client")
	otherDir := t.TempDir()
	for _, c := range []struct {
		ca   string
		skip bool
		ok   bool
	}{
		{ca.WriteFile(t, dir), false, false}, // 127.0.0.1 is not memcached.internal
		{ca.WriteFile(t, dir), true, true},
		{other.WriteFile(t, otherDir), true, false}, // another CA's chain
	} {
		mc := &memcacheConfig{servers: srv.Addr, timeout: 5 * time.Second, maxIdleConns: 1,
			tls: storeTLSFlags{name: "memcache", on: true, ca: c.ca, cert: clientCert, key: clientKey, skipHostname: c.skip}}
		var log bytes.Buffer
		st, err := mc.open(context.Background(), slog.New(slog.NewTextHandler(&log, nil)), nil)
		if (err == nil) != c.ok {
			t.Errorf("CA %s, skip %v: err %v, want ok %v; log %s", c.ca, c.skip, err, c.ok, log.String())
		}
		if err == nil {
			st.closer.Close()
		}
		// The skip is logged at WARN, as Redis's.
		const warning = "level=WARN msg=\"memcache store: --memcache-tls-skip-hostname-verification: memcached's certificate is checked against the CA, " +
			"not against memcached's name: any certificate that CA signed is accepted (prefer --memcache-tls-server-name)\""
		if strings.Contains(log.String(), warning) != c.skip {
			t.Errorf("CA %s, skip %v: log %q, want the warning %v", c.ca, c.skip, log.String(), c.skip)
		}
	}
}

// memcacheBinaryEnv is the environment of a `ratelimit` on loopback
// serving testdata/serve from memcached, as the reference is configured.
func memcacheBinaryEnv(t *testing.T, extra ...string) []string {
	root, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=.", "RUNTIME_APPDIRECTORY=serve",
		"HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "LOG_LEVEL=info", "LOG_FORMAT=text",
		"BACKEND_TYPE=memcache", "SLUICE_MEMCACHE_TIMEOUT=" + storeTimeout}, extra...)
}

func startMemcacheBinary(t *testing.T, env ...string) *sluiceProc {
	t.Helper()
	cmd := exec.Command(sluiceBinary(t), "serve")
	cmd.Env = memcacheBinaryEnv(t, env...)
	return startCmd(t, cmd)
}

// overLimitThird sends three requests on a limit of 2 per minute (a
// remote_address of its own): OK, OK, OVER_LIMIT. Three that straddle a
// minute's end are sent again for the address with a suffix (holds still
// finds it).
func overLimitThird(t *testing.T, p *sluiceProc, addr string) {
	t.Helper()
	rls, _ := dialRLS(t, p.grpcAddr)
	ctx := testCtx(t)
	want := []rlspb.RateLimitResponse_Code{rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OVER_LIMIT}
	for attempt := 0; ; attempt++ {
		value := addr
		if attempt > 0 {
			value = fmt.Sprintf("%s-%d", addr, attempt)
		}
		var got []rlspb.RateLimitResponse_Code
		if inOneMinute(func() {
			for range want {
				resp, err := rls.ShouldRateLimit(ctx, rlsRequest("e2e", "remote_address", value))
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, resp.OverallCode)
			}
		}) || attempt == 3 {
			if !slices.Equal(got, want) {
				t.Fatalf("requests for %s: %v, want %v\n%s", value, got, want, p.log())
			}
			return
		}
	}
}

// inOneMinute runs f and reports whether it began and ended in one
// minute of the wall clock. The servers' windows of a minute begin on the
// minute (their clock is the wall clock): requests on a limit per minute
// that straddle a minute's end are counted in two windows.
func inOneMinute(f func()) bool {
	begin := time.Now()
	f()
	return time.Now().Truncate(time.Minute).Equal(begin.Truncate(time.Minute))
}

// holds reports whether s holds a key that contains part.
func holds(s *memcachetest.Server, part string) bool {
	return slices.ContainsFunc(s.Keys(), func(k string) bool { return strings.Contains(k, part) })
}

// TestBinary_Memcache starts the binary with each of the reference's
// memcached variables (and BACKEND_TYPE=memcache), serving RLS over
// loopback with its counts in memcached.
func TestBinary_Memcache(t *testing.T) {
	t.Run("MEMCACHE_HOST_PORT", func(t *testing.T) {
		m1, m2 := memcachetest.Start(t), memcachetest.Start(t)
		p := startMemcacheBinary(t, "MEMCACHE_HOST_PORT="+m1.Addr+","+m2.Addr, "CACHE_KEY_PREFIX=rl_")
		// A counter's server is its key's hash (the key holds its window's
		// start), so any 8 keys all land on one server 1 time in 128: send
		// counters until both servers hold one, up to 64 (1 in 2^63).
		n := 0
		for ; n < 64 && (n < 8 || len(m1.Keys()) == 0 || len(m2.Keys()) == 0); n++ {
			overLimitThird(t, p, "10.1.0."+strconv.Itoa(n))
		}
		for i, m := range []*memcachetest.Server{m1, m2} {
			keys := m.Keys()
			if len(keys) == 0 {
				t.Errorf("server %d holds no key: %d counters not spread over two servers", i, n)
			}
			for _, k := range keys {
				if !strings.HasPrefix(k, "rl_") {
					t.Errorf("server %d: key %q without CACHE_KEY_PREFIX", i, k)
				}
			}
		}
	})
	t.Run("MEMCACHE_MAX_IDLE_CONNS", func(t *testing.T) {
		m := memcachetest.Start(t)
		p := startMemcacheBinary(t, "MEMCACHE_HOST_PORT="+m.Addr, "MEMCACHE_MAX_IDLE_CONNS=3")
		if !strings.Contains(p.log(), "max_idle_conns=3") {
			t.Errorf("the store's log line lacks max_idle_conns=3:\n%s", p.log())
		}
		overLimitThird(t, p, "10.2.0.1")
	})
	t.Run("MEMCACHE_SRV", func(t *testing.T) {
		m1, m2 := memcachetest.Start(t), memcachetest.Start(t)
		dns := memcachetest.StartDNS(t)
		const name = "_memcache._tcp.sluice.test"
		dns.SetA("mc1.sluice.test", "127.0.0.1")
		dns.SetA("mc2.sluice.test", "127.0.0.1")
		dns.SetSRV(name, net.JoinHostPort("mc1.sluice.test", strconv.Itoa(m1.Port)))
		p := startMemcacheBinary(t, "MEMCACHE_SRV="+name, "MEMCACHE_SRV_REFRESH=20ms", "SLUICE_MEMCACHE_SRV_RESOLVER="+dns.Addr)
		overLimitThird(t, p, "10.3.0.1")
		if !holds(m1, "10.3.0.1") {
			t.Errorf("the SRV target holds no counter: %q", m1.Keys())
		}
		// MEMCACHE_SRV_REFRESH: the binary follows the name to m2.
		dns.SetSRV(name, net.JoinHostPort("mc2.sluice.test", strconv.Itoa(m2.Port)))
		rls, _ := dialRLS(t, p.grpcAddr)
		waitFor(t, func() bool {
			if _, err := rls.ShouldRateLimit(testCtx(t), rlsRequest("e2e", "remote_address", "10.3.0.2")); err != nil {
				t.Fatal(err)
			}
			return holds(m2, "10.3.0.2")
		}, "a counter on the new SRV target")
	})
	t.Run("MEMCACHE_TLS", func(t *testing.T) {
		ca, dir := testcert.NewCA(t), t.TempDir()
		cert, key := ca.Server(t, "memcached.internal").WriteFiles(t, dir, "server")
		probe := ca.ClientConfig(t)
		probe.ServerName = "memcached.internal"
		m := memcachetest.StartTLS(t, cert, key, ca.WriteFile(t, dir), probe)
		clientCert, clientKey := ca.Client(t).WriteFiles(t, dir, "client")
		// MEMCACHE_TLS_CLIENT_CERT, _KEY and _CACERT: memcached requires the
		// client certificate; SKIP_HOSTNAME_VERIFICATION: its certificate
		// names memcached.internal, not 127.0.0.1.
		env := []string{"MEMCACHE_HOST_PORT=" + m.Addr, "MEMCACHE_TLS=true", "MEMCACHE_TLS_CLIENT_CERT=" + clientCert,
			"MEMCACHE_TLS_CLIENT_KEY=" + clientKey, "MEMCACHE_TLS_CACERT=" + ca.WriteFile(t, dir)}
		p := startMemcacheBinary(t, append(env, "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION=true")...)
		overLimitThird(t, p, "10.4.0.1")
		if !holds(m, "10.4.0.1") {
			t.Errorf("memcached holds no counter: %q", m.Keys())
		}
		// Without SKIP_HOSTNAME_VERIFICATION the name does not match.
		cmd := exec.Command(sluiceBinary(t), "serve")
		cmd.Env = memcacheBinaryEnv(t, env...)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "certificate") {
			t.Errorf("TLS with a certificate for another name: %v\n%s", err, out)
		}
	})
}

// TestServeMemcache_FailureAndHealth: with memcached gone, requests get
// the failure mode's answer, and --memcache-health turns health
// NOT_SERVING until memcached is back.
func TestServeMemcache_FailureAndHealth(t *testing.T) {
	m := memcachetest.Start(t)
	for _, mode := range []string{"error", "allow", "deny"} {
		t.Run(mode, func(t *testing.T) {
			grpcAddr, _, _ := startServe(t, nil, "--config", "testdata/serve", "--store", "memcache",
				"--memcache-servers", m.Addr, "--memcache-timeout", "200ms", "--memcache-health", "--store-failure-mode", mode)
			rls, health := dialRLS(t, grpcAddr)
			ctx := testCtx(t)
			serving := func(want healthpb.HealthCheckResponse_ServingStatus) func() bool {
				return func() bool {
					h, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
					return err == nil && h.Status == want
				}
			}
			waitFor(t, serving(healthpb.HealthCheckResponse_SERVING), "SERVING")
			m.Pause()
			waitFor(t, serving(healthpb.HealthCheckResponse_NOT_SERVING), "NOT_SERVING while memcached is paused")
			resp, err := rls.ShouldRateLimit(ctx, rlsRequest("e2e", "remote_address", "10.5.0."+mode))
			switch mode {
			case "error":
				if status.Code(err) != codes.Unavailable {
					t.Errorf("failure mode error: %v %v, want UNAVAILABLE", resp, err)
				}
			case "allow", "deny":
				want := rlspb.RateLimitResponse_OK
				if mode == "deny" {
					want = rlspb.RateLimitResponse_OVER_LIMIT
				}
				if err != nil || resp.OverallCode != want {
					t.Errorf("failure mode %s: %v %v, want %v", mode, resp, err, want)
				}
			}
			m.Resume()
			waitFor(t, serving(healthpb.HealthCheckResponse_SERVING), "SERVING once memcached is back")
		})
	}
}

// TestServe_UIMemcache: the overview describes the memcached store.
func TestServe_UIMemcache(t *testing.T) {
	m := memcachetest.Start(t)
	_, addr, stop := startServe(t, nil, "--config", "../../examples/config", "--store", "memcache", "--memcache-servers", m.Addr, "--memcache-timeout", storeTimeout)
	defer stop()
	o, stats, _ := overview(t, addr)
	if o.Store.Kind != "memcache" || !o.Store.Healthy || stats["servers"] != m.Addr || stats["cas retries"] != "0" {
		t.Errorf("store %+v", o.Store)
	}
}
