// Package xds is a config.Source that receives limits from an xDS
// management server, as envoyproxy/ratelimit does with
// CONFIG_TYPE=GRPC_XDS_SOTW and as Envoy Gateway serves them.
//
// The client opens the aggregated stream
// (envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources),
// subscribes to every resource of type
// type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig
// (state of the world) and compiles each response, all of its resources
// at once, with config.CompileRateLimitConfigs. A config that compiles is
// swapped in and ACKed (version_info set to the response's version); one
// that does not is NACKed with the error in error_detail (naming the
// resource, descriptor and field) and the limits in force stay; the same
// config sent again is NACKed again after a growing delay, not compiled
// again. A broken stream is opened again after an exponential backoff
// with jitter, asking for the whole state.
package xds

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/config"
)

// TypeURL is the resource type the client subscribes to.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// Defaults of Options.
const (
	DefaultBackoffInitial = 500 * time.Millisecond
	DefaultBackoffMax     = 30 * time.Second
	DefaultJitter         = 0.5
)

// maxNackMessage bounds the error_detail message of a NACK.
const maxNackMessage = 4096

// Options configure a Client. The zero value of each field means its
// default; Server is required.
type Options struct {
	// Server is the management server's address, host:port (or any gRPC
	// target).
	Server string
	// NodeID identifies this client (node.id): Envoy Gateway keeps the
	// limits under "envoy-ratelimit". Default "default", as the reference.
	NodeID string
	// NodeMetadata is sent as node.metadata (string values).
	NodeMetadata map[string]string
	// Headers are sent as gRPC metadata on the stream.
	Headers map[string]string
	// TLS, if not nil, secures the connection (ClientTLS builds one from
	// files); nil means plaintext.
	TLS *tls.Config
	// BackoffInitial and BackoffMax bound the wait before a stream is
	// opened again: it doubles after each failed attempt and starts over
	// once a stream has delivered a response.
	BackoffInitial, BackoffMax time.Duration
	// Jitter is the fraction of each wait drawn at random (0..1): a wait
	// of d lasts between d×(1−Jitter) and d. Negative means none.
	Jitter float64
	// MaxRecvMsgSize is the largest response accepted; 0 means gRPC's 4 MiB.
	MaxRecvMsgSize int
	// Config are the options the pushed limits are compiled with.
	Config config.Options
	// Logger logs connections, pushes, ACKs and NACKs; nil discards.
	Logger *slog.Logger
}

// Client is a config.Source fed by an xDS server. Create it with New and
// give it to config.NewSourceReloader; the Reloader's Run runs it.
type Client struct {
	opts Options
	log  *slog.Logger
	conn *grpc.ClientConn
	node *corepb.Node
}

// New checks opts and prepares the connection; nothing is dialled before
// Run.
func New(opts Options) (*Client, error) {
	if opts.Server == "" {
		return nil, errors.New("xds: no server address")
	}
	if opts.NodeID == "" {
		opts.NodeID = "default"
	}
	if opts.BackoffInitial <= 0 {
		opts.BackoffInitial = DefaultBackoffInitial
	}
	if opts.BackoffMax <= 0 {
		opts.BackoffMax = DefaultBackoffMax
	}
	opts.BackoffMax = max(opts.BackoffMax, opts.BackoffInitial)
	if opts.Jitter == 0 {
		opts.Jitter = DefaultJitter
	}
	opts.Jitter = min(max(opts.Jitter, 0), 1)
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	creds := insecure.NewCredentials()
	if opts.TLS != nil {
		creds = credentials.NewTLS(opts.TLS)
	}
	// Pings find a connection that died silently (a node gone without a
	// reset) on an otherwise quiet stream; 5 minutes is what gRPC servers
	// allow by default (Envoy Gateway's sets no keepalive policy).
	dopts := []grpc.DialOption{grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 5 * time.Minute, Timeout: 20 * time.Second})}
	if opts.MaxRecvMsgSize > 0 {
		dopts = append(dopts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(opts.MaxRecvMsgSize)))
	}
	conn, err := grpc.NewClient(opts.Server, dopts...)
	if err != nil {
		return nil, fmt.Errorf("xds: server %q: %w", opts.Server, err)
	}
	node := &corepb.Node{Id: opts.NodeID, UserAgentName: "sluice"}
	if len(opts.NodeMetadata) > 0 {
		fields := make(map[string]*structpb.Value, len(opts.NodeMetadata))
		for k, v := range opts.NodeMetadata {
			fields[k] = structpb.NewStringValue(v)
		}
		node.Metadata = &structpb.Struct{Fields: fields}
	}
	return &Client{opts: opts, log: log, conn: conn, node: node}, nil
}

