package main

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/logbuf"
)

const adminTestToken = "s3cret-admin-token-0123456789"

// newTestToken writes content to a token file and reads it; the logs
// are returned.
func newTestToken(t *testing.T, content string) (*adminToken, string, *logbuf.Buffer) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	writeToken(t, path, content)
	logs := &logbuf.Buffer{}
	tok, err := newAdminToken(path, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return tok, path, logs
}

func writeToken(t *testing.T, path, token string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestAdminToken_Reread: the token file is read again when it changes,
// rewritten in place (another length) or replaced by a rename (same
// length); while it is missing or too short no token is valid; white
// space around the token is not part of it.
func TestAdminToken_Reread(t *testing.T) {
	tok, path, _ := newTestToken(t, "  "+adminTestToken+"\n")
	valid := func(step, token string, want bool) {
		t.Helper()
		if got := tok.Valid([]byte(token)); got != want {
			t.Errorf("%s: Valid(%q) = %v, want %v", step, token, got, want)
		}
	}
	valid("first", adminTestToken, true)
	valid("first", adminTestToken+"x", false)
	valid("first", "", false)
	second := "another-token-of-another-length"
	writeToken(t, path, second)
	valid("rewritten", adminTestToken, false)
	valid("rewritten", second, true)
	third := strings.ToUpper(second) // same length
	writeToken(t, path+".new", third)
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	valid("renamed over", second, false)
	valid("renamed over", third, true)
	writeToken(t, path, "short")
	valid("too short", "short", false)
	os.Remove(path)
	valid("removed", third, false)
	writeToken(t, path, third)
	valid("back", third, true)
}

// TestAdminToken_ReadFailsThenFixed: a file that could not be read (its
// permissions) is read again at the next check, though fixing them
// changes neither its size, its modification time nor its inode: the
// token works again without a change of content. (Tests run as root
// here, whom chmod 000 does not stop: the read is made to fail.)
func TestAdminToken_ReadFailsThenFixed(t *testing.T) {
	tok, path, logs := newTestToken(t, adminTestToken)
	denied := func(string) ([]byte, error) { return nil, &fs.PathError{Op: "open", Path: path, Err: fs.ErrPermission} }
	tok.readFile = denied
	second := "rotated-admin-token-0123456789"
	writeToken(t, path, second) // a rotation whose file cannot be read
	for i := range 5 {
		if tok.Valid([]byte(second)) || tok.Valid([]byte(adminTestToken)) {
			t.Fatalf("check %d: a token is valid while the file cannot be read", i)
		}
	}
	tok.readFile = os.ReadFile // chmod 600: no stamp changes
	if !tok.Valid([]byte(second)) {
		t.Error("the file readable again: its token is not valid")
	}
	if l := logs.String(); strings.Count(l, "level=WARN") != 1 || !strings.Contains(l, "permission denied") ||
		strings.Count(l, "level=INFO") != 1 {
		t.Errorf("log %q, want one WARN with the reason and one INFO once fixed", l)
	}
}

// TestAdminToken_WarnsOncePerState: refused checks while the file is
// unusable log one WARN per reason the file is unusable (missing, then
// a directory, then too short), not one per check; a file usable again
// logs an INFO, and breaking it again warns again. The token is in no
// log line.
func TestAdminToken_WarnsOncePerState(t *testing.T) {
	tok, path, logs := newTestToken(t, adminTestToken)
	refuse := func(step string, n int) {
		t.Helper()
		for range n {
			if tok.Valid([]byte(adminTestToken)) {
				t.Fatalf("%s: the token is valid", step)
			}
		}
	}
	os.Remove(path)
	refuse("removed", 10)
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	refuse("a directory", 10)
	os.Remove(path)
	writeToken(t, path, "short")
	refuse("too short", 10)
	writeToken(t, path, adminTestToken)
	for range 10 {
		if !tok.Valid([]byte(adminTestToken)) {
			t.Fatal("fixed: the token is not valid")
		}
	}
	os.Remove(path)
	refuse("removed again", 10)
	l := logs.String()
	lines := strings.Split(strings.TrimSpace(l), "\n")
	want := []string{"no such file", "is a directory", "shorter than 16 bytes", "usable again", "no such file"}
	if len(lines) != len(want) {
		t.Fatalf("log:\n%s\nwant %d lines (one per change of state)", l, len(want))
	}
	for i, w := range want {
		if !strings.Contains(lines[i], w) {
			t.Errorf("log line %d %q lacks %q", i, lines[i], w)
		}
	}
	if strings.Contains(l, adminTestToken[:10]) {
		t.Errorf("the token is in the log: %q", l)
	}
}

func TestNewAdminToken_Errors(t *testing.T) {
	dir := t.TempDir()
	if _, err := newAdminToken(filepath.Join(dir, "missing"), slog.Default()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing file: %v, want ErrNotExist", err)
	}
	p := filepath.Join(dir, "short")
	writeToken(t, p, "  too-short  \n")
	if _, err := newAdminToken(p, slog.Default()); !errors.Is(err, errShortToken) || !strings.Contains(err.Error(), "shorter than 16 bytes") {
		t.Errorf("a short token: %v, want shorter than 16 bytes", err)
	}
}

// TestNewAdminToken_WeakTokens: a token of 16 identical bytes, or of a
// short pattern repeated, is refused with a clear error; a random-looking
// one of 16 bytes is taken.
func TestNewAdminToken_WeakTokens(t *testing.T) {
	dir := t.TempDir()
	for _, weak := range []string{strings.Repeat("a", 16), strings.Repeat("ab", 16), strings.Repeat("0123", 8)} {
		p := filepath.Join(dir, "weak")
		writeToken(t, p, weak)
		if _, err := newAdminToken(p, slog.Default()); !errors.Is(err, errWeakToken) || !strings.Contains(err.Error(), "openssl rand -hex 32") {
			t.Errorf("the token %q: %v, want %v", weak, err, errWeakToken)
		}
	}
	if _, _, logs := newTestToken(t, "9f2c41d0b7e85a63"); strings.Contains(logs.String(), "WARN") {
		t.Errorf("a good token file of mode 0600 warned: %s", logs)
	}
}

// TestAdminToken_WorldReadableWarns: a token file every user can read is
// taken (Kubernetes mounts Secrets 0644 by default) with a WARN that says
// how to fix it.
func TestAdminToken_WorldReadableWarns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	writeToken(t, path, adminTestToken)
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	logs := &logbuf.Buffer{}
	tok, err := newAdminToken(path, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if !tok.Valid([]byte(adminTestToken)) {
		t.Error("a world-readable token file's token is not valid")
	}
	if l := logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "readable by every user") || !strings.Contains(l, "chmod 600") {
		t.Errorf("logs %q, want a WARN saying the file is readable by every user and how to fix it", l)
	}
}
