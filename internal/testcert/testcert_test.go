package testcert_test

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"

	"github.com/sluicehq/sluice/internal/testcert"
)

// TestVerify: certificates verify against their CA for their purpose
// and names, as a TLS handshake checks them, and not against another CA.
func TestVerify(t *testing.T) {
	ca := testcert.NewCA(t)
	server, client := ca.Server(t), ca.ClientConfig(t)
	for _, host := range testcert.DefaultHosts {
		if _, err := server.Leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: host}); err != nil {
			t.Errorf("server certificate for %s: %v", host, err)
		}
	}
	if len(client.Certificates) != 1 || client.RootCAs == nil {
		t.Fatalf("client config: %d certificates, roots %v", len(client.Certificates), client.RootCAs)
	}
	leaf, err := x509.ParseCertificate(client.Certificates[0].Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	clientAuth := x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if _, err := leaf.Verify(clientAuth); err != nil {
		t.Errorf("client certificate: %v", err)
	}
	if _, err := server.Leaf.Verify(clientAuth); err == nil {
		t.Error("a server certificate verified for client authentication")
	}
	if _, err := server.Leaf.Verify(x509.VerifyOptions{Roots: testcert.NewCA(t).Pool(), DNSName: "127.0.0.1"}); err == nil {
		t.Error("a certificate verified against another CA")
	}
	if _, err := tls.X509KeyPair(server.CertPEM, server.KeyPEM); err != nil {
		t.Errorf("server PEM pair: %v", err)
	}
}

func TestServer_Hosts(t *testing.T) {
	ca := testcert.NewCA(t)
	c := ca.Server(t, "sluice.test")
	opts := x509.VerifyOptions{Roots: ca.Pool(), DNSName: "sluice.test"}
	if _, err := c.Leaf.Verify(opts); err != nil {
		t.Errorf("sluice.test: %v", err)
	}
	opts.DNSName = "127.0.0.1"
	if _, err := c.Leaf.Verify(opts); err == nil {
		t.Error("a certificate for sluice.test verified for 127.0.0.1")
	}
	if a, b := ca.Server(t).Leaf.SerialNumber, ca.Client(t).Leaf.SerialNumber; a.Cmp(b) == 0 || a.Cmp(c.Leaf.SerialNumber) == 0 {
		t.Errorf("serial numbers repeat: %v, %v, %v", c.Leaf.SerialNumber, a, b)
	}
}

func TestWriteFiles(t *testing.T) {
	ca := testcert.NewCA(t)
	c := ca.Server(t)
	dir := t.TempDir()
	certFile, keyFile := c.WriteFiles(t, dir, "tls")
	if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
		t.Errorf("written pair: %v", err)
	}
	b, err := os.ReadFile(ca.WriteFile(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(b) {
		t.Error("written CA file holds no certificate")
	}
}

// TestPeer: a peer certificate verifies both as a server for its hosts
// and as a client.
func TestPeer(t *testing.T) {
	ca := testcert.NewCA(t)
	p := ca.Peer(t)
	for _, opts := range []x509.VerifyOptions{
		{Roots: ca.Pool(), DNSName: "localhost"},
		{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
	} {
		if _, err := p.Leaf.Verify(opts); err != nil {
			t.Errorf("peer certificate, %+v: %v", opts.KeyUsages, err)
		}
	}
}
