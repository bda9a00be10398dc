package main

import (
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
)

// envName is the SLUICE_* variable of a flag: --grpc-addr → SLUICE_GRPC_ADDR.
func envName(flagName string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyEnv gives every flag not set on the command line its SLUICE_*
// variable, then the reference's variables (envoyproxy/ratelimit's) to
// flags still unset. It returns the warnings to log once the logger
// exists. Precedence: flag > SLUICE_* > reference variable > default.
func applyEnv(fs *flag.FlagSet, getenv func(string) string) (warnings []string, err error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		if v := getenv(envName(f.Name)); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", envName(f.Name), v, err))
			}
			set[f.Name] = true
		}
	})
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	setRef := func(name, value string) {
		if set[name] || fs.Lookup(name) == nil {
			return
		}
		if err := fs.Set(name, value); err != nil {
			errs = append(errs, fmt.Errorf("flag --%s from the reference's environment: %w", name, err))
		}
	}
	warnings, err = refEnv(getenv, setRef)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(backends))
	for n := range backends {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if b := backends[n]; b.refEnv != nil {
			if err := b.refEnv(getenv, setRef); err != nil {
				return nil, err
			}
		}
	}
	return warnings, errors.Join(errs...)
}

// refEnv maps envoyproxy/ratelimit's environment variables (the ones of
// its settings, as its Kubernetes manifests set them) onto serve's flags.
// Each variable is mapped, ignored with a warning, or refused; the README
// lists them. Variables of a store backend are the backend's (its refEnv).
func refEnv(getenv func(string) string, set func(flag, value string)) (warnings []string, err error) {
	has := func(k string) bool { return getenv(k) != "" }

	// Refused: settings Sluice cannot honour would silently change
	// behaviour.
	if v := getenv("CONFIG_TYPE"); v != "" && !strings.EqualFold(v, "FILE") {
		return nil, fmt.Errorf("CONFIG_TYPE=%s is not supported: Sluice reads limits from files (--config)", v)
	}
	backend := strings.ToLower(getenv("BACKEND_TYPE"))
	if backend == "" && has("REDIS_URL") {
		// The reference's default backend is Redis: its manifests set
		// REDIS_URL alone.
		backend = "redis"
	}
	switch v := backend; v {
	case "", "memory":
	default:
		if _, ok := backends[v]; !ok {
			return nil, fmt.Errorf("BACKEND_TYPE=%s is not supported by this build (stores: %s)", v, strings.Join(backendNames(), ", "))
		}
		set("store", v)
	}
	if has("GRPC_UDS") {
		return nil, errors.New("GRPC_UDS is not supported: serve gRPC on TCP with --grpc-addr")
	}
	if has("GRPC_CLIENT_TLS_SAN") {
		return nil, errors.New("GRPC_CLIENT_TLS_SAN is not supported: Sluice checks client certificates against --tls-client-ca only")
	}

	// Mapped.
	if root, sub := getenv("RUNTIME_ROOT"), getenv("RUNTIME_SUBDIRECTORY"); root != "" || sub != "" {
		if root == "" {
			root = "/srv/runtime_data/current"
		}
		app := getenv("RUNTIME_APPDIRECTORY")
		if app == "" {
			app = "config"
		}
		set("config", filepath.Join(root, sub, app))
	}
	if v := getenv("PORT"); v != "" {
		set("http-addr", hostPort(getenv("HOST"), v))
	}
	if v := getenv("GRPC_PORT"); v != "" {
		set("grpc-addr", hostPort(getenv("GRPC_HOST"), v))
	}
	if v := getenv("DEBUG_PORT"); v != "" {
		set("debug-addr", hostPort(getenv("DEBUG_HOST"), v))
	}
	if v := strings.ToLower(getenv("LOG_LEVEL")); v != "" {
		// logrus's levels, as the reference accepts them.
		switch v {
		case "trace":
			v = "debug"
		case "warning":
			v = "warn"
		case "fatal", "panic":
			v = "error"
		}
		set("log-level", v)
	}
	if v := getenv("LOG_FORMAT"); v != "" {
		set("log-format", strings.ToLower(v))
	}
	for ref, fl := range map[string]string{
		"SHADOW_MODE":                    "shadow-mode",
		"QUOTA_MODE":                     "quota-mode",
		"RESPONSE_DYNAMIC_METADATA":      "response-dynamic-metadata",
		"MERGE_DOMAIN_CONFIG":            "merge-domains",
		"LIMIT_RESPONSE_HEADERS_ENABLED": "response-headers",
		"LIMIT_LIMIT_HEADER":             "header-limit",
		"LIMIT_REMAINING_HEADER":         "header-remaining",
		"LIMIT_RESET_HEADER":             "header-reset",
		"GRPC_MAX_CONNECTION_AGE":        "max-connection-age",
		"GRPC_MAX_CONNECTION_AGE_GRACE":  "max-connection-age-grace",
		"NEAR_LIMIT_RATIO":               "near-limit-ratio",
	} {
		if v := getenv(ref); v != "" {
			set(fl, v)
		}
	}
	// The reference's TLS files count only with GRPC_SERVER_USE_TLS=true.
	if strings.EqualFold(getenv("GRPC_SERVER_USE_TLS"), "true") {
		if !has("GRPC_SERVER_TLS_CERT") || !has("GRPC_SERVER_TLS_KEY") {
			return nil, errors.New("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY")
		}
		set("tls-cert", getenv("GRPC_SERVER_TLS_CERT"))
		set("tls-key", getenv("GRPC_SERVER_TLS_KEY"))
		if v := getenv("GRPC_CLIENT_TLS_CACERT"); v != "" {
			set("tls-client-ca", v)
		}
	}

	// Ignored, with a warning: Sluice does it differently or always.
	for _, k := range ignoredRefEnv {
		if has(k.name) {
			warnings = append(warnings, fmt.Sprintf("%s is ignored: %s", k.name, k.why))
		}
	}
	return warnings, nil
}

