package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/config/xds"
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
}

// openConfig returns the Reloader of the config source the flags choose.
// For files it has loaded them; an xDS source starts with no table, or an
// empty one with --start-without-config, until Run receives a push.
func (f *serveFlags) openConfig(logger *slog.Logger) (*config.Reloader, error) {
	opts := config.Options{MergeDomains: f.mergeDomains, MaxValueBytes: f.maxValueBytes}
	s := &f.source
	switch s.kind {
	case "file":
		if f.config == "" {
			return nil, errors.New("--config is required (a limits file or directory; see examples/config), or --config-source=xds")
		}
		if s.xdsServer != "" || s.startWithoutConfig {
			return nil, errors.New("--xds-server and --start-without-config need --config-source=xds")
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
		BackoffMax: s.xdsBackoffMax, Jitter: s.xdsJitter, MaxRecvMsgSize: s.xdsMaxRecvMsgSize, Config: opts, Logger: logger}
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
	return config.NewSourceReloader(c, initial, logger), nil
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

// xdsRefEnv maps envoyproxy/ratelimit's variables of CONFIG_TYPE=GRPC_XDS_SOTW
// onto the --xds-* flags, with the reference's defaults.
func xdsRefEnv(getenv func(string) string, set func(flag, value string)) (warnings []string, err error) {
	set("config-source", "xds")
	server := getenv("CONFIG_GRPC_XDS_SERVER_URL")
	if server == "" {
		server = "localhost:18000" // the reference's default
	}
	set("xds-server", server)
	for ref, fl := range map[string]string{
		"CONFIG_GRPC_XDS_NODE_ID":                   "xds-node-id",
		"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "xds-headers",
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL":       "xds-backoff-initial",
		"XDS_CLIENT_BACKOFF_MAX_INTERVAL":           "xds-backoff-max",
		"XDS_CLIENT_BACKOFF_RANDOM_FACTOR":          "xds-backoff-jitter",
		"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES":          "xds-max-recv-msg-size",
	} {
		if v := getenv(ref); v != "" {
			set(fl, v)
		}
	}
	// The reference skips a metadata entry without '=' (its own settings
	// comment shows "key1:val1,key2=val2"); so does Sluice, with a warning.
	if v := getenv("CONFIG_GRPC_XDS_NODE_METADATA"); v != "" {
		var kept []string
		for item := range strings.SplitSeq(v, ",") {
			if strings.Contains(item, "=") {
				kept = append(kept, item)
			} else {
				warnings = append(warnings, fmt.Sprintf("CONFIG_GRPC_XDS_NODE_METADATA: entry %q has no '=': skipped, as the reference skips it", item))
			}
		}
		if len(kept) > 0 {
			set("xds-node-metadata", strings.Join(kept, ","))
		}
	}
	if v := getenv("XDS_CLIENT_BACKOFF_JITTER"); v != "" {
		if on, err := refBool(getenv, "XDS_CLIENT_BACKOFF_JITTER"); err != nil {
			return nil, err
		} else if !on {
			set("xds-backoff-jitter", "0")
		}
	}
	force, err := refBool(getenv, "FORCE_START_WITHOUT_INITIAL_CONFIG")
	if err != nil {
		return nil, err
	}
	if force {
		set("start-without-config", "true")
	}
	// The reference reads the TLS files only with USE_TLS=true.
	useTLS, err := refBool(getenv, "CONFIG_GRPC_XDS_SERVER_USE_TLS")
	if err != nil {
		return nil, err
	}
	if useTLS {
		set("xds-tls", "true")
	}
	for _, m := range [][2]string{
		{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "xds-tls-cert"},
		{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "xds-tls-key"},
		{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "xds-tls-ca"},
		{"CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds-tls-server-name"},
	} {
		ref := m[0]
		switch v := getenv(ref); {
		case v == "":
		case useTLS:
			set(m[1], v)
		default:
			warnings = append(warnings, fmt.Sprintf("%s is ignored without CONFIG_GRPC_XDS_SERVER_USE_TLS=true (as in the reference)", ref))
		}
	}
	if getenv("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL") != "" {
		warnings = append(warnings, "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL is ignored: reconnections follow XDS_CLIENT_BACKOFF_* (--xds-backoff-*)")
	}
	return warnings, nil
}
