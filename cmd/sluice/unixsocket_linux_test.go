package main

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestBinary_GRPCUDSTwoProcesses: two real sluice processes and one
// socket path. The second refuses to start while the first holds the
// path's lock; a socket that replaced the first's at the path (a new
// server's, in a restart) survives the first's exit; once the first has
// gone, a third refuses the path while the new socket accepts, and takes
// it over when that socket is stale.
func TestBinary_GRPCUDSTwoProcesses(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "rls.sock")
	first := startBinary(t, "--config", "testdata/serve", "--grpc-addr", "unix://"+sock, "--grpc-socket-mode", "0660")
	made, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}

	if out, err := serveUnixOnce(t, sock); err == nil || !strings.Contains(out, "another sluice holds "+sock+".lock") {
		t.Errorf("a second sluice while the first holds the lock: %v\n%s", err, out)
	}
	if fi, err := os.Lstat(sock); err != nil || !os.SameFile(fi, made) {
		t.Errorf("the first's socket after the second's attempt: %v, want it unchanged", err)
	}

	// Another server's socket now sits at the path.
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	other, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	other.(*net.UnixListener).SetUnlinkOnClose(false)
	defer other.Close()
	go func() {
		for {
			c, err := other.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	theirs, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-first.done:
		first.done <- err
		if err != nil {
			t.Errorf("the first's exit after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no exit 30 s after SIGTERM")
	}
	if fi, err := os.Lstat(sock); err != nil || !os.SameFile(fi, theirs) {
		t.Fatalf("the other server's socket after the first's exit: %v, want it kept", err)
	}

	if out, err := serveUnixOnce(t, sock); err == nil || !strings.Contains(out, "another process serves on this socket (it accepts connections)") {
		t.Errorf("a sluice on the path another server accepts on: %v\n%s", err, out)
	}
	other.Close()
	startBinary(t, "--config", "testdata/serve", "--grpc-addr", "unix://"+sock)
	rls, _ := dialRLS(t, "unix://"+sock)
	if r, err := rls.ShouldRateLimit(testCtx(t), rlsRequest("e2e", "path", "/uds")); err != nil || r.OverallCode != rlspb.RateLimitResponse_OK {
		t.Errorf("ShouldRateLimit on the socket taken over: %v %v", r, err)
	}
}

// TestBinary_GRPCUDSBusyServerKept: a socket whose server is alive but
// whose accept queue is full (connecting does not succeed, nor is it
// refused) is not taken for stale: sluice refuses the path and the
// socket stays.
func TestBinary_GRPCUDSBusyServerKept(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "rls.sock")
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 1); err != nil {
		t.Fatal(err)
	}
	// Fill the accept queue: connecting then fails with EAGAIN.
	full := false
	for range 64 {
		c, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer syscall.Close(c)
		if err := syscall.Connect(c, &syscall.SockaddrUnix{Name: sock}); errors.Is(err, syscall.EAGAIN) {
			full = true
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if !full {
		t.Fatal("the accept queue did not fill")
	}
	busy, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	out, err := serveUnixOnce(t, sock)
	if err == nil || !strings.Contains(out, "connecting to it failed other than by refusal") {
		t.Errorf("sluice on a busy server's socket: %v\n%s", err, out)
	}
	if fi, err := os.Lstat(sock); err != nil || !os.SameFile(fi, busy) {
		t.Errorf("the busy server's socket: %v, want it kept", err)
	}
}

// serveUnixOnce runs `sluice serve` on the unix socket sock, expected to
// fail at start, and returns its output. One that serves instead is
// killed after a minute.
func serveUnixOnce(t *testing.T, sock string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, sluiceBinary(t), "serve", "--config", "testdata/serve", "--grpc-addr", "unix://"+sock, "--http-addr", "127.0.0.1:0").CombinedOutput()
	return string(out), err
}
