package main

import (
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/observe"
)

// refTable is every environment variable of envoyproxy/ratelimit's
// settings, each once, in the order applyEnv reads them and
// docs/ENVOY-GATEWAY.md lists them: the config source's
// (serve_config.go), the server's, the stats', the stores' (each
// backend's in its own file), then the limiter's. Rows are read in order,
// and the first error stops: one refused variable is reported, not all.
func refTable() []refVar {
	t := slices.Concat(sourceRefVars, refServer, refStats, refStores)
	for _, n := range backendNames() {
		t = append(t, backends[n].refVars...)
	}
	return slices.Concat(t, refCaches, refPolicy, refTracing)
}

// The server: listeners, gRPC, TLS, logs.
var refServer = []refVar{
	{name: "HOST", with: "PORT"},
	{name: "PORT", flag: "http-addr", conv: hostPortOf("HOST"),
		differs: "the port also serves Sluice's `/metrics`, API and status page; `POST /json` needs `Content-Type: application/json`"},
	{name: "DEBUG_HOST", with: "DEBUG_PORT"},
	{name: "DEBUG_PORT", flag: "debug-addr", conv: hostPortOf("DEBUG_HOST"),
		differs: "unset, no debug server (the reference's listens on `0.0.0.0:6070`); its command line shows secrets as `xxxxx`"},
	{name: "GRPC_HOST", with: "GRPC_PORT"},
	{name: "GRPC_PORT", flag: "grpc-addr", conv: hostPortOf("GRPC_HOST")},
	// After GRPC_PORT, which it overrides, as in the reference.
	{name: "GRPC_UDS", flag: "grpc-addr", conv: refConv{
		doc: "as `unix://GRPC_UDS`, instead of `GRPC_HOST:GRPC_PORT`; the socket is removed at exit",
		fn:  func(_ *refEnv, path string) (string, error) { return "unix://" + path, nil }},
		differs: "a socket file left by a killed process is replaced (the reference fails to listen); `--grpc-socket-mode` can set its permissions"},
	{name: "GRPC_MAX_CONNECTION_AGE", flag: "max-connection-age", differs: "unset, connections are never closed for age (the reference's default: 24h)"},
	{name: "GRPC_MAX_CONNECTION_AGE_GRACE", flag: "max-connection-age-grace", differs: "unset, no limit (the reference's default: 1h)"},
	{name: "GRPC_SERVER_USE_TLS", boolean: true, apply: refApply{
		doc: "`true`: gRPC over TLS with `GRPC_SERVER_TLS_CERT` and `GRPC_SERVER_TLS_KEY` (both needed), and `--tls-http=false`: " +
			"as in the reference, the HTTP port (`/healthcheck`, the probes') stays plain",
		fn: func(e *refEnv, v string) error {
			if v != "true" {
				return nil
			}
			if !e.has("GRPC_SERVER_TLS_CERT") || !e.has("GRPC_SERVER_TLS_KEY") {
				return errors.New("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY")
			}
			e.set("tls-http", "false")
			return nil
		}}},
	{name: "GRPC_SERVER_TLS_CERT", when: onGRPCTLS, flag: "tls-cert"},
	{name: "GRPC_SERVER_TLS_KEY", when: onGRPCTLS, flag: "tls-key"},
	{name: "GRPC_CLIENT_TLS_CACERT", when: onGRPCTLS, flag: "tls-client-ca"},
	{name: "GRPC_CLIENT_TLS_SAN", when: onGRPCTLS, flag: "tls-client-san", conv: refConv{
		doc: "with `GRPC_CLIENT_TLS_CACERT` (else ignored with a warning, as the reference ignores it): the client certificate must be valid " +
			"for this DNS name or IP address, as the reference checks it",
		fn: func(e *refEnv, v string) (string, error) {
			if !e.has("GRPC_CLIENT_TLS_CACERT") {
				e.warn("GRPC_CLIENT_TLS_SAN=%s is ignored (as by envoyproxy/ratelimit): without GRPC_CLIENT_TLS_CACERT no client certificate is asked for", v)
				return "", nil
			}
			return v, nil
		}}},
	{name: "GRPC_SERVER_TLS_CA_CERT", extra: "Envoy Gateway sets it", when: onGRPCTLS, apply: refApply{
		doc: "ignored with a warning, as the reference ignores it: clients are not asked for certificates " +
			"(`GRPC_CLIENT_TLS_CACERT` turns mTLS on)",
		fn: func(e *refEnv, v string) error {
			if !e.has("GRPC_CLIENT_TLS_CACERT") {
				e.warn("GRPC_SERVER_TLS_CA_CERT=%s is not read (neither by envoyproxy/ratelimit): gRPC clients are not asked for certificates; GRPC_CLIENT_TLS_CACERT or --tls-client-ca turns mTLS on", v)
			}
			return nil
		}}},
	{name: "LOG_LEVEL", flag: "log-level", conv: refConv{
		doc: "in any case; logrus's `trace` is `debug`, `warning` `warn`, `fatal` and `panic` `error`",
		fn: func(_ *refEnv, v string) (string, error) {
			switch v = strings.ToLower(v); v {
			case "trace":
				return "debug", nil
			case "warning":
				return "warn", nil
			case "fatal", "panic":
				return "error", nil
			}
			return v, nil
		}},
		differs: "unset, `info` (the reference's default: `WARN`); the log lines are Sluice's own"},
	{name: "LOG_FORMAT", flag: "log-format", conv: refConv{doc: "in any case",
		fn: func(_ *refEnv, v string) (string, error) { return strings.ToLower(v), nil }}},
}

