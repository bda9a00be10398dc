package main

import (
	"bufio"
	"crypto/tls"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/internal/testcert"
)

// startRefRuntime runs `sluice serve` configured by the reference's
// environment alone (testdata/serve as its runtime directory, HTTP on a
// loopback port 0) plus env, and waits until it serves.
func startRefRuntime(t *testing.T, env ...string) *sluiceProc {
	t.Helper()
	root, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(sluiceBinary(t), "serve")
	cmd.Env = append([]string{"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=.", "RUNTIME_APPDIRECTORY=serve",
		"HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "LOG_LEVEL=info"}, env...)
	return startCmd(t, cmd)
}

// TestBinary_GRPCUDS: with GRPC_UDS the binary serves gRPC on a unix
// socket (replacing a stale socket file left by a killed process), a
// gRPC client calls ShouldRateLimit and the health service over it, a
// second process refuses the socket in use, and SIGTERM removes it.
func TestBinary_GRPCUDS(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "rls.sock")
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("the stale socket file: %v", err)
	}

	p := startRefRuntime(t, "GRPC_UDS="+sock)
	if p.grpcAddr != sock {
		t.Errorf("serving gRPC on %q, want %q", p.grpcAddr, sock)
	}
	rls, health := dialRLS(t, "unix://"+sock)
	ctx := testCtx(t)
	if r, err := rls.ShouldRateLimit(ctx, rlsRequest("e2e", "path", "/uds")); err != nil || r.OverallCode != rlspb.RateLimitResponse_OK {
		t.Errorf("ShouldRateLimit over the socket: %v %v", r, err)
	}
	if r, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health over the socket: %v %v", r, err)
	}

	second := exec.Command(sluiceBinary(t), "serve", "--config", "testdata/serve", "--grpc-addr", "unix://"+sock, "--http-addr", "127.0.0.1:0")
	if out, err := second.CombinedOutput(); err == nil || !strings.Contains(string(out), "another process serves on this socket") {
		t.Errorf("a second sluice on the socket in use: %v\n%s", err, out)
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			t.Errorf("exit after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no exit after SIGTERM")
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("the socket after a clean exit: %v, want removed", err)
	}
}

// TestBinary_GRPCSocketMode: --grpc-socket-mode sets the socket's
// permission bits; a regular file at the path is never replaced.
func TestBinary_GRPCSocketMode(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "rls.sock")
	startBinary(t, "--config", "testdata/serve", "--grpc-addr", "unix://"+sock, "--grpc-socket-mode", "0660")
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode %v, want a socket with 0660", fi.Mode())
	}

	file := filepath.Join(dir, "not-a-socket")
	if err := os.WriteFile(file, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sluiceBinary(t), "serve", "--config", "testdata/serve", "--grpc-addr", "unix://"+file, "--http-addr", "127.0.0.1:0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "is not a unix socket") {
		t.Errorf("a regular file as the socket: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile(file); string(b) != "keep" {
		t.Errorf("the regular file was changed: %q", b)
	}
}

// TestBinary_GRPCClientTLSSAN: with the reference's mTLS variables and
// GRPC_CLIENT_TLS_SAN, a client certificate for that name is served and
// one for another name fails the handshake.
func TestBinary_GRPCClientTLSSAN(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t)
	certFile, keyFile := ca.Server(t).WriteFiles(t, dir, "tls")
	caFile := ca.WriteFile(t, dir)
	p := startRefRuntime(t, "GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT="+certFile, "GRPC_SERVER_TLS_KEY="+keyFile,
		"GRPC_CLIENT_TLS_CACERT="+caFile, "GRPC_CLIENT_TLS_SAN=ratelimit-client.example.com")
	ctx := testCtx(t)
	dial := func(clientHost string) (*rlspb.RateLimitResponse, error) {
		cfg := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Peer(t, clientHost).TLS(t)}}
		rls, _ := dialRLS(t, p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		return rls.ShouldRateLimit(ctx, rlsRequest("e2e", "path", "/san"))
	}
	if r, err := dial("ratelimit-client.example.com"); err != nil || r.OverallCode != rlspb.RateLimitResponse_OK {
		t.Errorf("client certificate with the SAN: %v %v", r, err)
	}
	if _, err := dial("someone-else.example.com"); err == nil {
		t.Error("a client certificate with another SAN was served")
	}
}

