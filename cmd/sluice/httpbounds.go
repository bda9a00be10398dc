package main

import (
	"errors"
	"flag"
	"log/slog"
	"net/http"
	"time"

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
}

func (b *httpBounds) register(fs *flag.FlagSet) {
	fs.DurationVar(&b.readTimeout, "http-read-timeout", defaultHTTPReadTimeout, "HTTP: longest a client may take to send a request, headers and body (a slower one is cut off)")
	fs.DurationVar(&b.writeTimeout, "http-write-timeout", defaultHTTPWriteTimeout, "HTTP: longest from the end of a request's headers to the end of its answer; keep it above --redis-timeout (the debug port has none: its CPU profiles last 30s)")
	fs.DurationVar(&b.idleTimeout, "http-idle-timeout", defaultHTTPIdleTimeout, "HTTP: close a kept-alive connection idle this long")
	fs.Int64Var(&b.maxBody, "http-max-body-bytes", server.DefaultMaxBodyBytes, "HTTP: largest request body (413 above it)")
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
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	if writeTimeout {
		s.WriteTimeout = b.writeTimeout
	}
	return s
}
