package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

const mainModule = "github.com/sluicehq/sluice"

// TestRelease checks a dist directory that `make release` or `make
// release-check` built (SLUICE_RELEASE_DIST, of SLUICE_RELEASE_VERSION
// at SLUICE_RELEASE_COMMIT dated SLUICE_RELEASE_EPOCH): SHA256SUMS lists
// every archive and SBOM with its sum; each archive holds the binary,
// LICENSE and README.md, dated the commit's time; each binary is a
// static, trimmed build of its platform stamped with the version and
// commit (and, on this platform, prints them); each SBOM lists exactly
// the binary's modules, which are the build list's modules of the
// packages it links.
func TestRelease(t *testing.T) {
	dist := os.Getenv("SLUICE_RELEASE_DIST")
	if dist == "" {
		t.Skip("SLUICE_RELEASE_DIST is not set: `make release-check` and `make release` build a dist directory and run this test on it")
	}
	version, commit := os.Getenv("SLUICE_RELEASE_VERSION"), os.Getenv("SLUICE_RELEASE_COMMIT")
	epoch, err := strconv.ParseInt(os.Getenv("SLUICE_RELEASE_EPOCH"), 10, 64)
	if err != nil || version == "" || commit == "" {
		t.Fatalf("SLUICE_RELEASE_VERSION %q, SLUICE_RELEASE_COMMIT %q, SLUICE_RELEASE_EPOCH (%v) are needed", version, commit, err)
	}

	sums := readSums(t, filepath.Join(dist, "SHA256SUMS"))
	des, err := os.ReadDir(dist)
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, de := range des {
		if !de.Type().IsRegular() || de.Name() == "SHA256SUMS" {
			continue
		}
		listed = append(listed, de.Name())
		want, ok := sums[de.Name()]
		if !ok {
			t.Errorf("SHA256SUMS does not list %s", de.Name())
			continue
		}
		b, err := os.ReadFile(filepath.Join(dist, de.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if got := sha256.Sum256(b); hex.EncodeToString(got[:]) != want {
			t.Errorf("%s: sha256 %x, SHA256SUMS says %s", de.Name(), got, want)
		}
	}
	if names := slices.Sorted(maps.Keys(sums)); !slices.Equal(names, listed) {
		t.Errorf("SHA256SUMS lists %q, dist has %q", names, listed)
	}

	archiveName := regexp.MustCompile(`^sluice_` + regexp.QuoteMeta(version) + `_([a-z0-9]+)_([a-z0-9]+)\.(tar\.gz|zip)$`)
	var platforms int
	for _, name := range listed {
		m := archiveName.FindStringSubmatch(name)
		if m == nil {
			if !strings.HasSuffix(name, ".cdx.json") {
				t.Errorf("%s: neither an archive of %s nor an SBOM", name, version)
			}
			continue
		}
		platforms++
		goos, goarch, ext := m[1], m[2], m[3]
		t.Run(goos+"/"+goarch, func(t *testing.T) {
			if (goos == "windows") != (ext == "zip") {
				t.Errorf("%s: a %s archive for %s (want zip for windows, tar.gz for the rest)", name, ext, goos)
			}
			top := strings.TrimSuffix(name, "."+ext)
			bin := checkArchive(t, filepath.Join(dist, name), top, goos, time.Unix(epoch, 0))
			if bin == "" {
				return
			}
			bi := checkBinary(t, bin, goos, goarch, version, commit)
			if bi == nil {
				return
			}
			checkSBOM(t, filepath.Join(dist, top+".cdx.json"), bi, goos, goarch, version)
			checkBuildList(t, bi, goos, goarch)
		})
	}
	if platforms == 0 {
		t.Errorf("%s has no archive of %s", dist, version)
	}
}

// readSums reads a SHA256SUMS file: name -> hex sum.
func readSums(t *testing.T, name string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	sums := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		sum, file, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != 64 {
			t.Fatalf("%s: line %q: want HEX  NAME", name, sc.Text())
		}
		sums[file] = sum
	}
	return sums
}

// checkArchive checks an archive's entries and returns its binary
// written to a temporary file ("" if it has none).
func checkArchive(t *testing.T, name, top, goos string, mtime time.Time) string {
	t.Helper()
	exe := "sluice"
	if goos == "windows" {
		exe = "sluice.exe"
	}
	var names []string
	var bin []byte
	for _, e := range readArchive(t, name) {
		names = append(names, e.name)
		if !e.mtime.Equal(mtime) || e.uid != 0 || e.gid != 0 {
			t.Errorf("%s: mtime %v uid %d gid %d, want %v (the commit's time), 0, 0", e.name, e.mtime.UTC(), e.uid, e.gid, mtime.UTC())
		}
		wantMode := int64(0o644)
		if e.dir || e.name == top+"/"+exe {
			wantMode = 0o755
		}
		if e.mode != wantMode {
			t.Errorf("%s: mode %o, want %o", e.name, e.mode, wantMode)
		}
		switch strings.TrimPrefix(e.name, top+"/") {
		case "LICENSE", "README.md":
			src, err := os.ReadFile(filepath.Join("..", "..", filepath.Base(e.name)))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(e.data, src) {
				t.Errorf("%s differs from the tree's %s", e.name, filepath.Base(e.name))
			}
		case exe:
			bin = e.data
		}
	}
	if want := []string{top + "/", top + "/LICENSE", top + "/README.md", top + "/" + exe}; !slices.Equal(names, want) {
		t.Errorf("%s: entries %q, want %q", filepath.Base(name), names, want)
	}
	if bin == nil {
		return ""
	}
	path := filepath.Join(t.TempDir(), exe)
	if err := os.WriteFile(path, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// checkBinary checks how a binary was built and what it says it is.
func checkBinary(t *testing.T, path, goos, goarch, version, commit string) *buildinfo.BuildInfo {
	t.Helper()
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		t.Errorf("build info: %v", err)
		return nil
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
		if strings.HasPrefix(s.Key, "vcs") {
			t.Errorf("build setting %s=%s: the release is built with -buildvcs=false", s.Key, s.Value)
		}
	}
	for k, want := range map[string]string{"GOOS": goos, "GOARCH": goarch, "CGO_ENABLED": "0", "-trimpath": "true", "-buildmode": "exe"} {
		if settings[k] != want {
			t.Errorf("build setting %s=%q, want %q", k, settings[k], want)
		}
	}
	if bi.Path != mainModule+"/cmd/sluice" || bi.GoVersion != runtime.Version() {
		t.Errorf("binary of %s built with %s, want %s/cmd/sluice with %s", bi.Path, bi.GoVersion, mainModule, runtime.Version())
	}
	if goos == "linux" {
		f, err := elf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Error("the binary has an ELF interpreter: not static")
			}
		}
	}
	if goos == runtime.GOOS && goarch == runtime.GOARCH {
		out, err := exec.Command(path, "version").CombinedOutput()
		want := "sluice " + version + " (commit " + commit + ", " + runtime.Version() + ")\n"
		if err != nil || string(out) != want {
			t.Errorf("sluice version: %v, %q, want %q", err, out, want)
		}
	}
	return bi
}

