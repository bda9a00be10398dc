// Package testcert issues short-lived TLS certificates for tests: a CA,
// server certificates for loopback (or named) hosts and client
// certificates, as PEM, as files in a test's directory, or as TLS
// configuration. Keys are ECDSA P-256; everything is valid from an hour
// ago to an hour from now.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// DefaultHosts are the names a server certificate covers when none are
// given.
var DefaultHosts = []string{"127.0.0.1", "localhost"}

// CA is a self-signed certificate authority. Safe for concurrent use.
type CA struct {
	// Cert is the CA's certificate; PEM is it encoded.
	Cert *x509.Certificate
	PEM  []byte

	key    *ecdsa.PrivateKey
	serial atomic.Int64 // the last serial number issued
}

// Cert is an issued certificate and its key.
type Cert struct {
	// Leaf is the parsed certificate; its serial number tells
	// certificates of one CA apart.
	Leaf            *x509.Certificate
	CertPEM, KeyPEM []byte
}

// NewCA returns a new CA. It fails t on error.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key := newKey(t)
	ca := &CA{key: key}
	ca.serial.Store(1)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	ca.Cert, ca.PEM = create(t, tmpl, tmpl, key, key)
	return ca
}

// Server issues a server certificate for hosts (IP addresses or DNS
// names), DefaultHosts when none are given.
func (ca *CA) Server(t testing.TB, hosts ...string) *Cert {
	t.Helper()
	return ca.named(t, hosts, x509.ExtKeyUsageServerAuth)
}

// Peer issues a certificate for hosts (DefaultHosts when none are given)
// that serves and also authenticates as a client, as Envoy Gateway's
// certgen issues each component's tls.crt.
func (ca *CA) Peer(t testing.TB, hosts ...string) *Cert {
	t.Helper()
	return ca.named(t, hosts, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
}

func (ca *CA) named(t testing.TB, hosts []string, usages ...x509.ExtKeyUsage) *Cert {
	t.Helper()
	if len(hosts) == 0 {
		hosts = DefaultHosts
	}
	tmpl := ca.leaf(usages...)
	tmpl.Subject.CommonName = hosts[0]
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.issue(t, tmpl)
}

// Client issues a client certificate.
func (ca *CA) Client(t testing.TB) *Cert {
	t.Helper()
	tmpl := ca.leaf(x509.ExtKeyUsageClientAuth)
	tmpl.Subject.CommonName = "sluice test client"
	return ca.issue(t, tmpl)
}

// Pool returns a pool that trusts only ca.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// ClientConfig returns a client configuration that trusts ca and
// presents a new client certificate from it.
func (ca *CA) ClientConfig(t testing.TB) *tls.Config {
	t.Helper()
	return &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Client(t).TLS(t)}, MinVersion: tls.VersionTLS12}
}

// WriteFile writes ca's PEM to dir/ca.crt and returns its path.
func (ca *CA) WriteFile(t testing.TB, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "ca.crt")
	write(t, p, ca.PEM)
	return p
}

// TLS returns c as a tls.Certificate.
func (c *Cert) TLS(t testing.TB) tls.Certificate {
	t.Helper()
	tc, err := tls.X509KeyPair(c.CertPEM, c.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return tc
}

// WriteFiles writes c to dir/name.crt and its key to dir/name.key,
// replacing earlier files, and returns their paths.
func (c *Cert) WriteFiles(t testing.TB, dir, name string) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	write(t, certFile, c.CertPEM)
	write(t, keyFile, c.KeyPEM)
	return certFile, keyFile
}

func (ca *CA) leaf(usages ...x509.ExtKeyUsage) *x509.Certificate {
	return &x509.Certificate{SerialNumber: big.NewInt(ca.serial.Add(1)),
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: usages, KeyUsage: x509.KeyUsageDigitalSignature}
}

func (ca *CA) issue(t testing.TB, tmpl *x509.Certificate) *Cert {
	t.Helper()
	key := newKey(t)
	leaf, certPEM := create(t, tmpl, ca.Cert, key, ca.key)
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return &Cert{Leaf: leaf, CertPEM: certPEM, KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// create signs tmpl for key with parent's signer and returns it parsed and
// as PEM.
func create(t testing.TB, tmpl, parent *x509.Certificate, key, signer *ecdsa.PrivateKey) (*x509.Certificate, []byte) {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func write(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