// onGRPCTLS: the reference reads its TLS files only with
// GRPC_SERVER_USE_TLS=true.
var onGRPCTLS = &refCond{doc: "`GRPC_SERVER_USE_TLS=true`", holds: func(e *refEnv) bool { return e.on("GRPC_SERVER_USE_TLS") }}

// hostPortOf maps a port variable onto an address with the host in
// variable host: the reference's 0.0.0.0 is every interface.
func hostPortOf(host string) refConv {
	return refConv{doc: "as `" + host + ":PORT`",
		fn: func(e *refEnv, port string) (string, error) { return hostPort(e.getenv(host), port), nil }}
}

func hostPort(host, port string) string {
	if host == "0.0.0.0" {
		host = ""
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return host + ":" + port
}

// The reference's stats: statsd (USE_STATSD, on by default there: here
// when asked for or STATSD_HOST/STATSD_PORT are set) and its Prometheus
// series (USE_PROMETHEUS), both from observe.RefStats. The reference
// refuses to run both; Sluice runs both.
var refStats = []refVar{
	{name: "USE_DOG_STATSD", boolean: true, when: onStats, flag: "statsd-dogstatsd", conv: refConv{
		doc: "`true`: DogStatsD over UDP to `STATSD_HOST:STATSD_PORT` (`localhost:8125` when unset), named and tagged as the reference names them; " +
			"refused with `USE_STATSD=true`, as the reference refuses it",
		fn: func(e *refEnv, v string) (string, error) {
			if v != "true" {
				return "", nil
			}
			if e.has("USE_STATSD") && e.on("USE_STATSD") {
				return "", errors.New("USE_DOG_STATSD=true with USE_STATSD=true: one statsd sink at a time, as in envoyproxy/ratelimit; set USE_STATSD=false")
			}
			return v, nil
		}},
		differs: "`USE_STATSD` unset is enough (the reference refuses its default `true`), and `USE_PROMETHEUS=true` may run too"},
	{name: "USE_DOG_STATSD_MOGRIFIERS", when: onDogStatsd, apply: refApply{
		doc: "`NAME,...`: for each NAME, `DOG_STATSD_MOGRIFIER_NAME_PATTERN`, `_NAME` and `_TAGS` (NAME upper-cased) become a `--statsd-mogrifier`, " +
			"in this order; checked as the reference checks them (a pattern and a name needed, tags `key:value,...`)",
		fn: func(e *refEnv, v string) error {
			for _, n := range strings.Split(v, ",") {
				if n = strings.TrimSpace(n); n == "" {
					continue
				}
				p := "DOG_STATSD_MOGRIFIER_" + strings.ToUpper(n) + "_"
				m, err := observe.NewMogrifier(e.getenv(p+"PATTERN"), e.getenv(p+"NAME"), e.getenv(p+"TAGS"))
				if err != nil {
					return fmt.Errorf("USE_DOG_STATSD_MOGRIFIERS: %s: %w (from %sPATTERN, %sNAME, %sTAGS)", n, err, p, p, p)
				}
				e.set("statsd-mogrifier", m.String())
			}
			return nil
		}},
		differs: "a mogrifier's tags come sorted by key (the reference's in a Go map's order); a `,` caught into a tag value becomes `_`"},
	{name: "USE_STATSD", boolean: true, note: "turns the statsd stats on; unset, `STATSD_HOST` or `STATSD_PORT` turns them on",
		differs: "unset and without `STATSD_HOST` or `STATSD_PORT`, no statsd (the reference's default is true)"},
	{name: "STATSD_HOST", with: "STATSD_PORT"},
	{name: "STATSD_PORT", when: onStatsd, flag: "statsd-addr", def: "8125", conv: refConv{
		doc: "as `STATSD_HOST:STATSD_PORT` (`localhost` when unset)",
		fn: func(e *refEnv, port string) (string, error) {
			host := e.getenv("STATSD_HOST")
			if host == "" {
				host = "localhost"
			}
			return net.JoinHostPort(host, port), nil
		}}},
	{name: "STATSD_PROTOCOL", extra: "read by gostats, the reference's stats library", when: onStatsd, flag: "statsd-protocol", def: "tcp", conv: refConv{
		doc: "`udp` or `tcp` (`udp4`/`udp6`, `tcp4`/`tcp6` as these); not read with `USE_DOG_STATSD=true`, which is UDP, as in the reference",
		fn: func(e *refEnv, v string) (string, error) {
			if e.on("USE_DOG_STATSD") {
				if e.has("STATSD_PROTOCOL") {
					e.warn("STATSD_PROTOCOL=%s is ignored with USE_DOG_STATSD=true: DogStatsD goes over UDP, as in envoyproxy/ratelimit", v)
				}
				return "", nil
			}
			switch v = strings.ToLower(v); v {
			case "udp", "udp4", "udp6":
				return "udp", nil
			case "tcp", "tcp4", "tcp6":
				return "tcp", nil
			}
			return "", fmt.Errorf("STATSD_PROTOCOL=%s: want udp or tcp", v)
		}}},
	{name: "EXTRA_TAGS", when: onStats, flag: "stats-tags"},
	{name: "STATS_FLUSH_INTERVAL", when: onStats, flag: "stats-flush-interval"},
	{name: "DISABLE_STATS", boolean: true, note: "`true` turns the reference's stats off (statsd and its Prometheus series); Sluice's own `/metrics` stays on"},
	{name: "USE_PROMETHEUS", boolean: true, note: "`true` serves the reference's Prometheus series"},
	{name: "PROMETHEUS_ADDR", when: onPrometheus, flag: "ref-prometheus-addr", def: ":9090"},
	{name: "PROMETHEUS_PATH", when: onPrometheus, flag: "ref-prometheus-path"},
	{name: "PROMETHEUS_MAPPER_YAML", when: onPrometheus, flag: "ref-prometheus-mapping"},
	// Checked whatever USE_PROMETHEUS says, hence no when.
	{name: "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", boolean: true, flag: "ref-prometheus-response-time-ms", conv: refConv{
		doc: "with `USE_PROMETHEUS=true` (the value is checked whatever it says)",
		fn: func(e *refEnv, v string) (string, error) {
			if ok, _ := onPrometheus.check(e); !ok {
				return "", nil
			}
			return v, nil
		}}},
}

var (
	onStats = &refCond{doc: "`DISABLE_STATS` not true", holds: func(e *refEnv) bool { return !e.on("DISABLE_STATS") }}
	// onStatsd: the reference's USE_STATSD defaults to true; its
	// manifests that want statsd set STATSD_HOST or STATSD_PORT alone.
	onStatsd = &refCond{within: onStats, doc: "`USE_STATSD=true` (or unset, with `STATSD_HOST` or `STATSD_PORT` set) or `USE_DOG_STATSD=true`",
		holds: func(e *refEnv) bool {
			if e.on("USE_DOG_STATSD") {
				return true
			}
			if e.has("USE_STATSD") {
				return e.on("USE_STATSD")
			}
			return e.has("STATSD_HOST") || e.has("STATSD_PORT")
		}}
	onDogStatsd  = &refCond{within: onStats, doc: "`USE_DOG_STATSD=true`", holds: func(e *refEnv) bool { return e.on("USE_DOG_STATSD") }}
	onPrometheus = &refCond{within: onStats, doc: "`USE_PROMETHEUS=true`", holds: func(e *refEnv) bool { return e.on("USE_PROMETHEUS") }}
)

// The store: BACKEND_TYPE picks the backend, whose variables its file
// lists.
var refStores = []refVar{
	{name: "BACKEND_TYPE", flag: "store", conv: refConv{
		doc: "in any case: a store of this build (`sluice serve -h` lists them under `--store`; `memory` is the default), others refused",
		fn: func(_ *refEnv, v string) (string, error) {
			switch v = strings.ToLower(v); v {
			case "memory":
				return "", nil // the default
			default:
				if _, ok := backends[v]; !ok {
					return "", fmt.Errorf("BACKEND_TYPE=%s is not supported by this build (stores: %s)", v, strings.Join(backendNames(), ", "))
				}
			}
			return v, nil
		}},
		differs: "unset, the memory store, which counts per replica (the reference's default: `redis`)"},
}

// The settings the reference applies to every store.
var refCaches = []refVar{
	{name: "LOCAL_CACHE_SIZE_IN_BYTES", ignore: "the memory store holds all counters; see --memory-max-keys"},
	{name: "EXPIRATION_JITTER_MAX_SECONDS", when: onRefStore, def: "300", apply: refApply{
		doc: "with the reference's Redis or memcached settings (`REDIS_URL`, or `BACKEND_TYPE` `redis` or `memcache`), even unset (the reference's default: 300): " +
			"`--key-format reference` (unless `SLUICE_KEY_FORMAT` or `--key-format` says otherwise: docs/MIGRATION.md), and " +
			"`--redis-expiry-jitter` and `--memcache-expiry-jitter` of this many seconds; with `BACKEND_TYPE=memcache`, `--memcache-modulo` (the reference's placement of keys on servers)",
		fn: func(e *refEnv, v string) error {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return fmt.Errorf("EXPIRATION_JITTER_MAX_SECONDS=%q: want a number of seconds, 0 or more", v)
			}
			e.set("key-format", "reference")
			e.set("redis-expiry-jitter", strconv.FormatInt(n, 10)+"s")
			e.set("memcache-expiry-jitter", strconv.FormatInt(n, 10)+"s")
			if onMemcache.holds(e) {
				e.set("memcache-modulo", "true")
			}
			return nil
		}}},
	{name: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", ignore: "Sluice never counts denied hits (see --denied-hits)"},
	{name: "NEAR_LIMIT_RATIO", flag: "near-limit-ratio"},
}

// onRefStore: the reference's environment names a Redis or memcached
// store (its default backend is Redis, named by REDIS_URL alone).
var onRefStore = &refCond{doc: "`REDIS_URL` set, or `BACKEND_TYPE` `redis` or `memcache`", holds: func(e *refEnv) bool {
	b := strings.ToLower(e.getenv("BACKEND_TYPE"))
	return b == "redis" || b == "memcache" || b == "" && e.has("REDIS_URL")
}}

// The limiter and its answers.
var refPolicy = []refVar{
	{name: "SHADOW_MODE", flag: "shadow-mode"},
	{name: "QUOTA_MODE", flag: "quota-mode"},
	{name: "RESPONSE_DYNAMIC_METADATA", flag: "response-dynamic-metadata"},
	{name: "LIMIT_RESPONSE_HEADERS_ENABLED", flag: "response-headers"},
	{name: "LIMIT_LIMIT_HEADER", flag: "header-limit"},
	{name: "LIMIT_REMAINING_HEADER", flag: "header-remaining"},
	{name: "LIMIT_RESET_HEADER", flag: "header-reset"},
}

// Tracing over OTLP (serve_tracing.go). The exporter reads the
// OTEL_EXPORTER_OTLP_* variables from the process environment itself.
var refTracing = []refVar{
	{name: "TRACING_ENABLED", boolean: true, flag: "tracing"},
	{name: "TRACING_SERVICE_NAME", when: onTracing, unmet: unmetTracing, flag: "tracing-service-name", def: "RateLimit"},
	{name: "TRACING_SERVICE_NAMESPACE", when: onTracing, unmet: unmetTracing, flag: "tracing-service-namespace"},
	{name: "TRACING_SERVICE_INSTANCE_ID", when: onTracing, unmet: unmetTracing, flag: "tracing-service-instance-id"},
	{name: "TRACING_EXPORTER_PROTOCOL", when: onTracing, unmet: unmetTracing, flag: "tracing-protocol", conv: refConv{
		doc: "in any case (the reference takes `http` and `grpc` only)",
		fn:  func(_ *refEnv, v string) (string, error) { return strings.ToLower(v), nil }}},
	{name: "TRACING_SAMPLING_RATE", when: onTracing, unmet: unmetTracing, flag: "tracing-sampling-rate", conv: refConv{
		doc: "a number; as in the reference, 1 or more samples every trace, 0 or less none",
		fn: func(_ *refEnv, v string) (string, error) {
			r, err := strconv.ParseFloat(v, 64)
			if err != nil || math.IsNaN(r) {
				return "", fmt.Errorf("TRACING_SAMPLING_RATE=%q: want a number", v)
			}
			return strconv.FormatFloat(min(max(r, 0), 1), 'g', -1, 64), nil
		}}},
	{name: "OTEL_EXPORTER_OTLP_ENDPOINT", extra: otelExtra, note: otelNote + "the collector's base URL (`/v1/traces` is added for HTTP)"},
	{name: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", extra: otelExtra, note: otelNote + "the traces' URL, in place of `OTEL_EXPORTER_OTLP_ENDPOINT`"},
	{name: "OTEL_EXPORTER_OTLP_HEADERS", extra: otelExtra, note: otelNote + "headers sent with every export, `key=value,...`"},
	{name: "OTEL_EXPORTER_OTLP_INSECURE", extra: otelExtra, note: otelNote + "`true`: plain text whatever the endpoint's scheme (an `http://` endpoint is plain text anyway)"},
}

// onTracing: the reference reads its TRACING_* settings only with
// TRACING_ENABLED=true.
var onTracing = &refCond{doc: "`TRACING_ENABLED=true`", holds: func(e *refEnv) bool { return e.on("TRACING_ENABLED") }}

const (
	unmetTracing = " without TRACING_ENABLED=true"
	otelExtra    = "read by OpenTelemetry's exporter"
	// The other OTEL_EXPORTER_OTLP_* (certificates, timeout, compression)
	// are read the same way; docs/TRACING.md lists them.
	otelNote = "read by OpenTelemetry's OTLP exporter from the process environment with `TRACING_ENABLED=true`: "
)
