package main

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/config/xds/xdstest"
)

// TestServe_XDSEnv maps the reference's xDS variables, with Envoy
// Gateway's values, onto the --xds-* flags.
func TestServe_XDSEnv(t *testing.T) {
	eg := serveEnv{
		"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit",
		"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "envoy-gateway:18001", "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/certs/tls.crt",
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "/certs/tls.key", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/certs/ca.crt",
		"FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
	}
	fs, warnings, err := parseServe(t, nil, eg)
	if err != nil {
		t.Fatal(err)
	}
	for flag, want := range map[string]string{
		"config-source": "xds", "xds-server": "envoy-gateway:18001", "xds-node-id": "envoy-ratelimit",
		"xds-tls": "true", "xds-tls-cert": "/certs/tls.crt", "xds-tls-key": "/certs/tls.key", "xds-tls-ca": "/certs/ca.crt",
		"start-without-config": "true", "config": "", "require-domain": "false",
	} {
		if got := flagValue(fs, flag); got != want {
			t.Errorf("Envoy Gateway's environment: --%s = %q, want %q", flag, got, want)
		}
	}
	if len(warnings) != 0 {
		t.Errorf("warnings %q", warnings)
	}

	// The reference's defaults, and the rest of its xDS variables.
	fs, warnings, err = parseServe(t, nil, serveEnv{"CONFIG_TYPE": "grpc_xds_sotw",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/c", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "3s",
		"CONFIG_GRPC_XDS_NODE_METADATA": "a=b,c:d", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "x-token:t",
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "2s", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "1m", "XDS_CLIENT_BACKOFF_JITTER": "false",
		"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": "8388608", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "true"})
	if err != nil {
		t.Fatal(err)
	}
	for flag, want := range map[string]string{
		"xds-server": "localhost:18000", "xds-node-id": "default", "xds-tls": "false", "xds-tls-cert": "",
		"xds-node-metadata": "a=b", "xds-headers": "x-token:t", "xds-backoff-initial": "2s", "xds-backoff-max": "1m0s",
		"xds-backoff-jitter": "0", "xds-max-recv-msg-size": "8388608", "start-without-config": "false", "require-domain": "true",
	} {
		if got := flagValue(fs, flag); got != want {
			t.Errorf("--%s = %q, want %q", flag, got, want)
		}
	}
	// An entry without '=' is skipped, as the reference skips it.
	all := strings.Join(warnings, "\n")
	if len(warnings) != 3 || !strings.Contains(all, "CONFIG_GRPC_XDS_CLIENT_TLS_CERT is ignored without CONFIG_GRPC_XDS_SERVER_USE_TLS=true") ||
		!strings.Contains(all, "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL is ignored") ||
		!strings.Contains(all, `CONFIG_GRPC_XDS_NODE_METADATA: entry "c:d" has no '='`) {
		t.Errorf("warnings %q", warnings)
	}

	for _, env := range []serveEnv{
		{"CONFIG_TYPE": "GRPC_XDS_SOTW", "FORCE_START_WITHOUT_INITIAL_CONFIG": "maybe"},
		{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_USE_TLS": "yes please"},
		{"CONFIG_TYPE": "GRPC_XDS_SOTW", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "soon"},
		{"CONFIG_TYPE": "GRPC_XDS_DELTA"},
	} {
		if _, _, err := parseServe(t, nil, env); err == nil {
			t.Errorf("%v: accepted", env)
		}
	}
	if _, warnings, err := parseServe(t, nil, serveEnv{"FORCE_START_WITHOUT_INITIAL_CONFIG": "true"}); err != nil ||
		len(warnings) != 1 || !strings.Contains(warnings[0], "FORCE_START_WITHOUT_INITIAL_CONFIG is ignored") {
		t.Errorf("FORCE_START_WITHOUT_INITIAL_CONFIG with files: %q %v", warnings, err)
	}
}

func TestServe_XDSBadSettings(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--config-source", "consul"}, `--config-source "consul": want file or xds`},
		{[]string{"--config-source", "xds"}, "--config-source=xds needs --xds-server"},
		{[]string{"--config-source", "xds", "--xds-server", "127.0.0.1:1", "--config", "testdata/serve"}, "--config and --allow-empty-config are for files"},
		{[]string{"--config-source", "xds", "--xds-server", "127.0.0.1:1", "--xds-node-metadata", "novalue"}, `--xds-node-metadata: "novalue": want key=value`},
		{[]string{"--config-source", "xds", "--xds-server", "127.0.0.1:1", "--xds-headers", "authorization=Bearer hunter2"}, `--xds-headers: want key:value`},
		{[]string{"--config-source", "xds", "--xds-server", "127.0.0.1:1", "--xds-tls-ca", "missing.crt"}, "--xds-tls-*: xds: CA: open missing.crt"},
		{[]string{"--config-source", "xds", "--xds-server", "127.0.0.1:1", "--xds-tls-cert", "c.pem"}, "--xds-tls-*: xds: a client certificate needs both"},
		{[]string{"--config", "testdata/serve", "--xds-server", "127.0.0.1:1"}, "--xds-server, --xds-overlay and --start-without-config need --config-source=xds"},
		{[]string{"--config", "testdata/serve", "--start-without-config"}, "--xds-server, --xds-overlay and --start-without-config need --config-source=xds"},
		{[]string{"--config", "testdata/serve", "--xds-overlay", "../../examples/overlay"}, "--xds-server, --xds-overlay and --start-without-config need --config-source=xds"},
		{[]string{"--config-source", "xds", "--xds-server", "127.0.0.1:1", "--xds-overlay", "missing"}, "--xds-overlay: config: stat missing: no such file or directory"},
		{[]string{"--config-source", "xds", "--xds-server", "127.0.0.1:1", "--xds-overlay", "../../config/testdata/overlay/owned.yaml"},
			"--xds-overlay: config: ../../config/testdata/overlay/owned.yaml:5: descriptors[0]: shadow_mode cannot be set in an overlay"},
		{[]string{"--config-source", "xds", "--xds-server", "127.0.0.1:1", "--default-algorithm", "leaky_bucket"}, `--default-algorithm "leaky_bucket": want fixed_window, sliding_window or token_bucket`},
		{nil, "--config is required"},
	} {
		err := serve(testCtx(t), append(c.args, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"), serveEnv{}.get, &strings.Builder{}, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("serve %q: %v, want %q (and no secret)", c.args, err, c.want)
		}
	}
}

func healthOf(t *testing.T, hc healthpb.HealthClient, httpAddr string) (healthpb.HealthCheckResponse_ServingStatus, int) {
	t.Helper()
	r, err := hc.Check(testCtx(t), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.Get("http://" + httpAddr + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return r.Status, res.StatusCode
}

// TestServe_XDS: limits pushed by an xDS server; health before the first
// push with and without --start-without-config, and with --require-domain.
func TestServe_XDS(t *testing.T) {
	xs := xdstest.Start(t, "127.0.0.1:0", nil)
	base := []string{"--config-source", "xds", "--xds-server", xs.Addr, "--xds-backoff-initial", "10ms"}
	req := rlsRequest("http", "generic_key", "default")

	// Without --start-without-config: NOT_SERVING and UNAVAILABLE.
	grpcAddr, httpAddr, stop := startServe(t, nil, append(base, "--xds-node-id", "envoy-ratelimit")...)
	rls, hc := dialRLS(t, grpcAddr)
	if st, code := healthOf(t, hc, httpAddr); st != healthpb.HealthCheckResponse_NOT_SERVING || code != 503 {
		t.Errorf("health before the first push: %v %d, want NOT_SERVING 503", st, code)
	}
	if _, err := rls.ShouldRateLimit(testCtx(t), req); status.Code(err) != codes.Unavailable {
		t.Errorf("a request before the first push: %v, want UNAVAILABLE", err)
	}
	// The push: serving, with the limits (2 per hour): OK, OK,
	// OVER_LIMIT; and after a bad push, which keeps the limits and their
	// counts, OVER_LIMIT still. Unless an hour ended meanwhile (about 1
	// run in 7,000): the window begins again (then only the limit in
	// force is checked).
	good := xdstest.Limits("eg/http", "http", "default", 2)
	good.Descriptors[0].RateLimit.Unit = ratelimitpb.RateLimitUnit_HOUR
	xs.Push(t, "envoy-ratelimit", "1", good)
	waitServing(t, hc)
	var got []rlspb.RateLimitResponse_Code
	ask := func(what string) {
		t.Helper()
		r, err := rls.ShouldRateLimit(testCtx(t), req)
		if err != nil || r.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() != 2 {
			t.Fatalf("%s: %v %v, want the pushed limit of 2", what, r, err)
		}
		got = append(got, r.OverallCode)
	}
	begin := time.Now()
	func() {
		for i := range 3 {
			ask(fmt.Sprint("request ", i))
		}
		// A bad push keeps the limits.
		bad := xdstest.Limits("eg/http", "http", "default", 5)
		bad.Descriptors[0].RateLimit.Unit = ratelimitpb.RateLimitUnit_UNKNOWN
		xs.Push(t, "envoy-ratelimit", "2", bad)
		nack := xs.Reply(t)
		for nack.GetErrorDetail() == nil { // the ACK of the first push
			nack = xs.Reply(t)
		}
		if !strings.Contains(nack.GetErrorDetail().GetMessage(), `resource "eg/http": descriptors[0]: rate_limit has no unit`) {
			t.Errorf("reply to the bad push: %v, want a NACK naming the resource and field", nack)
		}
		ask("after the bad push")
	}()
	if time.Now().Truncate(time.Hour).Equal(begin.Truncate(time.Hour)) {
		if want := []rlspb.RateLimitResponse_Code{rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OK,
			rlspb.RateLimitResponse_OVER_LIMIT, rlspb.RateLimitResponse_OVER_LIMIT}; !slices.Equal(got, want) {
			t.Errorf("three requests, a bad push and a fourth: %v, want %v (the old limit and its count kept)", got, want)
		}
	} else {
		t.Logf("an hour ended during the requests (%v): their codes are not checked", got)
	}
	// The reload metrics count pushes as they count file reloads.
	res, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{`sluice_config_reloads_total{result="success"} 1`, `sluice_config_reloads_total{result="failure"} 1`,
		"sluice_config_last_reload_successful 0"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// With --start-without-config: SERVING, and every request OK with no
	// limit.
	grpcAddr, httpAddr, stop = startServe(t, nil, append(base, "--start-without-config", "--xds-node-id", "forced")...)
	rls, hc = dialRLS(t, grpcAddr)
	if st, code := healthOf(t, hc, httpAddr); st != healthpb.HealthCheckResponse_SERVING || code != 200 {
		t.Errorf("health before the first push with --start-without-config: %v %d, want SERVING 200", st, code)
	}
	if r, err := rls.ShouldRateLimit(testCtx(t), req); err != nil || r.OverallCode != rlspb.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil {
		t.Errorf("answer before the first push: %v %v, want OK without a limit", r, err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// With --require-domain too: NOT_SERVING until a push with a domain.
	grpcAddr, httpAddr, _ = startServe(t, nil, append(base, "--start-without-config", "--require-domain", "--xds-node-id", "strict")...)
	_, hc = dialRLS(t, grpcAddr)
	if st, code := healthOf(t, hc, httpAddr); st != healthpb.HealthCheckResponse_NOT_SERVING || code != 503 {
		t.Errorf("health with --require-domain before the first push: %v %d, want NOT_SERVING 503", st, code)
	}
	xs.Push(t, "strict", "1", xdstest.Limits("eg/http", "http", "default", 2))
	waitServing(t, hc)
}

// waitServing watches health until it is SERVING.
func waitServing(t *testing.T, hc healthpb.HealthClient) {
	t.Helper()
	w, err := hc.Watch(testCtx(t), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		r, err := w.Recv()
		if err != nil {
			t.Fatalf("health watch: %v", err)
		}
		if r.Status == healthpb.HealthCheckResponse_SERVING {
			return
		}
	}
}