// String names the source in logs.
func (c *Client) String() string { return "xds " + c.opts.Server }

// Run keeps a stream to the server open until ctx is done and applies
// every response to r. It returns nil when ctx is done.
func (c *Client) Run(ctx context.Context, r *config.Reloader) error {
	defer c.conn.Close()
	if len(c.opts.Headers) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, metadata.New(c.opts.Headers))
	}
	wait := c.opts.BackoffInitial
	for attempt := 1; ; attempt++ {
		c.log.Info("xds: opening stream", "server", c.opts.Server, "node", c.opts.NodeID, "attempt", attempt)
		received, err := c.stream(ctx, r)
		if ctx.Err() != nil {
			return nil
		}
		if received {
			wait, attempt = c.opts.BackoffInitial, 0 // a fresh start: the next attempt is the first
		}
		d := c.jittered(wait)
		c.log.Warn("xds: stream ended; opening it again", "server", c.opts.Server, "err", err, "in", d)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		wait = min(2*wait, c.opts.BackoffMax)
	}
}

// jittered draws a wait between d×(1−Jitter) and d.
func (c *Client) jittered(d time.Duration) time.Duration {
	return d - time.Duration(rand.Float64()*c.opts.Jitter*float64(d))
}

// stream runs one ADS stream until it breaks or ctx is done. received
// reports whether the server sent anything on it.
func (c *Client) stream(ctx context.Context, r *config.Reloader) (received bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := discoverypb.NewAggregatedDiscoveryServiceClient(c.conn).StreamAggregatedResources(ctx)
	if err != nil {
		return false, err
	}
	// A new stream asks for the whole state (no version_info): a server
	// that restarted and counts its versions from the start again must
	// not be taken for one whose version this client already has.
	if err := s.Send(&discoverypb.DiscoveryRequest{Node: c.node, TypeUrl: TypeURL}); err != nil {
		return false, err
	}
	responses, errc := make(chan *discoverypb.DiscoveryResponse), make(chan error, 1)
	go func() {
		for {
			resp, err := s.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case responses <- resp:
			case <-ctx.Done():
				return
			}
		}
	}()

	accepted := "" // the version_info of the last response applied on this stream
	var rejected rejection
	// A NACK of a response that repeats the last rejected one waits, so
	// that a server which answers every NACK with the same config again
	// (go-control-plane's snapshot cache does) is not looped with at full
	// speed. A new response replaces it.
	var pending *discoverypb.DiscoveryRequest
	delay := time.NewTimer(time.Hour)
	delay.Stop()
	defer delay.Stop()
	for {
		select {
		case <-ctx.Done():
			return received, ctx.Err()
		case err := <-errc:
			return received, err
		case <-delay.C:
			if err := s.Send(pending); err != nil {
				return received, err
			}
			pending = nil
		case resp := <-responses:
			received = true
			delay.Stop()
			pending = nil
			req := &discoverypb.DiscoveryRequest{Node: c.node, TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce(), VersionInfo: accepted}
			digest := digestOf(resp)
			if rejected.detail != nil && rejected.version == resp.GetVersionInfo() && rejected.digest == digest {
				rejected.repeats++
				wait := c.opts.BackoffInitial << min(rejected.repeats, 16)
				req.ErrorDetail = rejected.detail
				pending = req
				delay.Reset(c.jittered(min(wait, c.opts.BackoffMax)))
				c.log.Debug("xds: the rejected config again; NACK after a delay", "version", resp.GetVersionInfo(), "repeats", rejected.repeats)
				continue
			}
			if perr := c.apply(resp, r); perr != nil {
				req.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: nackMessage(perr)}
				rejected = rejection{version: resp.GetVersionInfo(), digest: digest, detail: req.ErrorDetail}
				c.log.Error("xds: config rejected (NACK); the limits in force stay", "version", resp.GetVersionInfo(), "nonce", resp.GetNonce(), "err", perr)
			} else {
				accepted, rejected = resp.GetVersionInfo(), rejection{}
				req.VersionInfo = accepted
				c.log.Info("xds: config applied (ACK)", "version", accepted, "nonce", resp.GetNonce(), "resources", len(resp.GetResources()))
			}
			if err := s.Send(req); err != nil {
				return received, err
			}
		}
	}
}