// ignoredRefEnv lists the reference's variables Sluice accepts but does
// not use, and why.
var ignoredRefEnv = []struct{ name, why string }{
	{"USE_STATSD", "Sluice exports Prometheus metrics on /metrics"},
	{"STATSD_HOST", "Sluice exports Prometheus metrics on /metrics"},
	{"STATSD_PORT", "Sluice exports Prometheus metrics on /metrics"},
	{"EXTRA_TAGS", "Sluice exports Prometheus metrics on /metrics"},
	{"USE_PROMETHEUS", "Prometheus metrics are always on /metrics"},
	{"PROMETHEUS_ADDR", "Prometheus metrics are served on /metrics"},
	{"PROMETHEUS_PATH", "Prometheus metrics are served on /metrics"},
	{"PROMETHEUS_MAPPER_YAML", "Sluice's metrics need no statsd mapping"},
	{"USE_DOG_STATSD", "Sluice exports Prometheus metrics on /metrics"},
	{"DISABLE_STATS", "metrics are always available"},
	{"GOSTATS_FLUSH_INTERVAL", "Prometheus pulls metrics"},
	{"RUNTIME_WATCH_ROOT", "Sluice watches the config directory"},
	{"RUNTIME_IGNOREDOTFILES", "files starting with a dot are always ignored"},
	{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "Sluice is never healthy without a config"},
	{"REDIS_POOL_SIZE", "every Redis call is pipelined on a few shared connections"},
	{"REDIS_PIPELINE_LIMIT", "concurrent requests share Redis script calls on their own"},
	{"LOCAL_CACHE_SIZE_IN_BYTES", "the memory store holds all counters; see --memory-max-keys"},
	{"EXPIRATION_JITTER_MAX_SECONDS", "not needed by Sluice's stores"},
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "Sluice never counts denied hits (see --denied-hits)"},
	{"TRACING_ENABLED", "tracing is not implemented"},
	{"TRACING_EXPORTER_PROTOCOL", "tracing is not implemented"},
	{"TRACING_SERVICE_NAME", "tracing is not implemented"},
	{"TRACING_SERVICE_NAMESPACE", "tracing is not implemented"},
	{"TRACING_SERVICE_INSTANCE_ID", "tracing is not implemented"},
	{"TRACING_SAMPLING_RATE", "tracing is not implemented"},
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

func backendNames() []string {
	names := make([]string, 0, len(backends))
	for n := range backends {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
