package main

import (
	"archive/tar"
	"archive/zip"
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: release archive|sums [flags] ...")
		return 2
	}
	flags := flag.NewFlagSet("release "+args[0], flag.ContinueOnError)
	flags.SetOutput(stderr)
	out := flags.String("o", "", "output file")
	var err error
	switch args[0] {
	case "archive":
		mtime := flags.Int64("mtime", -1, "modification time of every entry, in seconds since the epoch")
		if flags.Parse(args[1:]) != nil {
			return 2
		}
		if *out == "" || *mtime < 0 || flags.NArg() != 1 {
			fmt.Fprintln(stderr, "usage: release archive -mtime SECONDS -o OUT.tar.gz|OUT.zip DIR")
			return 2
		}
		err = writeFile(*out, func(w io.Writer) error { return archive(w, *out, flags.Arg(0), time.Unix(*mtime, 0).UTC()) })
	case "sums":
		if flags.Parse(args[1:]) != nil {
			return 2
		}
		if *out == "" || flags.NArg() == 0 {
			fmt.Fprintln(stderr, "usage: release sums -o SHA256SUMS FILE...")
			return 2
		}
		err = writeFile(*out, func(w io.Writer) error { return sums(w, flags.Args()) })
	default:
		fmt.Fprintf(stderr, "release: unknown command %q (archive, sums)\n", args[0])
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// writeFile writes name with write, removing it on failure.
func writeFile(name string, write func(io.Writer) error) error {
	f, err := os.Create(name)
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	bw := bufio.NewWriter(f)
	err = write(bw)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("release: %w", cerr)
	}
	if err != nil {
		os.Remove(name)
	}
	return err
}

// entry is one file that an archive holds.
type entry struct {
	name string // base name
	mode int64  // 0755 or 0644
	data []byte
}

// readDir returns dir's files in name order (os.ReadDir's) with their
// normalised modes.
func readDir(dir string) ([]entry, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	var es []entry
	for _, de := range des {
		if !de.Type().IsRegular() {
			return nil, fmt.Errorf("release: %s: not a regular file", filepath.Join(dir, de.Name()))
		}
		info, err := de.Info()
		if err != nil {
			return nil, fmt.Errorf("release: %w", err)
		}
		data, err := os.ReadFile(filepath.Join(dir, de.Name()))
		if err != nil {
			return nil, fmt.Errorf("release: %w", err)
		}
		mode := int64(0o644)
		if info.Mode().Perm()&0o111 != 0 {
			mode = 0o755
		}
		es = append(es, entry{name: de.Name(), mode: mode, data: data})
	}
	if len(es) == 0 {
		return nil, fmt.Errorf("release: %s: no files", dir)
	}
	return es, nil
}

// archive writes dir's files to w as out's format (by its extension)
// under the directory filepath.Base(dir), every entry dated mtime.
func archive(w io.Writer, out, dir string, mtime time.Time) error {
	write := writeTarGz
	switch {
	case strings.HasSuffix(out, ".tar.gz"):
	case strings.HasSuffix(out, ".zip"):
		write = writeZip
	default:
		return fmt.Errorf("release: %s: unknown archive format (want .tar.gz or .zip)", out)
	}
	es, err := readDir(dir)
	if err != nil {
		return err
	}
	return write(w, filepath.Base(filepath.Clean(dir)), es, mtime)
}

func writeTarGz(w io.Writer, top string, es []entry, mtime time.Time) error {
	// The zero header: no name, no modification time.
	gz, err := gzip.NewWriterLevel(w, gzip.BestCompression)
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	tw := tar.NewWriter(gz)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: top + "/", Mode: 0o755, ModTime: mtime, Format: tar.FormatUSTAR}); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	for _, e := range es {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: top + "/" + e.name, Mode: e.mode,
			Size: int64(len(e.data)), ModTime: mtime, Format: tar.FormatUSTAR}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("release: %s: %w", h.Name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return fmt.Errorf("release: %s: %w", h.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	if err := gz.Close(); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	return nil
}

func writeZip(w io.Writer, top string, es []entry, mtime time.Time) error {
	zw := zip.NewWriter(w)
	dh := &zip.FileHeader{Name: top + "/", Modified: mtime}
	dh.SetMode(fs.ModeDir | 0o755)
	if _, err := zw.CreateHeader(dh); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	for _, e := range es {
		h := &zip.FileHeader{Name: top + "/" + e.name, Method: zip.Deflate, Modified: mtime}
		h.SetMode(fs.FileMode(e.mode))
		fw, err := zw.CreateHeader(h)
		if err != nil {
			return fmt.Errorf("release: %s: %w", h.Name, err)
		}
		if _, err := fw.Write(e.data); err != nil {
			return fmt.Errorf("release: %s: %w", h.Name, err)
		}
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	return nil
}

// sums writes the SHA-256 sums of files to w as `sha256sum` does, by
// base name in name order.
func sums(w io.Writer, files []string) error {
	byName := map[string]string{}
	for _, f := range files {
		name := filepath.Base(f)
		if _, dup := byName[name]; dup {
			return fmt.Errorf("release: two files named %s", name)
		}
		sum, err := sha256File(f)
		if err != nil {
			return err
		}
		byName[name] = sum
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		if strings.ContainsAny(n, "\\\n") {
			return fmt.Errorf("release: %q: a name that sha256sum would escape", n)
		}
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if _, err := fmt.Fprintf(w, "%s  %s\n", byName[n], n); err != nil {
			return fmt.Errorf("release: %w", err)
		}
	}
	return nil
}

func sha256File(name string) (string, error) {
	f, err := os.Open(name)
	if err != nil {
		return "", fmt.Errorf("release: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("release: %s: %w", name, err)
	}
	return fmt.Sprintf("%x", h.Sum(nil)), nil
}
