package main

import (
	"crypto/tls"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
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

// startRefEnv runs `sluice serve` configured by the reference's
// environment alone (testdata/serve as its runtime directory, HTTP on a
// loopback port 0) plus env, and waits until it serves.
func startRefEnv(t *testing.T, env ...string) *sluiceProc {
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

	p := startRefEnv(t, "GRPC_UDS="+sock)
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
	p := startRefEnv(t, "GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT="+certFile, "GRPC_SERVER_TLS_KEY="+keyFile,
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