// TestServe_EnvMogrifiers: USE_DOG_STATSD_MOGRIFIERS and the
// DOG_STATSD_MOGRIFIER_* of envoyproxy/ratelimit's tests become
// --statsd-mogrifier flags in order; what it refuses at start is refused.
func TestServe_EnvMogrifiers(t *testing.T) {
	const pattern = `^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$`
	env := serveEnv{"USE_DOG_STATSD": "true", "USE_STATSD": "false", "USE_DOG_STATSD_MOGRIFIERS": "specific,WILDCARD",
		"DOG_STATSD_MOGRIFIER_SPECIFIC_PATTERN": `^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.foo$`,
		"DOG_STATSD_MOGRIFIER_SPECIFIC_NAME":    "custom.foo",
		"DOG_STATSD_MOGRIFIER_SPECIFIC_TAGS":    "domain:$1,descriptor:$2",
		"DOG_STATSD_MOGRIFIER_WILDCARD_PATTERN": pattern,
		"DOG_STATSD_MOGRIFIER_WILDCARD_NAME":    "ratelimit.service.rate_limit.$3",
		"DOG_STATSD_MOGRIFIER_WILDCARD_TAGS":    "domain:$1,descriptor:$2",
	}
	fs, _, err := parseServe(t, nil, env)
	if err != nil {
		t.Fatal(err)
	}
	want := `custom.foo|domain:$1,descriptor:$2|^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.foo$ ` +
		`ratelimit.service.rate_limit.$3|domain:$1,descriptor:$2|` + pattern
	if got := flagValue(fs, "statsd-mogrifier"); got != want {
		t.Errorf("--statsd-mogrifier = %q, want %q", got, want)
	}
	// A --statsd-mogrifier flag replaces the environment's.
	fs, _, err = parseServe(t, []string{"--statsd-mogrifier", "x||y"}, env)
	if err != nil || flagValue(fs, "statsd-mogrifier") != "x||y" {
		t.Errorf("flag over environment: %q %v", flagValue(fs, "statsd-mogrifier"), err)
	}

	for _, c := range []struct {
		name string
		env  serveEnv
	}{
		{"no settings", serveEnv{}},
		{"empty pattern", serveEnv{"DOG_STATSD_MOGRIFIER_TAG_NAME": "ratelimit.service.rate_limit.$3", "DOG_STATSD_MOGRIFIER_TAG_TAGS": "domain:$1,descriptor:$2"}},
		{"empty name", serveEnv{"DOG_STATSD_MOGRIFIER_TAG_PATTERN": pattern, "DOG_STATSD_MOGRIFIER_TAG_TAGS": "domain:$1,descriptor:$2"}},
		{"empty tag key", serveEnv{"DOG_STATSD_MOGRIFIER_TAG_PATTERN": pattern, "DOG_STATSD_MOGRIFIER_TAG_NAME": "n", "DOG_STATSD_MOGRIFIER_TAG_TAGS": ":5"}},
		{"empty tag value", serveEnv{"DOG_STATSD_MOGRIFIER_TAG_PATTERN": pattern, "DOG_STATSD_MOGRIFIER_TAG_NAME": "n", "DOG_STATSD_MOGRIFIER_TAG_TAGS": "domain:$1,descriptor:"}},
	} {
		c.env["USE_DOG_STATSD"], c.env["USE_DOG_STATSD_MOGRIFIERS"] = "true", "TAG"
		if _, _, err := parseServe(t, nil, c.env); err == nil || !strings.Contains(err.Error(), "USE_DOG_STATSD_MOGRIFIERS: TAG") {
			t.Errorf("%s: %v, want refused", c.name, err)
		}
	}
	// Without USE_DOG_STATSD the mogrifiers are not read.
	if _, _, err := parseServe(t, nil, serveEnv{"USE_DOG_STATSD_MOGRIFIERS": "TAG"}); err != nil {
		t.Errorf("mogrifiers without USE_DOG_STATSD: %v", err)
	}
}

