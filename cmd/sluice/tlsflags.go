package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
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

// storeTLSFlags are the --NAME-tls* flags of serve's client of a store
// (NAME redis, redis-persecond or memcache), the same for each.
type storeTLSFlags struct {
	name                      string
	on                        bool
	ca, cert, key, serverName string
	skipHostname              bool
}

// register adds the flags; peer names the server in their usage (Redis,
// memcached) and implied says what else turns TLS on.
func (f *storeTLSFlags) register(fs *flag.FlagSet, name, usage, peer, implied string) {
	f.name = name
	p := name + "-"
	fs.BoolVar(&f.on, p+"tls", false, usage+"connect with TLS (implied by "+implied+")")
	fs.StringVar(&f.ca, p+"tls-ca", "", usage+"PEM `file` of the CA that signed "+peer+"'s certificate (default: system roots)")
	fs.StringVar(&f.cert, p+"tls-cert", "", usage+"PEM `file` of the client certificate")
	fs.StringVar(&f.key, p+"tls-key", "", usage+"PEM `file` of the client certificate's key")
	fs.StringVar(&f.serverName, p+"tls-server-name", "", usage+"name to verify "+peer+"'s certificate against (default: the host)")
	fs.BoolVar(&f.skipHostname, p+"tls-skip-hostname-verification", false, usage+"accept "+peer+"'s certificate whatever names it holds, "+
		"as long as it chains to --"+p+"tls-ca (or the system roots); prefer --"+p+"tls-server-name")
}

// set reports whether any of the flags is given: each turns TLS on.
func (f *storeTLSFlags) set() bool {
	return f.on || f.ca != "" || f.cert != "" || f.key != "" || f.serverName != "" || f.skipHostname
}

// config returns the TLS configuration, or nil when no flag is set.
func (f *storeTLSFlags) config() (*tls.Config, error) {
	if !f.set() {
		return nil, nil
	}
	tc, err := clientTLS(f.name+"-", f.ca, f.cert, f.key, f.serverName)
	if err != nil {
		return nil, err
	}
	if f.skipHostname {
		if f.serverName != "" {
			p := "--" + f.name + "-"
			return nil, fmt.Errorf("%stls-skip-hostname-verification and %stls-server-name: give one", p, p)
		}
		verifyChainOnly(tc)
	}
	return tc, nil
}

// warn logs at WARN, with --NAME-tls-skip-hostname-verification, that
// any certificate the CA signed is accepted; what names the store in the
// message and peer its server.
func (f *storeTLSFlags) warn(logger *slog.Logger, what, peer string) {
	if f.skipHostname {
		logger.Warn(what + ": --" + f.name + "-tls-skip-hostname-verification: " + peer + "'s certificate is checked against the CA, not against " + peer + "'s name: " +
			"any certificate that CA signed is accepted (prefer --" + f.name + "-tls-server-name)")
	}
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
