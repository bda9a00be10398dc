package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// testCA issues certificates for TLS tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a PEM certificate and key for 127.0.0.1 with serial.
func (ca *testCA) issue(t *testing.T, serial int64, client bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	usage := x509.ExtKeyUsageServerAuth
	if client {
		usage = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "sluice test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

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
	ca := newTestCA(t)
	dir := t.TempDir()
	certFile, keyFile, caFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	c, k := ca.issue(t, 100, false)
	write(t, certFile, c)
	write(t, keyFile, k)
	write(t, caFile, ca.pem)

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

	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	cc, ck := ca.issue(t, 200, true)
	clientCert, err := tls.X509KeyPair(cc, ck)
	if err != nil {
		t.Fatal(err)
	}
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

	if serial, err := dial(true); err != nil || serial != 100 {
		t.Fatalf("mTLS: serial %d err %v, want 100", serial, err)
	}
	if _, err := dial(false); err == nil {
		t.Error("a client without a certificate was accepted")
	}

	// Rotate: a new certificate appears; after the recheck interval the
	// next handshake serves it.
	c2, k2 := ca.issue(t, 101, false)
	write(t, certFile, c2)
	write(t, keyFile, k2)
	os.Chtimes(certFile, time.Now().Add(time.Minute), time.Now().Add(time.Minute))
	now.Add(int64(2 * time.Second))
	if serial, err := dial(true); err != nil || serial != 101 {
		t.Errorf("after rotation: serial %d err %v, want 101", serial, err)
	}

	// A broken rotation keeps the loaded certificate.
	write(t, certFile, []byte("not a certificate"))
	os.Chtimes(certFile, time.Now().Add(2*time.Minute), time.Now().Add(2*time.Minute))
	now.Add(int64(2 * time.Second))
	if serial, err := dial(true); err != nil || serial != 101 {
		t.Errorf("after a broken rotation: serial %d err %v, want 101 kept", serial, err)
	}

	if _, err := NewCertReloader(certFile, keyFile, "", nil); err == nil {
		t.Error("NewCertReloader accepted a broken certificate file")
	}
}
