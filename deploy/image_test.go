package deploy_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"debug/buildinfo"
	"debug/elf"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	ratelimitv3pb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/config/xds/xdstest"
	"github.com/sluicehq/sluice/internal/logbuf"
	"github.com/sluicehq/sluice/internal/testcert"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// ociFile is one entry of an image's file system.
type ociFile struct {
	typ  byte // tar.TypeReg, tar.TypeSymlink, tar.TypeDir
	mode int64
	link string
	data []byte
}

// ociImage is one platform's image read from an OCI archive: the
// platform its index entry names, its config and its layers applied in
// order.
type ociImage struct {
	platform string // os/architecture in the index
	config   struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
		Config       struct {
			User       string
			Entrypoint []string
			Cmd        []string
			Labels     map[string]string
		} `json:"config"`
	}
	files map[string]ociFile
}

// ociDesc is an OCI content descriptor.
type ociDesc struct {
	MediaType string
	Digest    string
	Platform  *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	}
}

// readOCI reads the one manifest list of an OCI archive (`podman
// manifest push --all --format oci ... oci-archive:`) and the image of
// each of its platforms, in the list's order.
func readOCI(t *testing.T, archive string) []*ociImage {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	blobs := map[string][]byte{}
	readTar(t, f, func(h *tar.Header, b []byte) { blobs[strings.TrimPrefix(h.Name, "./")] = b })
	blob := func(digest string) []byte {
		b, ok := blobs["blobs/"+strings.Replace(digest, ":", "/", 1)]
		if !ok {
			t.Fatalf("archive has no blob %s", digest)
		}
		return b
	}
	var top struct{ Manifests []ociDesc }
	if err := json.Unmarshal(blobs["index.json"], &top); err != nil || len(top.Manifests) != 1 {
		t.Fatalf("index.json: %v, %d manifests, want 1", err, len(top.Manifests))
	}
	if mt := top.Manifests[0].MediaType; mt != "application/vnd.oci.image.index.v1+json" {
		t.Fatalf("index.json names a %s, want a manifest list (application/vnd.oci.image.index.v1+json)", mt)
	}
	var list struct{ Manifests []ociDesc }
	if err := json.Unmarshal(blob(top.Manifests[0].Digest), &list); err != nil {
		t.Fatal(err)
	}
	var imgs []*ociImage
	for _, m := range list.Manifests {
		if m.Platform == nil {
			t.Fatalf("manifest list entry %s names no platform", m.Digest)
		}
		img := &ociImage{platform: m.Platform.OS + "/" + m.Platform.Architecture, files: map[string]ociFile{}}
		var manifest struct {
			Config ociDesc
			Layers []ociDesc
		}
		if err := json.Unmarshal(blob(m.Digest), &manifest); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(blob(manifest.Config.Digest), &img.config); err != nil {
			t.Fatal(err)
		}
		for _, l := range manifest.Layers {
			var r io.Reader = bytes.NewReader(blob(l.Digest))
			if strings.HasSuffix(l.MediaType, "gzip") {
				if r, err = gzip.NewReader(r); err != nil {
					t.Fatal(err)
				}
			}
			readTar(t, r, func(h *tar.Header, data []byte) {
				name := "/" + strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
				img.files[name] = ociFile{typ: h.Typeflag, mode: h.Mode, link: h.Linkname, data: data}
			})
		}
		imgs = append(imgs, img)
	}
	return imgs
}

// readTar calls fn with each entry of the tar stream r and its content.
func readTar(t *testing.T, r io.Reader, fn func(h *tar.Header, data []byte)) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		fn(h, data)
	}
}

