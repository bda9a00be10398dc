package server

import (
	"crypto/tls"
	"errors"
	"io"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testcert"
)

func write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestCertReloader serves TLS from files, requires client certificates,
// and picks up rotated files without a restart; a broken rotation keeps
// the old certificate.
func TestCertReloader(t *testing.T) {
	ca := testcert.NewCA(t)
	dir := t.TempDir()
	first := ca.Server(t)
	certFile, keyFile := first.WriteFiles(t, dir, "tls")
	caFile := ca.WriteFile(t, dir)

	r, err := NewCertReloader(certFile, keyFile, caFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	r.now = func() time.Time { return time.Unix(0, now.Load()) }

	lis, err := tls.Listen("tcp", "127.0.0.1:0", r.Config())
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			conn.(*tls.Conn).Handshake()
			conn.Close()
		}
	}()

	roots := ca.Pool()
	clientCert := ca.Client(t).TLS(t)
	// dial returns the server certificate's serial, or an error.
	dial := func(withCert bool) (int64, error) {
		cfg := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}
		if withCert {
			cfg.Certificates = []tls.Certificate{clientCert}
		}
		conn, err := tls.Dial("tcp", lis.Addr().String(), cfg)
		if err != nil {
			return 0, err
		}
		defer conn.Close()
		// TLS 1.3 reports a rejected client certificate on first read.
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Read(make([]byte, 1)); err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64(), nil
	}

	if serial, err := dial(true); err != nil || serial != first.Leaf.SerialNumber.Int64() {
		t.Fatalf("mTLS: serial %d err %v, want %d", serial, err, first.Leaf.SerialNumber)
	}
	if _, err := dial(false); err == nil {
		t.Error("a client without a certificate was accepted")
	}

	// Rotate: a new certificate appears; after the recheck interval the
	// next handshake serves it.
	second := ca.Server(t)
	second.WriteFiles(t, dir, "tls")
	want := second.Leaf.SerialNumber.Int64()
	os.Chtimes(certFile, time.Now().Add(time.Minute), time.Now().Add(time.Minute))
	now.Add(int64(2 * time.Second))
	if serial, err := dial(true); err != nil || serial != want {
		t.Errorf("after rotation: serial %d err %v, want %d", serial, err, want)
	}

	// A broken rotation keeps the loaded certificate.
	write(t, certFile, []byte("not a certificate"))
	os.Chtimes(certFile, time.Now().Add(2*time.Minute), time.Now().Add(2*time.Minute))
	now.Add(int64(2 * time.Second))
	if serial, err := dial(true); err != nil || serial != want {
		t.Errorf("after a broken rotation: serial %d err %v, want %d kept", serial, err, want)
	}

	if _, err := NewCertReloader(certFile, keyFile, "", nil); err == nil {
		t.Error("NewCertReloader accepted a broken certificate file")
	}
}
