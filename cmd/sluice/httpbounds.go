package main

import (
	"errors"
	"flag"
	"log"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/hostguard"
	"github.com/sluicehq/sluice/internal/sparse"
	"github.com/sluicehq/sluice/server"
)

// Defaults of the HTTP bounds.
const (
	defaultHTTPReadTimeout  = 10 * time.Second
	defaultHTTPWriteTimeout = 30 * time.Second
	defaultHTTPIdleTimeout  = 2 * time.Minute
)

// httpBounds are the limits of every HTTP server serve runs (--http-addr,
// --debug-addr, --ref-prometheus-addr): how long a client may take to send
// a request, how long its answer may take, how long a kept-alive
// connection may sit idle, and how large a request body may be. Without
// them a client that sends its body a byte at a time, or opens
// connections and leaves them idle, holds a connection and a goroutine
// for ever.
type httpBounds struct {
	readTimeout  time.Duration
	writeTimeout time.Duration
	idleTimeout  time.Duration
	maxBody      int64
	// hosts guards the browser-facing endpoints of --http-addr (the
	// status page, /v1/counters) against DNS rebinding.
	hosts *hostguard.Guard
}

// allowedHostsSetting names --http-allowed-hosts in the guard's error page.
const allowedHostsSetting = "--http-allowed-hosts (SLUICE_HTTP_ALLOWED_HOSTS)"

func (b *httpBounds) register(fs *flag.FlagSet) {
	fs.DurationVar(&b.readTimeout, "http-read-timeout", defaultHTTPReadTimeout, "HTTP: longest a client may take to send a request, headers and body (a slower one is cut off)")
	fs.DurationVar(&b.writeTimeout, "http-write-timeout", defaultHTTPWriteTimeout, "HTTP: longest from the end of a request's headers to the end of its answer; keep it above --redis-timeout (the debug port has none: its CPU profiles last 30s)")
	fs.DurationVar(&b.idleTimeout, "http-idle-timeout", defaultHTTPIdleTimeout, "HTTP: close a kept-alive connection idle this long")
	fs.Int64Var(&b.maxBody, "http-max-body-bytes", server.DefaultMaxBodyBytes, "HTTP: largest request body (413 above it)")
	fs.Func("http-allowed-hosts", "HTTP: comma-separated host `names` (exact, *.domain, or * for any) the status page and /v1/counters answer besides IP addresses and localhost; other Host headers get 403 (DNS rebinding)", func(s string) error {
		g, err := hostguard.New(strings.Split(s, ","), allowedHostsSetting)
		if err != nil {
			return err
		}
		b.hosts = g
		return nil
	})
}

// browser returns h answering only the Host headers --http-allowed-hosts
// allows: for the endpoints a browser uses.
func (b httpBounds) browser(h http.Handler) http.Handler {
	g := b.hosts
	if g == nil {
		g, _ = hostguard.New(nil, allowedHostsSetting)
	}
	return g.Wrap(h)
}

func (b httpBounds) check() error {
	if b.readTimeout <= 0 || b.writeTimeout <= 0 || b.idleTimeout <= 0 || b.maxBody <= 0 {
		return errors.New("--http-read-timeout, --http-write-timeout, --http-idle-timeout and --http-max-body-bytes must be positive")
	}
	return nil
}

// server returns an http.Server of h within the bounds. writeTimeout
// false leaves answers unbounded in time (the debug port: a CPU profile
// or trace takes as long as it was asked to).
func (b httpBounds) server(h http.Handler, logger *slog.Logger, writeTimeout bool) *http.Server {
	s := &http.Server{Handler: http.MaxBytesHandler(h, b.maxBody),
		ReadHeaderTimeout: min(b.readTimeout, 10*time.Second), ReadTimeout: b.readTimeout, IdleTimeout: b.idleTimeout,
		ErrorLog: log.New(newSparseLog(logger, time.Now), "", 0)}
	if writeTimeout {
		s.WriteTimeout = b.writeTimeout
	}
	return s
}

// httpLogEvery is the least time between two lines of an HTTP server's
// own log: Go's server writes one per connection whose TLS handshake
// fails, so that a client opening connections would write a line each.
const httpLogEvery = 10 * time.Second

// sparseLog is an HTTP server's ErrorLog: it logs a line at WARN at most
// once per httpLogEvery, with the count of the lines not logged since the
// previous one. Safe for concurrent use.
type sparseLog struct {
	logger *slog.Logger
	now    func() time.Time

	mu  sync.Mutex
	log sparse.Log
}

func newSparseLog(logger *slog.Logger, now func() time.Time) *sparseLog {
	return &sparseLog{logger: logger, now: now, log: sparse.Log{Every: httpLogEvery}}
}

func (s *sparseLog) Write(p []byte) (int, error) {
	now := s.now()
	s.mu.Lock()
	quiet, ok := s.log.Due(now)
	s.mu.Unlock()
	if ok {
		s.logger.Warn(strings.TrimSuffix(string(p), "\n"), "lines_not_logged", quiet)
	}
	return len(p), nil
}
