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
	cfg := &tls.Config{ServerName: f.name, InsecureSkipVerify: f.skipVerify, MinVersion: tls.VersionTLS12}
	if f.ca != "" {
		pem, err := os.ReadFile(f.ca)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca %s: no PEM certificate", f.ca)
		}
	}
	if (f.cert == "") != (f.key == "") {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	if f.cert != "" {
		cert, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