// TestBinary_DogStatsD: the binary started with USE_DOG_STATSD, a
// mogrifier and EXTRA_TAGS sends a call's stats as DogStatsD lines, the
// name shortened and the domain and descriptor as tags, to a real UDP
// socket.
func TestBinary_DogStatsD(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	p := startRefRuntime(t, "USE_DOG_STATSD=true", "USE_STATSD=false", "STATSD_HOST=127.0.0.1",
		"STATSD_PORT="+strconv.Itoa(pc.LocalAddr().(*net.UDPAddr).Port), "STATS_FLUSH_INTERVAL=50ms", "EXTRA_TAGS=cluster:c1",
		"USE_DOG_STATSD_MOGRIFIERS=wildcard",
		`DOG_STATSD_MOGRIFIER_WILDCARD_PATTERN=^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$`,
		"DOG_STATSD_MOGRIFIER_WILDCARD_NAME=ratelimit.service.rate_limit.$3",
		"DOG_STATSD_MOGRIFIER_WILDCARD_TAGS=domain:$1,descriptor:$2")
	rls, _ := dialRLS(t, p.grpcAddr)
	if _, err := rls.ShouldRateLimit(testCtx(t), rlsRequest("e2e", "path", "/dog")); err != nil {
		t.Fatal(err)
	}
	waitStatsd(t, pc, "ratelimit.service.rate_limit.total_hits:1|c|#cluster:c1,descriptor:path,domain:e2e")
}

// TestBinary_StatsdTCP: with USE_STATSD and no STATSD_PROTOCOL the binary
// sends statsd over TCP, gostats' default, to a real TCP listener, and
// counts dropped lines on /metrics.
func TestBinary_StatsdTCP(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	lines := make(chan string, 1024)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for sc := bufio.NewScanner(c); sc.Scan(); {
					lines <- sc.Text()
				}
			}()
		}
	}()
	p := startRefRuntime(t, "USE_STATSD=true", "STATSD_HOST=127.0.0.1", "STATSD_PORT="+strconv.Itoa(lis.Addr().(*net.TCPAddr).Port),
		"STATS_FLUSH_INTERVAL=50ms")
	rls, _ := dialRLS(t, p.grpcAddr)
	if _, err := rls.ShouldRateLimit(testCtx(t), rlsRequest("e2e", "path", "/tcp")); err != nil {
		t.Fatal(err)
	}
	const want = "ratelimit.service.rate_limit.e2e.path.total_hits:1|c"
	deadline := time.After(mustWithin)
	for found := false; !found; {
		select {
		case l := <-lines:
			found = l == want
		case <-deadline:
			t.Fatalf("no line %q over TCP", want)
		}
	}
	if body := httpGet(t, "http://"+p.httpAddr+"/metrics"); !strings.Contains(body, "sluice_statsd_dropped_lines_total 0") {
		t.Error("/metrics has no sluice_statsd_dropped_lines_total 0")
	}
}

// TestServe_StatsNetFlags: the new flags' misuses stop serve with the
// flag's name.
func TestServe_StatsNetFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--statsd-addr", "127.0.0.1:9", "--statsd-protocol", "quic"}, "--statsd-protocol"},
		{[]string{"--statsd-addr", "127.0.0.1:9", "--statsd-mogrifier", "n||x"}, "--statsd-mogrifier needs --statsd-dogstatsd"},
		{[]string{"--statsd-dogstatsd"}, "need --statsd-addr"},
		{[]string{"--statsd-addr", "127.0.0.1:9", "--statsd-dogstatsd", "--statsd-mogrifier", "no-pattern"}, "statsd-mogrifier"},
		{[]string{"--statsd-addr", "127.0.0.1:9", "--statsd-dogstatsd", "--statsd-mogrifier", "n||("}, "statsd-mogrifier"},
		{[]string{"--tls-client-san", "envoy"}, "--tls-client-san needs --tls-client-ca"},
		{[]string{"--grpc-socket-mode", "0600"}, "--grpc-socket-mode needs --grpc-addr unix:///path"},
		{[]string{"--grpc-addr", "unix://", "--grpc-socket-mode", "999"}, "grpc-socket-mode"},
		{[]string{"--grpc-addr", "unix://"}, "no socket path"},
	} {
		args := append([]string{"--config", "testdata/serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, c.args...)
		err := serve(testCtx(t), args, serveEnv{}.get, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error with %q", c.args, err, c.want)
		}
	}
}

// TestBinary_GRPCUDSGrpcurl: grpcurl's health check over the unix socket,
// as a probe in a sidecar would run it.
func TestBinary_GRPCUDSGrpcurl(t *testing.T) {
	grpcurl := grpcurlPath(t)
	sock := filepath.Join(t.TempDir(), "rls.sock")
	startBinary(t, "--config", "testdata/serve", "--grpc-addr", "unix://"+sock)
	out, err := exec.Command(grpcurl, "-plaintext", "-unix", sock, "grpc.health.v1.Health/Check").CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"SERVING"`) {
		t.Errorf("grpcurl health check over the socket: %v\n%s", err, out)
	}
}
