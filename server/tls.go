package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// recheckEvery is how often, at most, a handshake looks at the files.
const recheckEvery = time.Second

// CertReloader serves TLS from certificate files and reloads them when
// they change: a handshake at most once a second compares the files'
// modification times and sizes, so renewed certificates (cert-manager,
// a Kubernetes Secret's symlink swap) are picked up without a restart
// and without a watcher goroutine. A reload that fails keeps the old
// certificates and is logged. Safe for concurrent use.
type CertReloader struct {
	certFile, keyFile, caFile string
	clientSAN                 string
	logger                    *slog.Logger
	now                       func() time.Time

	mu      sync.Mutex
	checked time.Time
	stamp   string
	config  *tls.Config
}

// NewCertReloader loads the key pair and, when caFile is not empty, the
// client CA bundle: clients must then present a certificate it signed
// (mTLS). It fails when the files cannot be loaded.
func NewCertReloader(certFile, keyFile, caFile string, logger *slog.Logger) (*CertReloader, error) {
	return NewCertReloaderSAN(certFile, keyFile, caFile, "", logger)
}

// NewCertReloaderSAN is NewCertReloader that, when clientSAN is not
// empty, also requires the client certificate to be valid for the name
// clientSAN, as envoyproxy/ratelimit's GRPC_CLIENT_TLS_SAN does (it
// verifies the chain again with x509.VerifyOptions.DNSName): a DNS SAN
// that matches it (a "*." wildcard SAN matches one label, in any case),
// or an IP SAN equal to it when clientSAN is an IP address. URI SANs
// (SPIFFE IDs) and the subject's common name are not looked at. A
// clientSAN needs caFile.
func NewCertReloaderSAN(certFile, keyFile, caFile, clientSAN string, logger *slog.Logger) (*CertReloader, error) {
	if clientSAN != "" && caFile == "" {
		return nil, errors.New("server: tls: a client SAN needs a client CA file")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &CertReloader{certFile: certFile, keyFile: keyFile, caFile: caFile, clientSAN: clientSAN, logger: logger, now: time.Now}
	stamp, err := r.stat()
	if err != nil {
		return nil, err
	}
	cfg, err := r.load()
	if err != nil {
		return nil, err
	}
	r.stamp, r.config, r.checked = stamp, cfg, r.now()
	return r, nil
}

// Config returns the tls.Config to serve with; it resolves the current
// certificates per handshake.
func (r *CertReloader) Config() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return r.current(), nil },
	}
}

func (r *CertReloader) current() *tls.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := r.now(); now.Sub(r.checked) >= recheckEvery {
		r.checked = now
		r.reloadLocked()
	}
	return r.config
}

func (r *CertReloader) reloadLocked() {
	stamp, err := r.stat()
	if err != nil {
		r.logger.Error("TLS files unreadable, keeping the loaded certificates", "err", err)
		return
	}
	if stamp == r.stamp {
		return
	}
	cfg, err := r.load()
	if err != nil {
		r.logger.Error("TLS reload failed, keeping the loaded certificates", "err", err)
		return
	}
	r.stamp, r.config = stamp, cfg
	r.logger.Info("TLS certificates reloaded", "cert", r.certFile)
}

// stat fingerprints the files by modification time and size.
func (r *CertReloader) stat() (string, error) {
	var s string
	for _, f := range []string{r.certFile, r.keyFile, r.caFile} {
		if f == "" {
			continue
		}
		fi, err := os.Stat(f)
		if err != nil {
			return "", fmt.Errorf("server: tls: %w", err)
		}
		s += fmt.Sprintf("%s:%d:%d;", f, fi.ModTime().UnixNano(), fi.Size())
	}
	return s, nil
}

func (r *CertReloader) load() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return nil, fmt.Errorf("server: tls: %w", err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert},
		NextProtos: []string{"h2", "http/1.1"}}
	if r.caFile != "" {
		pem, err := os.ReadFile(r.caFile)
		if err != nil {
			return nil, fmt.Errorf("server: tls: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errors.New("server: tls: no certificate in " + r.caFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
		if r.clientSAN != "" {
			cfg.VerifyConnection = verifyClientSAN(r.clientSAN)
		}
	}
	return cfg, nil
}

// verifyClientSAN fails a handshake whose client certificate is not
// valid for san. It runs after the chain is verified against the
// client CAs.
func verifyClientSAN(san string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("server: tls: no client certificate")
		}
		if err := cs.PeerCertificates[0].VerifyHostname(san); err != nil {
			return fmt.Errorf("server: tls: client certificate: %w", err)
		}
		return nil
	}
}
