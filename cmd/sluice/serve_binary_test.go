package main

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/logbuf"
	"github.com/sluicehq/sluice/internal/testcert"
)

var (
	binaryOnce sync.Once
	binaryDir  string
	binaryPath string
	binaryErr  error
)

// TestMain removes the binary built for the end-to-end tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if binaryDir != "" {
		os.RemoveAll(binaryDir)
	}
	os.Exit(code)
}

// sluiceBinary builds the real binary once per test run.
func sluiceBinary(t *testing.T) string {
	t.Helper()
	binaryOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-bin")
		if err != nil {
			binaryErr = err
			return
		}
		binaryDir, binaryPath = dir, filepath.Join(dir, "sluice")
		out, err := exec.Command("go", "build", "-o", binaryPath, ".").CombinedOutput()
		if err != nil {
			binaryErr = errors.New(string(out))
		}
	})
	if binaryErr != nil {
		t.Fatalf("go build: %v", binaryErr)
	}
	return binaryPath
}

// servingAddrs returns the gRPC and HTTP addresses in the "serving" line
// of a `sluice serve` log (text format), if the log has it yet. The tests
// start sluice on port 0 and read its ports from there: a port probed free
// and then closed can be taken, before the child binds it, by any test
// running in parallel.
func servingAddrs(log string) (grpcAddr, httpAddr string, ok bool) {
	for line := range strings.Lines(log) {
		if !strings.Contains(line, " msg=serving ") {
			continue
		}
		for f := range strings.FieldsSeq(line) {
			if v, found := strings.CutPrefix(f, "grpc="); found {
				grpcAddr = v
			} else if v, found := strings.CutPrefix(f, "http="); found {
				httpAddr = v
			}
		}
		return grpcAddr, httpAddr, grpcAddr != "" && httpAddr != ""
	}
	return "", "", false
}

// sluiceProc is a running `sluice serve`.
type sluiceProc struct {
	cmd      *exec.Cmd
	grpcAddr string
	httpAddr string
	stderr   logbuf.Buffer
	done     chan error
}

// startBinary runs `sluice serve` with args on loopback port 0 and waits
// until it logs the ports it serves on.
func startBinary(t *testing.T, args ...string) *sluiceProc {
	t.Helper()
	args = append([]string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, args...)
	cmd := exec.Command(sluiceBinary(t), args...)
	cmd.Env = append(os.Environ(), "SLUICE_LOG_LEVEL=info", "SLUICE_LOG_FORMAT=text")
	return startCmd(t, cmd)
}

// startCmd starts cmd, a sluice serving on port 0 with a text log, and
// waits until it logs the ports it serves on. The process is killed when
// the test ends.
func startCmd(t *testing.T, cmd *exec.Cmd) *sluiceProc {
	t.Helper()
	p := &sluiceProc{cmd: cmd, done: make(chan error, 1)}
	p.cmd.Stderr = &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s stderr:\n%s", filepath.Base(p.cmd.Path), p.log())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		var ok bool
		if p.grpcAddr, p.httpAddr, ok = servingAddrs(p.log()); ok {
			return p
		}
		select {
		case err := <-p.done:
			p.done <- err // for the cleanup
			t.Fatalf("%s exited before serving: %v\n%s", filepath.Base(p.cmd.Path), err, p.log())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not serve:\n%s", filepath.Base(p.cmd.Path), p.log())
		}
	}
}

func (p *sluiceProc) log() string { return p.stderr.String() }

// grpcurlPath finds grpcurl in the repository's .bin/ (make test installs
// it there) or on PATH.
func grpcurlPath(t *testing.T) string {
	t.Helper()
	if p, err := filepath.Abs("../../.bin/grpcurl"); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("grpcurl"); err == nil {
		return p
	}
	t.Skip("grpcurl not found in .bin/ or on PATH: run `make test` (it installs the pinned grpcurl) or `make tools`")
	return ""
}

