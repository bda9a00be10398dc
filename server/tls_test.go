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

// TestCertReloader_ClientSAN: with a client SAN, a handshake succeeds
// only with a client certificate valid for that name, as the reference's
// GRPC_CLIENT_TLS_SAN (x509 DNSName verification).
func TestCertReloader_ClientSAN(t *testing.T) {
	ca := testcert.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := ca.Server(t).WriteFiles(t, dir, "tls")
	caFile := ca.WriteFile(t, dir)
	for _, c := range []struct {
		san    string
		hosts  []string // the client certificate's SANs; none: no SAN at all
		accept bool
	}{
		{"client.example.com", []string{"client.example.com"}, true},
		{"client.example.com", []string{"other.example.com", "client.example.com"}, true},
		{"CLIENT.example.com", []string{"client.example.com"}, true},
		{"a.example.com", []string{"*.example.com"}, true},
		{"10.0.0.7", []string{"10.0.0.7"}, true},
		{"client.example.com", []string{"other.example.com"}, false},
		{"a.b.example.com", []string{"*.example.com"}, false},
		{"client.example.com", []string{"10.0.0.7"}, false},
		{"client.example.com", nil, false},
	} {
		r, err := NewCertReloaderSAN(certFile, keyFile, caFile, c.san, nil)
		if err != nil {
			t.Fatal(err)
		}
		client := ca.Client(t) // CN "sluice test client", no SAN
		if c.hosts != nil {
			client = ca.Peer(t, c.hosts...)
		}
		err = handshake(t, r.Config(), &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1",
			Certificates: []tls.Certificate{client.TLS(t)}})
		if (err == nil) != c.accept {
			t.Errorf("SAN %q, client certificate for %q: handshake error %v, want accepted %v", c.san, c.hosts, err, c.accept)
		}
	}
	if _, err := NewCertReloaderSAN(certFile, keyFile, "", "client.example.com", nil); err == nil {
		t.Error("a client SAN without a client CA was accepted")
	}
}

// handshake runs one TLS handshake over loopback and returns the
// server's error, if any, else the client's.
func handshake(t *testing.T, server, client *tls.Config) error {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	serverErr := make(chan error, 1)
	go func() {
		conn, err := lis.Accept()
		if err != nil {
			serverErr <- err
			return
		}
		defer conn.Close()
		serverErr <- conn.(*tls.Conn).Handshake()
	}()
	conn, err := tls.Dial("tcp", lis.Addr().String(), client)
	if err == nil {
		// TLS 1.3 reports a rejected client certificate on first read.
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		conn.Read(make([]byte, 1))
		conn.Close()
	}
	if err := <-serverErr; err != nil {
		return err
	}
	return err
}
