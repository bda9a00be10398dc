package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/server"
)

// serveFlags are serve's own settings. Backends and extensions add theirs
// to the same flag set.
type serveFlags struct {
	config           string
	allowEmptyConfig bool
	mergeDomains     bool
	grpcAddr         string
	httpAddr         string
	store            string
	logFormat        string
	logLevel         string
	shadowMode       bool
	quotaMode        bool
	dynamicMetadata  bool
	ietfHeaders      bool
	deniedHits       string
	keyFormat        string
	strictPeeks      bool
	failureMode      string
	maxDescriptors   int
	maxDomainBytes   int
	maxEntries       int
	maxValueBytes    int
	responseHeaders  bool
	headers          server.Headers
	tlsCert          string
	tlsKey           string
	tlsClientCA      string
	tlsClientSAN     string
	grpcSocketMode   socketMode
	tlsHTTP          bool
	drainTimeout     time.Duration
	maxRecvMsgSize   int
	maxConnAge       time.Duration
	maxConnAgeGrace  time.Duration
	keepaliveTime    time.Duration
	keepaliveTimeout time.Duration
	http             httpBounds
	maxStreams       int
	source           sourceFlags
}

func (f *serveFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.config, "config", "", "limits `path`: a YAML file or a directory of them (required)")
	fs.BoolVar(&f.allowEmptyConfig, "allow-empty-config", false, "start with an empty config directory, NOT_SERVING until a valid config appears in it")
	fs.BoolVar(&f.mergeDomains, "merge-domains", false, "let several files define the same domain (merged)")
	fs.StringVar(&f.grpcAddr, "grpc-addr", ":8081", "gRPC listen `address` (Envoy RLS v3, sluice.v1, health, reflection): host:port, or unix:///path for a unix socket")
	fs.Var(&f.grpcSocketMode, "grpc-socket-mode", "with --grpc-addr unix:///path, the socket's permission bits in `octal` (e.g. 0660; default: as the umask makes them)")
	fs.StringVar(&f.httpAddr, "http-addr", ":8080", "HTTP listen `address` (/healthcheck, /json, /v1/check)")
	fs.StringVar(&f.store, "store", "memory", "counter store: "+strings.Join(backendNames(), "|"))
	fs.StringVar(&f.logFormat, "log-format", "text", "log format: text|json")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug (logs every gRPC call) | info | warn | error")
	fs.BoolVar(&f.shadowMode, "shadow-mode", false, "global shadow mode: count and report, but answer every request OK")
	fs.BoolVar(&f.quotaMode, "quota-mode", false, "global quota mode: every descriptor is a quota descriptor; a request is over only if all of them are")
	fs.BoolVar(&f.dynamicMetadata, "response-dynamic-metadata", false, "fill Envoy's dynamic_metadata with the domain, descriptors, hits addend and the matched rules' metadata")
	fs.StringVar(&f.deniedHits, "denied-hits", "drop", "what a denied hit consumes: drop (nothing) | saturate (up to the limit)")
	fs.StringVar(&f.keyFormat, "key-format", "sluice", "counter keys in Redis and memcached: sluice | reference (envoyproxy/ratelimit's keys for the fixed windows it can express, so that its pods and Sluice's count together: docs/MIGRATION.md)")
	fs.BoolVar(&f.strictPeeks, "strict-peeks", false, "a descriptor's hits_addend of 0 (a peek) is OVER_LIMIT unless one more unit fits; default: only past the limit, as envoyproxy/ratelimit")
	fs.StringVar(&f.failureMode, "store-failure-mode", "error", "answer when the store fails: error (gRPC UNAVAILABLE) | allow | deny")
	fs.IntVar(&f.maxDescriptors, "max-descriptors", limiter.DefaultMaxDescriptors, "most descriptors in one request")
	fs.IntVar(&f.maxEntries, "max-entries", limiter.DefaultMaxEntries, "most entries in one descriptor")
	fs.IntVar(&f.maxDomainBytes, "max-domain-bytes", limiter.DefaultMaxDomainBytes, "longest domain of a request, in bytes (the reference has no bound)")
	fs.IntVar(&f.maxValueBytes, "max-value-bytes", config.DefaultMaxValueBytes, "longer descriptor values are hashed in counter keys")
	fs.BoolVar(&f.responseHeaders, "response-headers", false, "add RateLimit-Limit/-Remaining/-Reset (and Retry-After) to Envoy's response_headers_to_add")
	fs.BoolVar(&f.ietfHeaders, "ietf-headers", false, "add the IETF draft's RateLimit-Policy and RateLimit fields to Envoy's response_headers_to_add and to /v1/check answers")
	fs.StringVar(&f.headers.Limit, "header-limit", "RateLimit-Limit", "name of the limit response header")
	fs.StringVar(&f.headers.Remaining, "header-remaining", "RateLimit-Remaining", "name of the remaining response header")
	fs.StringVar(&f.headers.Reset, "header-reset", "RateLimit-Reset", "name of the reset response header")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "serve gRPC and HTTP over TLS with this certificate `file` (reloaded when it changes)")
	fs.StringVar(&f.tlsKey, "tls-key", "", "the TLS private key `file`")
	fs.StringVar(&f.tlsClientCA, "tls-client-ca", "", "require client certificates signed by this CA bundle `file` (mTLS)")
	fs.StringVar(&f.tlsClientSAN, "tls-client-san", "", "with --tls-client-ca, accept only client certificates valid for this DNS `name` or IP address (a SAN; a *. wildcard SAN matches one label)")
	fs.BoolVar(&f.tlsHTTP, "tls-http", true, "with --tls-cert, serve --http-addr over TLS too (false: TLS on gRPC only, as envoyproxy/ratelimit)")
	fs.DurationVar(&f.drainTimeout, "drain-timeout", 10*time.Second, "on SIGTERM, how long in-flight requests may take before connections are closed")
	fs.IntVar(&f.maxRecvMsgSize, "max-recv-msg-size", 1<<20, "largest gRPC request in bytes")
	fs.DurationVar(&f.maxConnAge, "max-connection-age", 0, "close gRPC connections after this long so clients rebalance (0: never)")
	fs.DurationVar(&f.maxConnAgeGrace, "max-connection-age-grace", 0, "time for in-flight calls after max-connection-age (0: unlimited)")
	fs.DurationVar(&f.keepaliveTime, "keepalive-time", 0, "ping idle gRPC clients after this long (0: gRPC's 2h)")
	fs.DurationVar(&f.keepaliveTimeout, "keepalive-timeout", 0, "close a connection whose ping is unanswered this long (0: gRPC's 20s)")
	f.http.register(fs)
	fs.IntVar(&f.maxStreams, "grpc-max-concurrent-streams", server.DefaultMaxConcurrentStreams, "most concurrent gRPC calls and streams on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); clients open more connections or wait")
	f.source.register(fs)
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// limiterOptions checks the policy flags.
func (f *serveFlags) limiterOptions() (limiter.Options, error) {
	o := limiter.Options{MaxDescriptors: f.maxDescriptors, MaxEntries: f.maxEntries, MaxDomainBytes: f.maxDomainBytes,
		ShadowMode: f.shadowMode, QuotaMode: f.quotaMode, StrictPeeks: f.strictPeeks}
	switch f.deniedHits {
	case "drop":
	case "saturate":
		o.SaturateDenied = true
	default:
		return o, fmt.Errorf("--denied-hits %q: want drop or saturate", f.deniedHits)
	}
	switch f.keyFormat {
	case "sluice":
	case "reference":
		o.ReferenceKeys = true
	default:
		return o, fmt.Errorf("--key-format %q: want sluice or reference", f.keyFormat)
	}
	m, err := limiter.ParseFailureMode(f.failureMode)
	if err != nil {
		return o, fmt.Errorf("--store-failure-mode: %w", err)
	}
	o.FailureMode = m
	if f.maxDescriptors < 1 || f.maxEntries < 1 || f.maxDomainBytes < 1 {
		return o, errors.New("--max-descriptors, --max-entries and --max-domain-bytes must be at least 1")
	}
	return o, nil
}

