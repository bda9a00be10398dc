package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/config/xds"
	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/store"
)

// sourceFlags choose where the limits come from: files (--config) or an
// xDS management server (--xds-*).
type sourceFlags struct {
	kind               string
	xdsServer          string
	xdsNodeID          string
	xdsNodeMetadata    string
	xdsHeaders         string
	xdsTLS             bool
	xdsCert, xdsKey    string
	xdsCA, xdsName     string
	xdsBackoffInitial  time.Duration
	xdsBackoffMax      time.Duration
	xdsJitter          float64
	xdsMaxRecvMsgSize  int
	startWithoutConfig bool
	requireDomain      bool
	xdsOverlay         string
	defaultAlgorithm   string
	// ignored counts the pushed fields Sluice does not use, once setup
	// has made it (the registry comes after the config source).
	ignored atomic.Pointer[observe.IgnoredFields]
}

// ignoredField counts a field of a pushed config that Sluice does not use.
func (f *sourceFlags) ignoredField(field string) {
	if c := f.ignored.Load(); c != nil {
		c.Named(field)
	}
}

func (f *sourceFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.kind, "config-source", "file", "where the limits come from: file (--config) | xds (pushed by --xds-server)")
	fs.StringVar(&f.xdsServer, "xds-server", "", "xDS management server `address` (host:port) that pushes RateLimitConfig resources")
	fs.StringVar(&f.xdsNodeID, "xds-node-id", "default", "node `id` sent to the xDS server (Envoy Gateway: envoy-ratelimit)")
	fs.StringVar(&f.xdsNodeMetadata, "xds-node-metadata", "", "node metadata sent to the xDS server, `k=v,k2=v2`")
	fs.StringVar(&f.xdsHeaders, "xds-headers", "", "gRPC metadata on the xDS stream, `k:v,k2:v2`")
	fs.BoolVar(&f.xdsTLS, "xds-tls", false, "connect to the xDS server with TLS (implied by the other --xds-tls-* flags)")
	fs.StringVar(&f.xdsCert, "xds-tls-cert", "", "client certificate PEM `file` for mTLS to the xDS server (read again at each connection)")
	fs.StringVar(&f.xdsKey, "xds-tls-key", "", "client key PEM `file` for mTLS to the xDS server")
	fs.StringVar(&f.xdsCA, "xds-tls-ca", "", "PEM `file` of CAs that verify the xDS server (default: the system's)")
	fs.StringVar(&f.xdsName, "xds-tls-server-name", "", "`name` the xDS server's certificate must have (default: the host of --xds-server)")
	fs.DurationVar(&f.xdsBackoffInitial, "xds-backoff-initial", xds.DefaultBackoffInitial, "first wait before the xDS stream is opened again, doubled after each attempt until a stream stays open 30s; also the first wait before answering a repeated xDS response")
	fs.DurationVar(&f.xdsBackoffMax, "xds-backoff-max", xds.DefaultBackoffMax, "longest wait before the xDS stream is opened again, or before answering a repeated xDS response")
	fs.Float64Var(&f.xdsJitter, "xds-backoff-jitter", xds.DefaultJitter, "fraction of each xDS reconnection wait drawn at random (0 or negative: none)")
	fs.IntVar(&f.xdsMaxRecvMsgSize, "xds-max-recv-msg-size", 0, "largest xDS response in bytes (0: gRPC's 4 MiB)")
	fs.BoolVar(&f.startWithoutConfig, "start-without-config", false, "with --config-source=xds: before the first push, report SERVING and answer every request with no limit (default: NOT_SERVING until then)")
	fs.BoolVar(&f.requireDomain, "require-domain", false, "report NOT_SERVING while the config in force defines no domain")
	fs.StringVar(&f.xdsOverlay, "xds-overlay", "", "overlay `path` (a file or a directory of them, watched): Sluice's own fields (algorithm, burst, unit_multiplier, calendar, rate_limits, ...) for the limits pushed over xDS, by domain and descriptor path")
	fs.StringVar(&f.defaultAlgorithm, "default-algorithm", "fixed_window", "`algorithm` of every rule that names none, in files and pushed over xDS: fixed_window (the reference's) | sliding_window | token_bucket (burst = requests_per_unit)")
}

// algorithms are the --default-algorithm values.
var algorithms = map[string]store.Algorithm{"fixed_window": store.FixedWindow, "sliding_window": store.SlidingWindow, "token_bucket": store.TokenBucket}

