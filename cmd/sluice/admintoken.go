package main

import (
	"bytes"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/sluicehq/sluice/server"
)

// minAdminTokenBytes is the shortest admin token accepted, in bytes of
// the file (`openssl rand -hex 32` writes 64: 256 random bits).
const minAdminTokenBytes = 16

// errShortToken is (wrapped) the error of a token file whose token is
// shorter than minAdminTokenBytes.
var errShortToken = fmt.Errorf("token shorter than %d bytes", minAdminTokenBytes)

// minAdminTokenDistinct is the fewest distinct bytes a token may have: 16
// identical bytes, or a pattern of two or three, are not secrets. (A
// random token of 16 hex digits has fewer than 5 distinct ones about
// once in 10^8.)
const minAdminTokenDistinct = 5

// errWeakToken is (wrapped) the error of a token of fewer than
// minAdminTokenDistinct distinct bytes.
var errWeakToken = fmt.Errorf("token of fewer than %d distinct bytes: not a secret (make one with: openssl rand -hex 32)", minAdminTokenDistinct)

// checkToken returns what is wrong with tok as an admin token, or nil.
func checkToken(tok []byte) error {
	if len(tok) < minAdminTokenBytes {
		return errShortToken
	}
	var seen [256]bool
	n := 0
	for _, b := range tok {
		if !seen[b] {
			seen[b] = true
			n++
		}
	}
	if n < minAdminTokenDistinct {
		return errWeakToken
	}
	return nil
}

// adminToken is the bearer token of POST /v1/counters/reset
// (--admin-token-file), read from a file and read again when the file
// changes (its size, modification time or inode), so that a rotated
// Kubernetes Secret or a rewritten file takes effect without a restart.
// A file that could not be read is read again at the next check, so that
// fixing its permissions (which changes none of the three) is enough.
// Leading and trailing white space is not part of the token. It logs a
// WARN each time the file becomes unusable (or unusable for another
// reason), and an INFO when it is usable again. Safe for concurrent use.
type adminToken struct {
	path     string
	log      *slog.Logger
	readFile func(string) ([]byte, error) // os.ReadFile; tests make reads fail

	mu    sync.Mutex
	read  os.FileInfo // the file as last read; nil if it could not be
	token []byte      // nil while the file cannot be read or holds no valid token
	err   error       // why token is nil
}

var _ server.Authorizer = (*adminToken)(nil)

// newAdminToken reads the token in path. It fails if the file cannot be
// read or holds a token shorter than minAdminTokenBytes.
func newAdminToken(path string, log *slog.Logger) (*adminToken, error) {
	t := &adminToken{path: path, log: log, readFile: os.ReadFile}
	t.refresh()
	if t.err != nil {
		return nil, t.err
	}
	return t, nil
}

// Valid reports whether presented is the token in the file now, compared
// in constant time. It stats the file and reads it again if it changed
// (or could not be read); while it cannot be read, or holds no valid
// token, nothing is valid.
func (t *adminToken) Valid(presented []byte) bool {
	t.mu.Lock()
	t.refresh()
	token := t.token
	t.mu.Unlock()
	// (ConstantTimeCompare returns at once on a length mismatch: the
	// token's length is not a secret worth a padded compare.)
	return token != nil && subtle.ConstantTimeCompare(presented, token) == 1
}

// refresh reads the file again if its stamp changed or the last read
// failed, and logs a change of state. Callers hold mu, except
// newAdminToken.
func (t *adminToken) refresh() {
	fi, err := os.Stat(t.path)
	if err != nil {
		t.read = nil
		t.set(nil, fmt.Errorf("admin token: %w", err))
		return
	}
	if p := t.read; p != nil && os.SameFile(p, fi) && p.Size() == fi.Size() && p.ModTime().Equal(fi.ModTime()) {
		return
	}
	b, err := t.readFile(t.path)
	if err != nil {
		t.read = nil // read again next time: a chmod changes no stamp
		t.set(nil, fmt.Errorf("admin token: %w", err))
		return
	}
	t.read = fi
	tok := bytes.TrimSpace(b)
	if err := checkToken(tok); err != nil {
		t.set(nil, fmt.Errorf("admin token in %s: %w", t.path, err))
		return
	}
	if fi.Mode().Perm()&0o004 != 0 {
		// Warned, not refused: Kubernetes mounts a Secret 0644 unless
		// its defaultMode says otherwise, readable only inside the pod.
		t.log.Warn("the admin token file is readable by every user of this machine: anyone who can log in here can reset counters; "+
			"chmod 600 it (in Kubernetes: defaultMode: 0400 on the Secret's volume)", "token_file", t.path, "mode", fi.Mode().Perm().String())
	}
	t.set(tok, nil)
}

// set records the outcome of a stat or a read. A WARN says why resets
// are refused, once per reason: a file that stays unusable is checked at
// each reset, but logged only when it becomes so, or unusable for
// another reason.
func (t *adminToken) set(token []byte, err error) {
	first := t.token == nil && t.err == nil // newAdminToken's read: its caller reports an error
	switch {
	case first:
	case err != nil && (t.err == nil || t.err.Error() != err.Error()):
		t.log.Warn("counter resets refused until the admin token file is fixed", "err", err)
	case err == nil && t.err != nil:
		t.log.Info("admin token file usable again: counter resets accepted", "token_file", t.path)
	}
	t.token, t.err = token, err
}