// check checks the flags that need no I/O and returns the limiter's
// options and the backend of --store.
func (f *serveFlags) check() (limiter.Options, backend, error) {
	lopts, err := f.limiterOptions()
	if err != nil {
		return lopts, backend{}, err
	}
	b, ok := backends[f.store]
	if !ok {
		return lopts, b, fmt.Errorf("--store %q: unknown store (have %s)", f.store, strings.Join(backendNames(), ", "))
	}
	lopts.ReferenceKeys = lopts.ReferenceKeys && b.shared
	if (f.tlsCert == "") != (f.tlsKey == "") || f.tlsClientCA != "" && f.tlsCert == "" {
		return lopts, b, errors.New("TLS needs both --tls-cert and --tls-key (and --tls-client-ca only with them)")
	}
	if f.grpcSocketMode != 0 && !strings.HasPrefix(f.grpcAddr, "unix://") {
		return lopts, b, errors.New("--grpc-socket-mode needs --grpc-addr unix:///path")
	}
	if f.tlsClientSAN != "" && f.tlsClientCA == "" {
		return lopts, b, errors.New("--tls-client-san needs --tls-client-ca")
	}
	if err := f.http.check(); err != nil {
		return lopts, b, err
	}
	if f.maxStreams < 1 || f.maxStreams > 1<<31-1 {
		return lopts, b, errors.New("--grpc-max-concurrent-streams must be between 1 and 2^31-1")
	}
	return lopts, b, nil
}
