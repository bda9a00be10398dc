package server

import (
	"bytes"
	"crypto/subtle"
	"fmt"
	"os"
	"sync"
)

// MinAdminTokenBytes is the shortest admin token accepted, in bytes of
// the file (`openssl rand -hex 32` writes 64: 256 random bits).
const MinAdminTokenBytes = 16

// AdminToken is the bearer token of the admin endpoints, read from a
// file and read again when the file changes (its size, modification time
// or inode), so that a rotated Kubernetes Secret or a rewritten file
// takes effect without a restart. Leading and trailing white space is
// not part of the token. Safe for concurrent use.
type AdminToken struct {
	path string

	mu    sync.Mutex
	read  os.FileInfo // the file as last read; nil if it could not be
	token []byte      // nil while the file cannot be read or holds no valid token
	err   error       // why token is nil
}

// NewAdminToken reads the token in path. It fails if the file cannot be
// read or holds a token shorter than MinAdminTokenBytes.
func NewAdminToken(path string) (*AdminToken, error) {
	t := &AdminToken{path: path}
	t.refresh()
	if t.err != nil {
		return nil, t.err
	}
	return t, nil
}

// Valid reports whether presented is the token in the file now, compared
// in constant time. It stats the file and reads it again if it changed;
// while it cannot be read, or holds no valid token, nothing is valid (the
// error says why: see Err).
func (t *AdminToken) Valid(presented []byte) bool {
	t.mu.Lock()
	t.refresh()
	token := t.token
	t.mu.Unlock()
	// (ConstantTimeCompare returns at once on a length mismatch: the
	// token's length is not a secret worth a padded compare.)
	return token != nil && subtle.ConstantTimeCompare(presented, token) == 1
}

// Err is why no token is valid now, nil when one is.
func (t *AdminToken) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// refresh reads the file again if its stamp changed. Callers hold mu,
// except NewAdminToken.
func (t *AdminToken) refresh() {
	fi, err := os.Stat(t.path)
	if err != nil {
		t.read, t.token, t.err = nil, nil, fmt.Errorf("server: admin token: %w", err)
		return
	}
	if p := t.read; p != nil && os.SameFile(p, fi) && p.Size() == fi.Size() && p.ModTime().Equal(fi.ModTime()) {
		return
	}
	b, err := os.ReadFile(t.path)
	t.read = fi
	switch tok := bytes.TrimSpace(b); {
	case err != nil:
		t.token, t.err = nil, fmt.Errorf("server: admin token: %w", err)
	case len(tok) < MinAdminTokenBytes:
		t.token, t.err = nil, fmt.Errorf("server: admin token in %s: %w", t.path, ErrShortToken)
	default:
		t.token, t.err = tok, nil
	}
}

// ErrShortToken is (wrapped) the error of a token file whose token is
// shorter than MinAdminTokenBytes.
var ErrShortToken = fmt.Errorf("token shorter than %d bytes", MinAdminTokenBytes)
