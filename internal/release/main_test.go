package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// archived is one entry read back from an archive.
type archived struct {
	name     string
	dir      bool
	mode     int64
	uid, gid int
	mtime    time.Time
	data     []byte
}

// readArchive reads a .tar.gz or .zip in entry order.
func readArchive(t *testing.T, name string) []archived {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var out []archived
	if strings.HasSuffix(name, ".zip") {
		zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range zr.File {
			rc, err := f.Open()
			if err != nil {
				t.Fatal(err)
			}
			data, err := io.ReadAll(rc)
			rc.Close()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, archived{name: f.Name, dir: f.Mode().IsDir(), mode: int64(f.Mode().Perm()),
				mtime: f.Modified, data: data})
		}
		return out
	}
	gz, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if gz.Name != "" || !gz.ModTime.IsZero() {
		t.Errorf("%s: gzip header name %q time %v, want neither", name, gz.Name, gz.ModTime)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if h.Format != tar.FormatUSTAR {
			t.Errorf("%s: %s: tar format %v, want USTAR", name, h.Name, h.Format)
		}
		out = append(out, archived{name: h.Name, dir: h.Typeflag == tar.TypeDir, mode: h.Mode,
			uid: h.Uid, gid: h.Gid, mtime: h.ModTime, data: data})
	}
}

// writeTree writes a release directory: a binary and two text files,
// with the given modes and modification time.
func writeTree(t *testing.T, dir string, binMode, textMode os.FileMode, mtime time.Time) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, mode := range map[string]os.FileMode{"sluice": binMode, "README.md": textMode, "LICENSE": textMode} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("contents of "+name), mode); err != nil {
			t.Fatal(err)
		}
		// WriteFile's mode is filtered by the umask; set it exactly.
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
}

// TestArchive_Reproducible: the same files give the same bytes whatever
// their modification times and the umask of the checkout; the entries
// are in name order under one top-level directory, dated mtime, owned by
// 0, with mode 0755 or 0644.
func TestArchive_Reproducible(t *testing.T) {
	const epoch = 1700000000
	for _, ext := range []string{"tar.gz", "zip"} {
		t.Run(ext, func(t *testing.T) {
			root := t.TempDir()
			a, b := filepath.Join(root, "a", "sluice_v1.0.0_linux_amd64"), filepath.Join(root, "b", "sluice_v1.0.0_linux_amd64")
			writeTree(t, a, 0o755, 0o644, time.Unix(1, 0))
			writeTree(t, b, 0o700, 0o664, time.Now())
			var outs [][]byte
			for _, dir := range []string{a, b} {
				out := dir + "." + ext
				if code := run([]string{"archive", "-mtime", "1700000000", "-o", out, dir}, t.Output()); code != 0 {
					t.Fatalf("archive %s: exit %d", dir, code)
				}
				data, err := os.ReadFile(out)
				if err != nil {
					t.Fatal(err)
				}
				outs = append(outs, data)
			}
			if !bytes.Equal(outs[0], outs[1]) {
				t.Fatal("two archives of the same files differ")
			}
			got := readArchive(t, a+"."+ext)
			top := "sluice_v1.0.0_linux_amd64/"
			var names []string
			for _, e := range got {
				names = append(names, e.name)
				wantMode := int64(0o644)
				if e.dir || strings.HasSuffix(e.name, "/sluice") {
					wantMode = 0o755
				}
				if e.mode != wantMode || e.uid != 0 || e.gid != 0 || !e.mtime.Equal(time.Unix(epoch, 0)) {
					t.Errorf("%s: mode %o uid %d gid %d mtime %v, want %o, 0, 0, %v", e.name, e.mode, e.uid, e.gid, e.mtime.UTC(), wantMode, time.Unix(epoch, 0).UTC())
				}
				if !e.dir && string(e.data) != "contents of "+strings.TrimPrefix(e.name, top) {
					t.Errorf("%s: contents %q", e.name, e.data)
				}
			}
			if want := []string{top, top + "LICENSE", top + "README.md", top + "sluice"}; !slices.Equal(names, want) {
				t.Errorf("entries %q, want %q", names, want)
			}
		})
	}
}

// TestArchive_Errors: bad input is refused with the reason, and no
// partial archive is left behind.
func TestArchive_Errors(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "rel")
	writeTree(t, dir, 0o755, 0o644, time.Now())
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"archive", "-mtime", "1", "-o", dir + ".tar.gz", dir}, "sub: not a regular file"},
		{[]string{"archive", "-mtime", "1", "-o", dir + ".tar.xz", dir}, "unknown archive format"},
		{[]string{"archive", "-mtime", "1", "-o", empty + ".tar.gz", empty}, "no files"},
		{[]string{"archive", "-o", dir + ".tar.gz", dir}, "usage: release archive"},
		{[]string{"sums", "-o", filepath.Join(t.TempDir(), "SUMS"), filepath.Join(dir, "LICENSE"), filepath.Join(t.TempDir(), "LICENSE")}, "two files named LICENSE"},
		{[]string{"sign"}, `unknown command "sign"`},
	}
	for _, c := range cases {
		var stderr bytes.Buffer
		if code := run(c.args, &stderr); code == 0 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%q: exit %d, stderr %q, want an error with %q", c.args, code, stderr.String(), c.want)
		}
	}
	for _, out := range []string{dir + ".tar.gz", dir + ".tar.xz", empty + ".tar.gz"} {
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("%s left behind (%v)", out, err)
		}
	}
}

// TestSums: the file is in sha256sum's format, in name order, and
// `sha256sum -c` accepts it, then refuses it once a file changes.
func TestSums(t *testing.T) {
	dir := t.TempDir()
	for name, data := range map[string]string{"b.zip": "zip", "a.tar.gz": "tar", "a.cdx.json": ""} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "SHA256SUMS")
	if code := run([]string{"sums", "-o", out, filepath.Join(dir, "b.zip"), filepath.Join(dir, "a.tar.gz"), filepath.Join(dir, "a.cdx.json")}, t.Output()); code != 0 {
		t.Fatalf("exit %d", code)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	// The sums as sha256sum printed them.
	want := "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  a.cdx.json\n" +
		"90aebae315675cbf04612de4f7d5874850f48e0b8dd82becbeaa47ca93f5ebfb  a.tar.gz\n" +
		"4a70fe9aa6436e02c2dea340fbd1e352e4ef2d8ce6ca52ad25d4b95471fc8bf2  b.zip\n"
	if string(got) != want {
		t.Errorf("SHA256SUMS:\n%s\nwant:\n%s", got, want)
	}
	if _, err := exec.LookPath("sha256sum"); err != nil {
		t.Skip("no sha256sum")
	}
	check := func() error {
		cmd := exec.Command("sha256sum", "-c", "SHA256SUMS")
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		t.Logf("sha256sum -c:\n%s", out)
		return err
	}
	if err := check(); err != nil {
		t.Fatalf("sha256sum -c: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "b.zip"), []byte("zip!"), 0o644); err != nil {
		t.Fatal(err)
	}
	if check() == nil {
		t.Error("sha256sum -c accepted a changed file")
	}
}