// elfMachine is the ELF machine type of each architecture the image is
// built for.
var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// TestImage checks the multi-arch image that `make image-test` exports
// (SLUICE_IMAGE_ARCHIVE): one manifest list naming exactly the platforms
// of SLUICE_IMAGE_PLATFORMS, and for each platform its config (that
// os/architecture, non-root user, the reference's entry point, the OCI
// labels with the version, commit and commit time that make passes in
// SLUICE_IMAGE_*), its layout (a static /bin/sluice for that ELF machine
// and built for that GOARCH with the version and commit stamped,
// /bin/ratelimit the same binary, CA certificates, passwd; nothing else).
// The image of this host's platform then runs here: its `sluice
// version`, and its /bin/ratelimit as Envoy Gateway's default Deployment
// does, with that Deployment's environment against an xDS server and a
// local Redis. Images of other architectures cannot run here (no
// emulation); their binaries are checked by reading them.
func TestImage(t *testing.T) {
	archive := os.Getenv("SLUICE_IMAGE_ARCHIVE")
	if archive == "" {
		t.Skip("SLUICE_IMAGE_ARCHIVE is not set: `make image-test` builds, exports and tests the image")
	}
	imgs := readOCI(t, archive)
	var platforms []string
	for _, img := range imgs {
		platforms = append(platforms, img.platform)
	}
	wantPlatforms := strings.Fields(os.Getenv("SLUICE_IMAGE_PLATFORMS"))
	slices.Sort(platforms)
	slices.Sort(wantPlatforms)
	if len(wantPlatforms) == 0 || !slices.Equal(platforms, wantPlatforms) {
		t.Fatalf("manifest list platforms %q, want %q (SLUICE_IMAGE_PLATFORMS)", platforms, wantPlatforms)
	}
	ran := false
	for _, img := range imgs {
		t.Run(img.platform, func(t *testing.T) {
			bin := checkImage(t, img)
			if img.platform != runtime.GOOS+"/"+runtime.GOARCH {
				return
			}
			ran = true
			runImageBinary(t, bin)
		})
	}
	if !ran {
		t.Errorf("no image for this host's platform %s/%s: none was run", runtime.GOOS, runtime.GOARCH)
	}
}

