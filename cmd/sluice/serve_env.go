package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"path/filepath"
	"sort"
	"strconv"
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
				errs = append(errs, fmt.Errorf("%s=%q: %w", envName(f.Name), shownValue(f.Name, v), err))
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
	xdsSource := false
	switch v := getenv("CONFIG_TYPE"); strings.ToUpper(v) {
	case "", "FILE":
		if has("FORCE_START_WITHOUT_INITIAL_CONFIG") {
			warnings = append(warnings, "FORCE_START_WITHOUT_INITIAL_CONFIG is ignored: it applies to CONFIG_TYPE=GRPC_XDS_SOTW (with files see --allow-empty-config)")
		}
	case "GRPC_XDS_SOTW":
		xdsSource = true
		w, err := xdsRefEnv(getenv, set)
		if err != nil {
			return nil, err
		}
		warnings = append(warnings, w...)
	default:
		return nil, fmt.Errorf("CONFIG_TYPE=%s is not supported (want FILE or GRPC_XDS_SOTW)", v)
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
	bools := map[string]bool{}
	for _, k := range []string{"USE_STATSD", "USE_PROMETHEUS", "USE_DOG_STATSD", "DISABLE_STATS",
		"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "TRACING_ENABLED", "RUNTIME_IGNOREDOTFILES", "RUNTIME_WATCH_ROOT"} {
		if getenv(k) == "" {
			continue // unset: the map says so (USE_STATSD's default depends on it)
		}
		b, err := refBool(getenv, k)
		if err != nil {
			return nil, err
		}
		bools[k] = b
	}
	if bools["USE_DOG_STATSD"] {
		return nil, errors.New("USE_DOG_STATSD=true is not supported: Sluice sends plain statsd (USE_STATSD=true) or serves the reference's Prometheus series (USE_PROMETHEUS=true)")
	}
	if v := getenv("STATSD_PROTOCOL"); v != "" && !strings.EqualFold(v, "udp") {
		return nil, fmt.Errorf("STATSD_PROTOCOL=%s is not supported: Sluice sends statsd over UDP (which statsd_exporter and StatsD also listen on)", v)
	}
	if bools["TRACING_ENABLED"] {
		return nil, errors.New("TRACING_ENABLED=true is not supported: Sluice exports no traces; turn tracing off (in Envoy Gateway, remove rateLimit.telemetry.tracing)")
	}

	// Mapped.
	if root, sub := getenv("RUNTIME_ROOT"), getenv("RUNTIME_SUBDIRECTORY"); !xdsSource && (root != "" || sub != "") {
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
	useTLS, err := refBool(getenv, "GRPC_SERVER_USE_TLS")
	if err != nil {
		return nil, err
	}
	if useTLS {
		if !has("GRPC_SERVER_TLS_CERT") || !has("GRPC_SERVER_TLS_KEY") {
			return nil, errors.New("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY")
		}
		set("tls-cert", getenv("GRPC_SERVER_TLS_CERT"))
		set("tls-key", getenv("GRPC_SERVER_TLS_KEY"))
		if v := getenv("GRPC_CLIENT_TLS_CACERT"); v != "" {
			set("tls-client-ca", v)
		}
		// The reference serves HTTP (/healthcheck, the probes' port)
		// without TLS.
		set("tls-http", "false")
		if v := getenv("GRPC_SERVER_TLS_CA_CERT"); v != "" && !has("GRPC_CLIENT_TLS_CACERT") {
			// Envoy Gateway sets it; the reference has no such setting.
			warnings = append(warnings, fmt.Sprintf("GRPC_SERVER_TLS_CA_CERT=%s is not read (neither by envoyproxy/ratelimit): gRPC clients are not asked for certificates; GRPC_CLIENT_TLS_CACERT or --tls-client-ca turns mTLS on", v))
		}
	}

	// Stats: the reference's statsd stats (USE_STATSD, on by default
	// there: here when asked for or STATSD_HOST/STATSD_PORT are set) and
	// its Prometheus series (USE_PROMETHEUS), both from observe.RefStats.
	// The reference refuses to run both; Sluice runs both.
	if !bools["DISABLE_STATS"] {
		useStatsd, set0 := bools["USE_STATSD"]
		if !set0 {
			useStatsd = has("STATSD_HOST") || has("STATSD_PORT")
		}
		if useStatsd {
			host, port := getenv("STATSD_HOST"), getenv("STATSD_PORT")
			if host == "" {
				host = "localhost"
			}
			if port == "" {
				port = "8125"
			}
			set("statsd-addr", net.JoinHostPort(host, port))
		}
		if bools["USE_PROMETHEUS"] {
			addr := getenv("PROMETHEUS_ADDR")
			if addr == "" {
				addr = ":9090"
			}
			set("ref-prometheus-addr", addr)
			if v := getenv("PROMETHEUS_PATH"); v != "" {
				set("ref-prometheus-path", v)
			}
			if v := getenv("PROMETHEUS_MAPPER_YAML"); v != "" {
				set("ref-prometheus-mapping", v)
			}
			if bools["PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS"] {
				set("ref-prometheus-response-time-ms", "true")
			}
		}
		if v := getenv("EXTRA_TAGS"); v != "" {
			set("stats-tags", v)
		}
		if v := getenv("STATS_FLUSH_INTERVAL"); v != "" {
			set("stats-flush-interval", v)
		}
	}
	// Files starting with a dot are always ignored, and the config
	// directory is watched with its symlinks (a ConfigMap's ..data swap),
	// which covers both RUNTIME_WATCH_ROOT values.
	if v, ok := bools["RUNTIME_IGNOREDOTFILES"]; ok && !v {
		warnings = append(warnings, "RUNTIME_IGNOREDOTFILES=false is ignored: files starting with a dot are always ignored")
	}

	if v := getenv("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED"); v != "" {
		set("require-domain", v)
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
	{"USE_DOG_STATSD_MOGRIFIERS", "DogStatsD is not supported"},
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
	{"OTEL_EXPORTER_OTLP_ENDPOINT", "tracing is not implemented"},
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

// refBool reads one of the reference's boolean variables as it does
// (strconv.ParseBool: 1, t, true, TRUE, 0, f, false, ...); unset is false.
func refBool(getenv func(string) string, name string) (bool, error) {
	v := getenv(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s=%q: want true or false", name, v)
	}
	return b, nil
}
