package testcert_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testcert"
)

// TestMutualTLS: a server certificate for the default hosts and a client
// certificate from one CA complete a real loopback handshake that
// requires client certificates; without one it fails.
func TestMutualTLS(t *testing.T) {
	ca := testcert.NewCA(t)
	server := ca.Server(t)
	lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{server.TLS(t)},
		ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert})
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
	dial := func(cfg *tls.Config) error {
		conn, err := tls.Dial("tcp", lis.Addr().String(), cfg)
		if err != nil {
			return err
		}
		defer conn.Close()
		// TLS 1.3 reports a rejected client certificate on first read.
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Read(make([]byte, 1)); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		return nil
	}
	for _, name := range []string{"", "localhost"} {
		cfg := ca.ClientConfig(t)
		cfg.ServerName = name
		if err := dial(cfg); err != nil {
			t.Errorf("server name %q: %v", name, err)
		}
	}
	if err := dial(&tls.Config{RootCAs: ca.Pool()}); err == nil {
		t.Error("a client without a certificate was accepted")
	}
	if err := dial(&tls.Config{RootCAs: testcert.NewCA(t).Pool(), Certificates: ca.ClientConfig(t).Certificates}); err == nil {
		t.Error("a server from another CA was trusted")
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