// checkImage checks one platform's config, labels, layout and binary,
// and returns the binary.
func checkImage(t *testing.T, img *ociImage) []byte {
	t.Helper()
	goos, goarch, _ := strings.Cut(img.platform, "/")
	if img.config.OS != goos || img.config.Architecture != goarch {
		t.Errorf("config os/architecture %s/%s, want %s (the manifest list's)", img.config.OS, img.config.Architecture, img.platform)
	}
	c := img.config.Config
	if c.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532 (non-root)", c.User)
	}
	if !slices.Equal(c.Entrypoint, []string{"/bin/ratelimit"}) || len(c.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q, want [/bin/ratelimit] and none", c.Entrypoint, c.Cmd)
	}
	// make image-test passes what make image stamped.
	version, revision := os.Getenv("SLUICE_IMAGE_VERSION"), os.Getenv("SLUICE_IMAGE_REVISION")
	wantLabels := map[string]string{
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.revision": revision,
		"org.opencontainers.image.created":  os.Getenv("SLUICE_IMAGE_CREATED"),
		"org.opencontainers.image.source":   "https://github.com/sluicehq/sluice",
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.title":    "sluice",
	}
	for k, want := range wantLabels {
		if got := c.Labels[k]; got != want || got == "" {
			t.Errorf("label %s=%q, want %q (not empty)", k, got, want)
		}
	}
	if _, err := time.Parse(time.RFC3339, c.Labels["org.opencontainers.image.created"]); err != nil {
		t.Errorf("label org.opencontainers.image.created: %v", err)
	}
	var paths []string
	for p := range img.files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	want := []string{"/bin", "/bin/ratelimit", "/bin/sluice", "/etc", "/etc/group", "/etc/passwd", "/etc/ssl", "/etc/ssl/certs", "/etc/ssl/certs/ca-certificates.crt"}
	if !slices.Equal(paths, want) {
		t.Errorf("files %q, want %q", paths, want)
	}
	bin := img.files["/bin/sluice"]
	if bin.typ != tar.TypeReg || bin.mode&0o111 == 0 {
		t.Fatalf("/bin/sluice: type %c mode %o, want an executable file", bin.typ, bin.mode)
	}
	if rl := img.files["/bin/ratelimit"]; rl.typ != tar.TypeSymlink || rl.link != "sluice" {
		t.Errorf("/bin/ratelimit: type %c -> %q, want a symlink to sluice", rl.typ, rl.link)
	}
	e, err := elf.NewFile(bytes.NewReader(bin.data))
	if err != nil {
		t.Fatalf("/bin/sluice: %v", err)
	}
	if m, ok := elfMachine[goarch]; !ok || e.Machine != m {
		t.Errorf("/bin/sluice is an ELF for %v, want %v (%s)", e.Machine, elfMachine[goarch], goarch)
	}
	for _, p := range e.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("/bin/sluice has an ELF interpreter: not a static binary")
		}
	}
	bi, err := buildinfo.Read(bytes.NewReader(bin.data))
	if err != nil {
		t.Fatalf("/bin/sluice build info: %v", err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	for k, want := range map[string]string{"GOOS": goos, "GOARCH": goarch, "CGO_ENABLED": "0", "-trimpath": "true"} {
		if settings[k] != want {
			t.Errorf("/bin/sluice build setting %s=%q, want %q", k, settings[k], want)
		}
	}
	// The binary's stamp, read without running it (which only this
	// host's platform can): -trimpath leaves -ldflags out of the build
	// info, so look for the stamped strings themselves.
	for _, x := range []string{version, revision} {
		if !bytes.Contains(bin.data, []byte(x)) {
			t.Errorf("/bin/sluice does not hold %q (the labels' version and revision are stamped into it)", x)
		}
	}
	if !bytes.Contains(img.files["/etc/ssl/certs/ca-certificates.crt"].data, []byte("BEGIN CERTIFICATE")) {
		t.Error("no CA certificates")
	}
	if !bytes.Contains(img.files["/etc/passwd"].data, []byte("sluice:x:65532:65532:")) {
		t.Error("/etc/passwd has no sluice user")
	}
	return bin.data
}

// runImageBinary lays the image's binary out as in the image and runs
// it: `sluice version`, then /bin/ratelimit with Envoy Gateway's
// default Deployment's environment.
func runImageBinary(t *testing.T, bin []byte) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/sluice"), bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sluice", filepath.Join(dir, "bin/ratelimit")); err != nil {
		t.Fatal(err)
	}
	version, revision := os.Getenv("SLUICE_IMAGE_VERSION"), os.Getenv("SLUICE_IMAGE_REVISION")
	out, err := exec.Command(filepath.Join(dir, "bin/sluice"), "version").CombinedOutput()
	if want := "sluice " + version + " (commit " + revision + ", "; err != nil || !strings.HasPrefix(string(out), want) {
		t.Errorf("/bin/sluice version: %v, %q, want %q... (the labels' version and revision)", err, out, want)
	}
	runEnvoyGatewayDefault(t, filepath.Join(dir, "bin/ratelimit"))
}

