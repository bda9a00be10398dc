package main

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/logbuf"
	"github.com/sluicehq/sluice/internal/testcert"
)

// waitClosed reads from conn until the server closes it, and fails if it
// has not within wait: the bounds under test are far shorter, and without
// them the server never closes it.
func waitClosed(t *testing.T, conn net.Conn, wait time.Duration) []byte {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(wait))
	b, err := io.ReadAll(conn)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the server still holds the connection after %v (read %q)", wait, b)
	}
	return b
}

// TestServe_HTTPSlowBodyIsCut: a POST /json whose body stops coming (as one
// that sends a byte every 3s) is cut off at --http-read-timeout, not held.
func TestServe_HTTPSlowBodyIsCut(t *testing.T) {
	_, addr, _ := startServe(t, nil, "--config", "testdata/serve", "--http-read-timeout", "300ms")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"domain":"e2e","descriptors":[{"entries":[{"key":"path","value":"/login"}]}]}`
	fmt.Fprintf(conn, "POST /json HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:10])
	if b := waitClosed(t, conn, 20*time.Second); !strings.HasPrefix(string(b), "HTTP/1.1 408 ") {
		t.Errorf("answer %q, want 408", b)
	}
}

// TestServe_HTTPIdleConnectionIsClosed: a kept-alive connection left idle
// is closed at --http-idle-timeout.
func TestServe_HTTPIdleConnectionIsClosed(t *testing.T) {
	_, addr, _ := startServe(t, nil, "--config", "testdata/serve", "--http-idle-timeout", "300ms")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "GET /healthcheck HTTP/1.1\r\nHost: sluice\r\n\r\n")
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || res.StatusCode != 200 || res.Close {
		t.Fatalf("GET /healthcheck: %v %v, want 200 kept alive", res, err)
	}
	res.Body.Close()
	waitClosed(t, conn, 20*time.Second)
}

// TestServe_HTTPBodyLimitOnEveryEndpoint: --http-max-body-bytes bounds the
// body of every request on the HTTP port, the status page's demo
// included.
func TestServe_HTTPBodyLimitOnEveryEndpoint(t *testing.T) {
	_, addr, _ := startServe(t, nil, "--config", "testdata/serve", "--http-max-body-bytes", "100")
	long := `{"domain":"e2e","descriptors":[{"entries":[{"key":"path","value":"` + strings.Repeat("x", 100) + `"}]}]}`
	for _, path := range []string{"/json", "/v1/check", "/ui/demo/v1/check"} {
		res, err := http.Post("http://"+addr+path, "application/json", strings.NewReader(long))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("POST %s of %d bytes: %s, want 413", path, len(long), res.Status)
		}
	}
}

// TestServe_HTTPNeverCORS: no endpoint of the HTTP port grants a
// cross-origin request, preflight included.
func TestServe_HTTPNeverCORS(t *testing.T) {
	_, addr, _ := startServe(t, nil, "--config", "testdata/serve")
	for _, path := range []string{"/json", "/v1/check", "/healthcheck", "/metrics", "/", "/ui/api/overview", "/ui/demo/v1/check", "/nothing"} {
		for _, method := range []string{"OPTIONS", "GET", "POST"} {
			req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(`{"domain":"e2e","key":"path","value":"/login"}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header = http.Header{"Origin": {"https://evil.example"}, "Access-Control-Request-Method": {"POST"},
				"Access-Control-Request-Headers": {"content-type"}, "Content-Type": {"application/json"}}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			for k := range res.Header {
				if strings.HasPrefix(strings.ToLower(k), "access-control-") {
					t.Errorf("%s %s: %s with %s: %q", method, path, res.Status, k, res.Header.Get(k))
				}
			}
		}
	}
}

func TestServe_HTTPBadBounds(t *testing.T) {
	for _, flag := range []string{"--http-read-timeout", "--http-write-timeout", "--http-idle-timeout", "--http-max-body-bytes"} {
		err := serve(testCtx(t), []string{"--config", "testdata/serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", flag, "0"},
			serveEnv{}.get, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), "must be positive") {
			t.Errorf("%s 0: %v, want an error", flag, err)
		}
	}
}

// TestServe_HTTPServerLogIsSparse: Go's HTTP server logs a line per
// connection whose TLS handshake fails; 50 such connections from a
// client that does not speak TLS write one line, not 50.
func TestServe_HTTPServerLogIsSparse(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := testcert.NewCA(t).Server(t).WriteFiles(t, dir, "tls")
	var logs logbuf.Buffer
	_, addr := startServeLogged(t, nil, &logs, "--config", "testdata/serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--tls-cert", certFile, "--tls-key", keyFile)
	for range 50 {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprint(conn, "GET /healthcheck HTTP/1.1\r\nHost: sluice\r\n\r\n")
		waitClosed(t, conn, 20*time.Second) // answered 400 and closed, the line logged
		conn.Close()
	}
	if n := strings.Count(logs.String(), "TLS handshake error"); n != 1 {
		t.Errorf("50 failed handshakes logged %d lines, want 1:\n%s", n, logs.String())
	}
}

// TestSparseLog: the HTTP servers' log lets one line through per
// httpLogEvery (10 s), with the count of those held back since, and keeps
// the line as Go's server wrote it.
func TestSparseLog(t *testing.T) {
	var out logbuf.Buffer
	now := time.Unix(1_800_000_000, 0)
	s := newSparseLog(slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{ReplaceAttr: dropTime})), func() time.Time { return now })
	steps := []struct {
		at   time.Duration
		want string // the line logged, "" for none
	}{
		{0, `level=WARN msg="http: a" lines_not_logged=0`},
		{time.Second, ""},
		{9 * time.Second, ""},
		{10 * time.Second, `level=WARN msg="http: a" lines_not_logged=2`},
		{19*time.Second + 999*time.Millisecond, ""},
		{time.Minute, `level=WARN msg="http: a" lines_not_logged=1`},
	}
	start := now
	for i, st := range steps {
		now = start.Add(st.at)
		before := out.String()
		if n, err := s.Write([]byte("http: a\n")); n != 8 || err != nil {
			t.Fatalf("step %d: Write = %d, %v", i, n, err)
		}
		if got := strings.TrimSpace(strings.TrimPrefix(out.String(), before)); got != st.want {
			t.Errorf("step %d (at %v): logged %q, want %q", i, st.at, got, st.want)
		}
	}
}

func dropTime(_ []string, a slog.Attr) slog.Attr {
	if a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}