// rejection is the last response NACKed on a stream.
type rejection struct {
	version string
	digest  [sha256.Size]byte
	detail  *statuspb.Status
	repeats int
}

// digestOf hashes a response's resources in any order: a server may list
// the same resources in another order each time.
func digestOf(resp *discoverypb.DiscoveryResponse) [sha256.Size]byte {
	sums := make([][sha256.Size]byte, len(resp.GetResources()))
	for i, a := range resp.GetResources() {
		h := sha256.New()
		for _, b := range [][]byte{[]byte(a.GetTypeUrl()), a.GetValue()} {
			h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(b))))
			h.Write(b)
		}
		h.Sum(sums[i][:0])
	}
	slices.SortFunc(sums, func(a, b [sha256.Size]byte) int { return bytes.Compare(a[:], b[:]) })
	h := sha256.New()
	for _, s := range sums {
		h.Write(s[:])
	}
	var d [sha256.Size]byte
	h.Sum(d[:0])
	return d
}

// apply decodes and compiles a response's resources and puts them in
// force with r.Update, all in one table.
func (c *Client) apply(resp *discoverypb.DiscoveryResponse, r *config.Reloader) error {
	if resp.GetTypeUrl() != TypeURL {
		return fmt.Errorf("xds: response of type %q; this client subscribes to %s only", resp.GetTypeUrl(), TypeURL)
	}
	cfgs := make([]*ratelimitpb.RateLimitConfig, len(resp.GetResources()))
	for i, a := range resp.GetResources() {
		if a.GetTypeUrl() != TypeURL {
			return fmt.Errorf("xds: resources[%d]: type %q, want %s", i, a.GetTypeUrl(), TypeURL)
		}
		cfgs[i] = &ratelimitpb.RateLimitConfig{}
		if err := a.UnmarshalTo(cfgs[i]); err != nil {
			return fmt.Errorf("xds: resources[%d]: %w", i, err)
		}
	}
	return r.UpdateVersion(resp.GetVersionInfo(), func() (*config.Table, error) { return config.CompileRateLimitConfigs(cfgs, c.opts.Config) })
}

// nackMessage is err as error_detail.message: every problem, one a line,
// bounded.
func nackMessage(err error) string {
	msg := err.Error()
	if len(msg) > maxNackMessage {
		cut := strings.LastIndexByte(msg[:maxNackMessage], '\n')
		if cut <= 0 {
			cut = maxNackMessage
		}
		msg = msg[:cut] + "\n(more errors not shown)"
	}
	return msg
}

// ClientTLS builds the TLS configuration of a connection to the server:
// caFile's CAs verify it (the system's when ""), certFile and keyFile (if
// set) are this client's certificate for mTLS, read again at every
// handshake so that a renewed certificate is used on the next connection,
// and serverName (if set) is the name the server's certificate must have
// (default: the host of the address).
func ClientTLS(certFile, keyFile, caFile, serverName string) (*tls.Config, error) {
	cfg := &tls.Config{ServerName: serverName, MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("xds: CA: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("xds: CA %s: no PEM certificate", caFile)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("xds: a client certificate needs both the certificate and the key file")
	}
	if certFile != "" {
		// Fail at startup, not at the first handshake, when the files are
		// wrong.
		if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
			return nil, fmt.Errorf("xds: client certificate: %w", err)
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return nil, fmt.Errorf("xds: client certificate: %w", err)
			}
			return &cert, nil
		}
	}
	return cfg, nil
}

var _ config.Source = (*Client)(nil)