// openConfig returns the Reloader of the config source the flags choose.
// For files it has loaded them; an xDS source starts with no table, or an
// empty one with --start-without-config, until Run receives a push.
func (f *serveFlags) openConfig(logger *slog.Logger) (*config.Reloader, error) {
	s := &f.source
	alg, ok := algorithms[s.defaultAlgorithm]
	if !ok {
		return nil, fmt.Errorf("--default-algorithm %q: want fixed_window, sliding_window or token_bucket", s.defaultAlgorithm)
	}
	opts := config.Options{MergeDomains: f.mergeDomains, MaxValueBytes: f.maxValueBytes, DefaultAlgorithm: alg}
	switch s.kind {
	case "file":
		if f.config == "" {
			return nil, errors.New("--config is required (a limits file or directory; see examples/config), or --config-source=xds")
		}
		if s.xdsServer != "" || s.startWithoutConfig || s.xdsOverlay != "" {
			return nil, errors.New("--xds-server, --xds-overlay and --start-without-config need --config-source=xds (limits files set Sluice's fields themselves)")
		}
		r, err := config.NewReloader(f.config, opts, logger)
		if err != nil && !(f.allowEmptyConfig && errors.Is(err, config.ErrEmpty)) {
			return nil, err
		}
		return r, nil
	case "xds":
	default:
		return nil, fmt.Errorf("--config-source %q: want file or xds", s.kind)
	}
	if f.config != "" || f.allowEmptyConfig {
		return nil, errors.New("--config and --allow-empty-config are for files; with --config-source=xds the limits come from --xds-server")
	}
	if s.xdsServer == "" {
		return nil, errors.New("--config-source=xds needs --xds-server")
	}
	xo := xds.Options{Server: s.xdsServer, NodeID: s.xdsNodeID, BackoffInitial: s.xdsBackoffInitial,
		BackoffMax: s.xdsBackoffMax, Jitter: s.xdsJitter, MaxRecvMsgSize: s.xdsMaxRecvMsgSize, Config: opts, Logger: logger,
		OnIgnoredField: s.ignoredField}
	if s.xdsJitter <= 0 {
		xo.Jitter = -1 // none; 0 would mean the default
	}
	var err error
	if xo.NodeMetadata, err = pairs(s.xdsNodeMetadata, "="); err != nil {
		return nil, fmt.Errorf("--xds-node-metadata: %w", err)
	}
	if xo.Headers, err = pairs(s.xdsHeaders, ":"); err != nil {
		// The headers carry tokens: the error does not quote them.
		return nil, errors.New("--xds-headers: want key:value,key2:value2 (an entry has no ':' or no key)")
	}
	if s.xdsTLS || s.xdsCert != "" || s.xdsKey != "" || s.xdsCA != "" || s.xdsName != "" {
		if xo.TLS, err = xds.ClientTLS(s.xdsCert, s.xdsKey, s.xdsCA, s.xdsName); err != nil {
			return nil, fmt.Errorf("--xds-tls-*: %w", err)
		}
	}
	c, err := xds.New(xo)
	if err != nil {
		return nil, err
	}
	var initial *config.Table
	if s.startWithoutConfig {
		initial = config.Empty()
	}
	r := config.NewSourceReloader(c, initial, logger)
	if s.xdsOverlay != "" {
		// At startup there is no overlay to keep: a bad one stops serve.
		if err := r.LoadOverlay(s.xdsOverlay); err != nil {
			return nil, fmt.Errorf("--xds-overlay: %w", err)
		}
	}
	return r, nil
}

// configName names the config source in the "serving" log line.
func (f *serveFlags) configName() string {
	if f.source.kind == "xds" {
		return "xds " + shownValue("xds-server", f.source.xdsServer)
	}
	return f.config
}

// pairs parses "k=v,k2=v2" (sep "=") into a map; "" is none.
func pairs(s, sep string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	m := map[string]string{}
	for item := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(item, sep)
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("%q: want key%svalue", item, sep)
		}
		m[k] = strings.TrimSpace(v)
	}
	return m, nil
}