// checkSBOM checks that the CycloneDX SBOM of a binary names it with the
// release's version and platform and lists exactly its modules (and the
// standard library of its Go version).
func checkSBOM(t *testing.T, path string, bi *buildinfo.BuildInfo, goos, goarch, version string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Error(err)
		return
	}
	type component struct{ Type, Name, Version, Purl string }
	var bom struct {
		BOMFormat   string `json:"bomFormat"`
		SpecVersion string `json:"specVersion"`
		Metadata    struct{ Component component }
		Components  []component
	}
	if err := json.Unmarshal(b, &bom); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	platform := "goarch=" + goarch + "&goos=" + goos
	if c := bom.Metadata.Component; bom.BOMFormat != "CycloneDX" || c.Type != "application" || c.Name != mainModule ||
		c.Version != version || !strings.Contains(c.Purl, platform) {
		t.Errorf("%s: format %q, component %+v, want CycloneDX, the application %s %s for %s", filepath.Base(path), bom.BOMFormat, c, mainModule, version, platform)
	}
	want := map[string]string{"std": bi.GoVersion}
	for _, d := range bi.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		want[d.Path] = d.Version
	}
	got := map[string]string{}
	for _, c := range bom.Components {
		got[c.Name] = c.Version
		if !strings.Contains(c.Purl, platform) {
			t.Errorf("%s: component %s: purl %s, want %s", filepath.Base(path), c.Name, c.Purl, platform)
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("%s lists %v,\nthe binary has %v", filepath.Base(path), got, want)
	}
}

// checkBuildList checks that the binary's modules are those of the
// packages that cmd/sluice links on its platform, at the versions of
// go.mod's build list.
func checkBuildList(t *testing.T, bi *buildinfo.BuildInfo, goos, goarch string) {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}{{end}}{{end}}", mainModule+"/cmd/sluice")
	cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0", "GOFLAGS=")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	want := map[string]string{}
	for f := range strings.Lines(string(out)) {
		if path, v, ok := strings.Cut(strings.TrimSpace(f), " "); ok {
			want[path] = v
		}
	}
	got := map[string]string{}
	for _, d := range bi.Deps {
		got[d.Path] = d.Version
	}
	if !maps.Equal(got, want) {
		t.Errorf("the binary has modules %v,\ngo list -deps says %v", got, want)
	}
}