// runEnvoyGatewayDefault runs binary with no arguments and the
// environment of Envoy Gateway's default Deployment, its certificates
// where the variables say, against a go-control-plane xDS server that
// requires the client certificate (xdstest), and checks that it takes the
// pushed limits, serves them over TLS and reports them on
// PROMETHEUS_ADDR with Envoy Gateway's mapping.
func runEnvoyGatewayDefault(t *testing.T, binary string) {
	b, err := os.ReadFile("../cmd/sluice/testdata/envoy-gateway/deployments.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var deps map[string][][2]string
	if err := yaml.Unmarshal(b, &deps); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for _, d := range []string{"certs", "etc/statsd-exporter"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ca := testcert.NewCA(t)
	ca.WriteFile(t, filepath.Join(root, "certs"))
	// /certs/tls.crt serves gRPC and is the xDS client's certificate.
	ca.Peer(t).WriteFiles(t, filepath.Join(root, "certs"), "tls")
	xs := xdstest.Start(t, "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{ca.Peer(t).TLS(t)},
		ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})
	xs.Push(t, "envoy-ratelimit", "1", &ratelimitpb.RateLimitConfig{Name: "eg", Domain: "eg", Descriptors: []*ratelimitpb.RateLimitDescriptor{{
		Key: "k", RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_HOUR, RequestsPerUnit: 1},
	}}})
	mapping, err := os.ReadFile("../observe/testdata/envoy-gateway-statsd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/statsd-exporter/conf.yaml"), mapping, 0o644); err != nil {
		t.Fatal(err)
	}
	redis := redistest.Start(t)

	env := []string{"PATH=/nonexistent"}
	for _, kv := range deps["default"] {
		k, v := kv[0], kv[1]
		switch {
		case strings.HasPrefix(v, "/certs/") || strings.HasPrefix(v, "/etc/"):
			v = root + v
		case k == "CONFIG_GRPC_XDS_SERVER_URL":
			v = xs.Addr
		case k == "REDIS_URL":
			v = redis.Addr
		case k == "PROMETHEUS_ADDR":
			v = "127.0.0.1:0"
		}
		env = append(env, k+"="+v)
	}
	// The test's own ports and flush interval.
	env = append(env, "HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "STATS_FLUSH_INTERVAL=20ms", "REDIS_TIMEOUT=1s")

	logs := &logbuf.Buffer{}
	cmd := exec.Command(binary)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-exited
		}
	}()
	var grpcAddr, httpAddr, metricsAddr string
	waitFor(t, exited, logs, func() bool {
		grpcAddr, httpAddr = logField(logs, "msg=serving", "grpc"), logField(logs, "msg=serving", "http")
		metricsAddr = logField(logs, `msg="envoyproxy/ratelimit metrics"`, "addr")
		return grpcAddr != "" && httpAddr != "" && metricsAddr != ""
	}, "the serving line")
	waitFor(t, exited, logs, func() bool { return strings.Contains(logs.String(), "xds: config applied (ACK)") }, "the xDS push")

	cc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if h, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health: %v %v\n%s", h, err, logs)
	}
	req := &rlspb.RateLimitRequest{Domain: "eg", Descriptors: []*ratelimitv3pb.RateLimitDescriptor{
		{Entries: []*ratelimitv3pb.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	for i, want := range []rlspb.RateLimitResponse_Code{rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OVER_LIMIT} {
		resp, err := rlspb.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, req)
		if err != nil || resp.OverallCode != want {
			t.Fatalf("request %d: %v %v, want %v", i+1, resp.GetOverallCode(), err, want)
		}
	}
	if body := get(t, "http://"+httpAddr+"/healthcheck"); !strings.Contains(body, "OK") {
		t.Errorf("/healthcheck: %q", body)
	}
	series := `ratelimit_service_rate_limit_over_limit{domain="eg",key1="k"} 1`
	waitFor(t, exited, logs, func() bool { return strings.Contains(get(t, "http://"+metricsAddr+"/metrics"), series) }, series)

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v\n%s", err, logs)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no exit 30s after SIGTERM")
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// waitFor polls cond until it holds; it fails t if the process exits or
// 30 seconds pass first.
func waitFor(t *testing.T, exited <-chan error, logs *logbuf.Buffer, cond func() bool, what string) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for !cond() {
		select {
		case err := <-exited:
			t.Fatalf("exited (%v) before %s:\n%s", err, what, logs)
		case <-deadline:
			t.Fatalf("no %s within 30s:\n%s", what, logs)
		case <-tick.C:
		}
	}
}

// logField returns key's value on the first log line containing marker.
func logField(logs *logbuf.Buffer, marker, key string) string {
	for line := range strings.Lines(logs.String()) {
		if !strings.Contains(line, marker) {
			continue
		}
		for f := range strings.FieldsSeq(line) {
			if v, ok := strings.CutPrefix(f, key+"="); ok {
				return v
			}
		}
	}
	return ""
}