// The config source's variables: CONFIG_TYPE chooses files (RUNTIME_*)
// or xDS (CONFIG_GRPC_XDS_* and XDS_CLIENT_*, with the reference's
// defaults).
var sourceRefVars = []refVar{
	{name: "CONFIG_TYPE", flag: "config-source", conv: refConv{
		doc: "in any case: `FILE`, files (the default); `GRPC_XDS_SOTW`, `xds`; others refused",
		fn: func(_ *refEnv, v string) (string, error) {
			switch strings.ToUpper(v) {
			case "FILE":
				return "", nil // the default
			case "GRPC_XDS_SOTW":
				return "xds", nil
			}
			return "", fmt.Errorf("CONFIG_TYPE=%s is not supported (want FILE or GRPC_XDS_SOTW)", v)
		}}},
	{name: "RUNTIME_ROOT", when: onFiles, flag: "config", def: "/srv/runtime_data/current", conv: refConv{
		doc: "as `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY` (`config` when unset), when `RUNTIME_ROOT` or `RUNTIME_SUBDIRECTORY` is set",
		fn: func(e *refEnv, root string) (string, error) {
			sub := e.getenv("RUNTIME_SUBDIRECTORY")
			if !e.has("RUNTIME_ROOT") && sub == "" {
				return "", nil
			}
			app := e.getenv("RUNTIME_APPDIRECTORY")
			if app == "" {
				app = "config"
			}
			return filepath.Join(root, sub, app), nil
		}}},
	{name: "RUNTIME_SUBDIRECTORY", with: "RUNTIME_ROOT"},
	{name: "RUNTIME_APPDIRECTORY", with: "RUNTIME_ROOT"},
	// Files starting with a dot are always ignored, and the config
	// directory is watched with its symlinks (a ConfigMap's ..data swap),
	// which covers both RUNTIME_WATCH_ROOT values.
	{name: "RUNTIME_IGNOREDOTFILES", boolean: true, differs: "dot files are always skipped (the reference's default, `false`, loads them)", apply: refApply{
		doc: "`true` is what Sluice does: files starting with a dot are skipped; `false` is ignored with a warning",
		fn: func(e *refEnv, v string) error {
			if v == "false" {
				e.warn("RUNTIME_IGNOREDOTFILES=false is ignored: files starting with a dot are always ignored")
			}
			return nil
		}}},
	{name: "RUNTIME_WATCH_ROOT", boolean: true, note: "what Sluice does either way: the config directory is watched with its symlinks (a ConfigMap's `..data` swap)"},
	{name: "MERGE_DOMAIN_CONFIG", flag: "merge-domains"},
	{name: "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", flag: "require-domain"},
	{name: "FORCE_START_WITHOUT_INITIAL_CONFIG", boolean: true, when: onXDS, flag: "start-without-config",
		unmet:   ": it applies to CONFIG_TYPE=GRPC_XDS_SOTW (with files see --allow-empty-config)",
		differs: "unset or `false`, NOT_SERVING until a push compiles (the reference serves with no config and answers errors)"},
	{name: "CONFIG_GRPC_XDS_SERVER_URL", when: onXDS, flag: "xds-server", def: "localhost:18000"},
	{name: "CONFIG_GRPC_XDS_NODE_ID", when: onXDS, flag: "xds-node-id"},
	// The reference skips a metadata entry without '=' (its own settings
	// comment shows "key1:val1,key2=val2"); so does Sluice, with a warning.
	{name: "CONFIG_GRPC_XDS_NODE_METADATA", when: onXDS, flag: "xds-node-metadata", conv: refConv{
		doc: "an entry without `=` skipped with a warning, as the reference skips it",
		fn: func(e *refEnv, v string) (string, error) {
			var kept []string
			for item := range strings.SplitSeq(v, ",") {
				if strings.Contains(item, "=") {
					kept = append(kept, item)
				} else {
					e.warn("CONFIG_GRPC_XDS_NODE_METADATA: entry %q has no '=': skipped, as the reference skips it", item)
				}
			}
			return strings.Join(kept, ","), nil
		}}},
	{name: "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", when: onXDS, flag: "xds-headers"},
	{name: "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", when: onXDS, ignore: "reconnections follow XDS_CLIENT_BACKOFF_* (--xds-backoff-*)"},
	// The reference reads the TLS files only with USE_TLS=true.
	{name: "CONFIG_GRPC_XDS_SERVER_USE_TLS", boolean: true, when: onXDS, flag: "xds-tls"},
	{name: "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", when: onXDSTLS, unmet: xdsNoTLS, flag: "xds-tls-cert"},
	{name: "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", when: onXDSTLS, unmet: xdsNoTLS, flag: "xds-tls-key"},
	{name: "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", when: onXDSTLS, unmet: xdsNoTLS, flag: "xds-tls-ca"},
	{name: "CONFIG_GRPC_XDS_SERVER_TLS_SAN", when: onXDSTLS, unmet: xdsNoTLS, flag: "xds-tls-server-name"},
	{name: "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", when: onXDS, flag: "xds-backoff-initial", differs: "unset, 500ms (the reference's default: 10s)"},
	{name: "XDS_CLIENT_BACKOFF_MAX_INTERVAL", when: onXDS, flag: "xds-backoff-max", differs: "unset, 30s (the reference's default: 60s)"},
	{name: "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", when: onXDS, flag: "xds-backoff-jitter"},
	// After XDS_CLIENT_BACKOFF_RANDOM_FACTOR, which false overrides.
	{name: "XDS_CLIENT_BACKOFF_JITTER", boolean: true, when: onXDS, flag: "xds-backoff-jitter", conv: refConv{
		doc: "`false` as `0` (no jitter)",
		fn: func(_ *refEnv, v string) (string, error) {
			if v == "false" {
				return "0", nil
			}
			return "", nil
		}}},
	{name: "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", when: onXDS, flag: "xds-max-recv-msg-size"},
}

const xdsNoTLS = " without CONFIG_GRPC_XDS_SERVER_USE_TLS=true (as in the reference)"

var (
	onXDS    = &refCond{doc: "`CONFIG_TYPE=GRPC_XDS_SOTW`", holds: xdsSource}
	onFiles  = &refCond{doc: "`CONFIG_TYPE=FILE` (the default)", holds: func(e *refEnv) bool { return !xdsSource(e) }}
	onXDSTLS = &refCond{within: onXDS, doc: "`CONFIG_GRPC_XDS_SERVER_USE_TLS=true`",
		holds: func(e *refEnv) bool { return e.on("CONFIG_GRPC_XDS_SERVER_USE_TLS") }}
)

func xdsSource(e *refEnv) bool { return strings.ToUpper(e.getenv("CONFIG_TYPE")) == "GRPC_XDS_SOTW" }