// TestBinary_Grpcurl: reflection lets grpcurl list, describe and call
// ShouldRateLimit with no proto files.
func TestBinary_Grpcurl(t *testing.T) {
	grpcurl := grpcurlPath(t)
	p := startBinary(t, "--config", "testdata/serve")
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(grpcurl, append([]string{"-plaintext"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("grpcurl %q: %v\n%s", args, err, out)
		}
		return string(out)
	}
	list := run(p.grpcAddr, "list")
	for _, s := range []string{"envoy.service.ratelimit.v3.RateLimitService", "sluice.v1.RateLimiter", "grpc.health.v1.Health"} {
		if !strings.Contains(list, s) {
			t.Errorf("grpcurl list lacks %s:\n%s", s, list)
		}
	}
	desc := run(p.grpcAddr, "describe", "envoy.service.ratelimit.v3.RateLimitService")
	if !strings.Contains(desc, "rpc ShouldRateLimit") {
		t.Errorf("grpcurl describe:\n%s", desc)
	}
	out := run("-d", `{"domain":"e2e","descriptors":[{"entries":[{"key":"path","value":"/login"}]}]}`,
		p.grpcAddr, "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
	var resp struct {
		OverallCode string `json:"overallCode"`
		Statuses    []struct {
			CurrentLimit struct{ Name string } `json:"currentLimit"`
		} `json:"statuses"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil || resp.OverallCode != "OK" || len(resp.Statuses) != 1 || resp.Statuses[0].CurrentLimit.Name != "login" {
		t.Errorf("grpcurl ShouldRateLimit: %v\n%s", err, out)
	}
}

// TestBinary_SIGTERMDrain: on SIGTERM health flips to NOT_SERVING, calls
// under way finish, and the process exits 0 well within --drain-timeout.
func TestBinary_SIGTERMDrain(t *testing.T) {
	p := startBinary(t, "--config", "testdata/serve", "--drain-timeout", "20s")
	rls, hc := dialRLS(t, p.grpcAddr)
	ctx := testCtx(t)
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health before SIGTERM: %v %v", r, err)
	}

	// Clients call continuously through the signal.
	var stop atomic.Bool
	var ok, refused atomic.Int64
	var bad atomic.Value
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for !stop.Load() {
				_, err := rls.ShouldRateLimit(ctx, rlsRequest("e2e", "path", "/drain"))
				switch status.Code(err) {
				case codes.OK:
					ok.Add(1)
				case codes.Unavailable:
					// refused after the server stopped accepting
					refused.Add(1)
				default:
					bad.CompareAndSwap(nil, err)
				}
			}
		})
	}
	for ok.Load() < 50 {
		time.Sleep(time.Millisecond)
	}
	sent := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The health stream sees NOT_SERVING, then ends.
	for {
		r, err := w.Recv()
		if err != nil {
			t.Fatalf("health watch ended before NOT_SERVING: %v", err)
		}
		if r.Status == healthpb.HealthCheckResponse_NOT_SERVING {
			break
		}
	}
	for {
		r, err := w.Recv()
		if err != nil {
			break
		}
		if r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("health watch after NOT_SERVING: %v", r.Status)
		}
	}
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			t.Errorf("exit after SIGTERM: %v, want 0", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no exit 15 s after SIGTERM")
	}
	stop.Store(true)
	wg.Wait()
	if e := bad.Load(); e != nil {
		t.Errorf("a call failed other than by being refused: %v", e)
	}
	if !strings.Contains(p.log(), "draining") || !strings.Contains(p.log(), "stopped") {
		t.Errorf("log lacks draining/stopped:\n%s", p.log())
	}
	t.Logf("%d calls OK, %d refused after the stop; exit %v after SIGTERM", ok.Load(), refused.Load(), time.Since(sent))
}

// TestBinary_MTLS serves gRPC and HTTP over TLS with client certificates
// required, from certificates generated here.
func TestBinary_MTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t)
	certFile, keyFile := ca.Server(t).WriteFiles(t, dir, "tls")
	caFile := ca.WriteFile(t, dir)
	p := startBinary(t, "--config", "testdata/serve", "--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", caFile)

	roots := ca.Pool()
	withCert := &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{ca.Client(t).TLS(t)}}
	ctx := testCtx(t)

	rls, _ := dialRLS(t, p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(withCert)))
	if r, err := rls.ShouldRateLimit(ctx, rlsRequest("e2e", "path", "/tls")); err != nil || r.OverallCode != rlspb.RateLimitResponse_OK {
		t.Errorf("mTLS gRPC: %v %v", r, err)
	}
	noCert, _ := dialRLS(t, p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots})))
	if _, err := noCert.ShouldRateLimit(ctx, rlsRequest("e2e", "path", "/tls")); err == nil {
		t.Error("gRPC without a client certificate was served")
	}

	client := &http.Client{Transport: &http.Transport{TLSClientConfig: withCert}, Timeout: 10 * time.Second}
	res, err := client.Get("https://" + p.httpAddr + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Errorf("HTTPS /healthcheck: %s", res.Status)
	}
	plain := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}, Timeout: 10 * time.Second}
	if res, err := plain.Get("https://" + p.httpAddr + "/healthcheck"); err == nil {
		res.Body.Close()
		t.Error("HTTPS without a client certificate was served")
	}
}

// TestBinary_InstalledAsRatelimit: the binary under the reference's name
// (the image's /bin/ratelimit is a symlink to sluice) serves with no
// arguments, configured from the reference's environment alone, and still
// runs a subcommand when given one.
func TestBinary_InstalledAsRatelimit(t *testing.T) {
	bin, err := filepath.Abs(sluiceBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ratelimit := filepath.Join(dir, "ratelimit")
	if err := os.Symlink(bin, ratelimit); err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(ratelimit)
	// testdata/serve/limits.yaml as RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY.
	cmd.Env = []string{"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=.", "RUNTIME_APPDIRECTORY=serve",
		"HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "LOG_LEVEL=info"}
	p := startCmd(t, cmd)
	if body := httpGet(t, "http://"+p.httpAddr+"/healthcheck"); !strings.Contains(body, "OK") {
		t.Errorf("/healthcheck: %q", body)
	}

	out, err := exec.Command(ratelimit, "check", "--config", "testdata/serve").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "e2e") {
		t.Errorf("ratelimit check: %v\n%s", err, out)
	}
}

// TestBinary_RatelimitIgnoresArguments: Envoy AI Gateway's QuotaPolicy
// Deployment runs /bin/ratelimit with an argument of its own; the
// reference reads only its environment and ignores it, and so does the
// binary under that name: it serves, and names the flag in one warning
// that does not show its value. `sluice serve` still refuses it.
func TestBinary_RatelimitIgnoresArguments(t *testing.T) {
	bin, err := filepath.Abs(sluiceBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	ratelimit := filepath.Join(t.TempDir(), "ratelimit")
	if err := os.Symlink(bin, ratelimit); err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	const host = "envoy-ai-gateway-ratelimit.envoy-gateway-system"
	cmd := exec.Command(ratelimit, "--quotaRateLimitServiceHost="+host)
	cmd.Env = []string{"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=.", "RUNTIME_APPDIRECTORY=serve",
		"HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "LOG_LEVEL=info"}
	p := startCmd(t, cmd)
	rls, _ := dialRLS(t, p.grpcAddr)
	if r, err := rls.ShouldRateLimit(testCtx(t), rlsRequest("e2e", "remote_address", "10.9.9.9")); err != nil ||
		r.OverallCode != rlspb.RateLimitResponse_OK || r.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() != 2 {
		t.Errorf("ShouldRateLimit: %v %v", r, err)
	}
	var warning string
	for line := range strings.Lines(p.log()) {
		if strings.Contains(line, "arguments ignored") {
			warning = line
		}
	}
	if !strings.Contains(warning, "level=WARN") || !strings.Contains(warning, "--quotaRateLimitServiceHost") {
		t.Errorf("no warning naming the flag:\n%s", p.log())
	}
	if strings.Contains(p.log(), host) {
		t.Errorf("the log shows the flag's value:\n%s", p.log())
	}

	out, err := exec.Command(bin, "serve", "--quotaRateLimitServiceHost="+host).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "flag provided but not defined") {
		t.Errorf("sluice serve with the argument: %v\n%s", err, out)
	}
}
