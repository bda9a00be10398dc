package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
)

// tlsClientFlags are the --tls* flags of commands that connect to Sluice.
type tlsClientFlags struct {
	on                  bool
	ca, cert, key, name string
	skipVerify          bool
}

func (f *tlsClientFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.on, "tls", false, "connect with TLS (implied by the other --tls-* flags)")
	fs.StringVar(&f.ca, "tls-ca", "", "PEM `file` of CAs to verify the server with (default: the system's)")
	fs.StringVar(&f.cert, "tls-cert", "", "client certificate PEM `file`, for mTLS")
	fs.StringVar(&f.key, "tls-key", "", "client key PEM `file`, for mTLS")
	fs.StringVar(&f.name, "tls-server-name", "", "server `name` to verify (default: from --addr)")
	fs.BoolVar(&f.skipVerify, "tls-skip-verify", false, "do not verify the server's certificate")
}

// config returns the TLS configuration, or nil for plaintext.
func (f *tlsClientFlags) config() (*tls.Config, error) {
	if !f.on && f.ca == "" && f.cert == "" && f.key == "" && f.name == "" && !f.skipVerify {
		return nil, nil
	}
	cfg, err := clientTLS("", f.ca, f.cert, f.key, f.name)
	if err != nil {
		return nil, err
	}
	cfg.InsecureSkipVerify = f.skipVerify
	return cfg, nil
}

// clientTLS is the TLS configuration of a client whose flags are
// --<prefix>tls-ca, --<prefix>tls-cert and --<prefix>tls-key: the CA
// file that verifies the server (empty: the system roots), a client
// certificate and key, and the name to verify (empty: the host dialled).
func clientTLS(prefix, ca, cert, key, serverName string) (*tls.Config, error) {
	cfg := &tls.Config{ServerName: serverName, MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("--%stls-ca: %w", prefix, err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--%stls-ca %s: no PEM certificate", prefix, ca)
		}
	}
	if (cert == "") != (key == "") {
		return nil, fmt.Errorf("--%stls-cert and --%stls-key go together", prefix, prefix)
	}
	if cert != "" {
		c, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("--%stls-cert: %w", prefix, err)
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	return cfg, nil
}

// verifyChainOnly makes cfg verify the server's certificate chain
// against cfg.RootCAs (nil: the system roots) but not the name in it,
// as envoyproxy/ratelimit's *_TLS_SKIP_HOSTNAME_VERIFICATION do.
func verifyChainOnly(cfg *tls.Config) {
	cfg.InsecureSkipVerify = true // the name; the chain is verified below
	roots := cfg.RootCAs
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("tls: the server sent no certificate")
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		return err
	}
}
