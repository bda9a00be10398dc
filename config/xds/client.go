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
// resource, descriptor and field) and the limits in force stay.
//
// Each distinct config is compiled once: responses are told apart by a
// digest of their resources, not by their version. A response whose
// config is the one in force is ACKed without compiling; one whose config
// was rejected lately is NACKed again without compiling, after a delay
// that grows with each repeat of that config, whatever version it comes
// under; a response that repeats the last one on the stream (same version
// and config) is ACKed after a growing delay too. A broken stream is
// opened again after an exponential backoff with jitter, asking for the
// whole state; the backoff starts over only after a stream stayed open
// for StableAfter.
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
	"net"
	"os"
	"slices"
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
	"github.com/sluicehq/sluice/internal/redact"
)

// TypeURL is the resource type the client subscribes to.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// Defaults of Options.
const (
	DefaultBackoffInitial = 500 * time.Millisecond
	DefaultBackoffMax     = 30 * time.Second
	DefaultJitter         = 0.5
	DefaultStableAfter    = 30 * time.Second
)

const (
	// maxNackMessage bounds the error_detail message of a NACK.
	maxNackMessage = 4096
	// maxRejected is how many rejected configs the client remembers, so
	// that a server alternating between a few of them does not get them
	// compiled again.
	maxRejected = 8
)

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
	// opened again: it doubles after each attempt and starts over once a
	// stream has stayed open for StableAfter. They also pace the answers
	// to repeated responses (a rejected config sent again, the same
	// response twice in a row): BackoffInitial doubled with each repeat,
	// at most BackoffMax.
	BackoffInitial, BackoffMax time.Duration
	// StableAfter is how long a stream must stay open for the next
	// reconnection to wait BackoffInitial again; default
	// DefaultStableAfter. A server that sends a config and drops the
	// stream is so reconnected to with a growing wait.
	StableAfter time.Duration
	// Jitter is the fraction of each wait drawn at random (0..1): a wait
	// of d lasts between d×(1−Jitter) and d. Negative means none.
	Jitter float64
	// MaxRecvMsgSize is the largest response accepted; 0 means gRPC's 4 MiB.
	MaxRecvMsgSize int
	// Config are the options the pushed limits are compiled with.
	Config config.Options
	// Logger logs connections, pushes, ACKs and NACKs; nil discards.
	Logger *slog.Logger
	// OnIgnoredField, if set, is called once per pushed config version
	// for each field of it that Sluice does not use
	// (config.IgnoredFields), which is also logged at WARN.
	OnIgnoredField func(field string)

	// dial, if set, makes the connections (tests: an in-memory listener).
	dial func(context.Context, string) (net.Conn, error)
}

// Client is a config.Source fed by an xDS server. Create it with New and
// give it to config.NewSourceReloader; the Reloader's Run runs it.
type Client struct {
	opts Options
	name string // the server's address without credentials, for logs
	log  *slog.Logger
	conn *grpc.ClientConn
	node *corepb.Node

	// What Run's streams have learnt, kept from one stream to the next
	// (only Run's goroutine touches it).
	inForce  applied      // the config this client put in force
	rejected []*rejection // the configs rejected lately, the latest last
}

// applied is the config a client put in force.
type applied struct {
	ok      bool // false before the first
	digest  [sha256.Size]byte
	version string
	ignored []string // its fields Sluice does not use
}

// rejection is a config a client rejected.
type rejection struct {
	digest [sha256.Size]byte
	detail *statuspb.Status // the NACK's error_detail
	// repeats counts the NACKs of this config sent again, since a config
	// was last applied: the next one waits BackoffInitial<<repeats.
	repeats int
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
	if opts.StableAfter <= 0 {
		opts.StableAfter = DefaultStableAfter
	}
	if opts.Jitter == 0 {
		opts.Jitter = DefaultJitter
	}
	opts.Jitter = min(max(opts.Jitter, 0), 1)
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	name := redact.Addrs(opts.Server)
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
	if opts.dial != nil {
		dopts = append(dopts, grpc.WithContextDialer(opts.dial))
	}
	conn, err := grpc.NewClient(opts.Server, dopts...)
	if err != nil {
		return nil, fmt.Errorf("xds: server %q: %w", name, redact.Error(err, opts.Server))
	}
	node := &corepb.Node{Id: opts.NodeID, UserAgentName: "sluice"}
	if len(opts.NodeMetadata) > 0 {
		fields := make(map[string]*structpb.Value, len(opts.NodeMetadata))
		for k, v := range opts.NodeMetadata {
			fields[k] = structpb.NewStringValue(v)
		}
		node.Metadata = &structpb.Struct{Fields: fields}
	}
	return &Client{opts: opts, name: name, log: log, conn: conn, node: node}, nil
}

// String names the source in logs.
func (c *Client) String() string { return "xds " + c.name }

// Run keeps a stream to the server open until ctx is done and applies
// every response to r. It returns nil when ctx is done.
func (c *Client) Run(ctx context.Context, r *config.Reloader) error {
	defer c.conn.Close()
	if len(c.opts.Headers) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, metadata.New(c.opts.Headers))
	}
	wait := c.opts.BackoffInitial
	for attempt := 1; ; attempt++ {
		c.log.Info("xds: opening stream", "server", c.name, "node", c.opts.NodeID, "attempt", attempt)
		stable, err := c.stream(ctx, r)
		if ctx.Err() != nil {
			return nil
		}
		if stable {
			wait, attempt = c.opts.BackoffInitial, 0 // a fresh start: the next attempt is the first
		}
		d := c.jittered(wait)
		// gRPC's errors may quote the target, credentials and all.
		c.log.Warn("xds: stream ended; opening it again", "server", c.name, "err", redact.Error(err, c.opts.Server), "in", d)
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

// paced is the wait before the answer to the n-th repeat of a response.
func (c *Client) paced(n int) time.Duration {
	return c.jittered(min(c.opts.BackoffInitial<<min(n, 16), c.opts.BackoffMax))
}

// stream runs one ADS stream until it breaks or ctx is done. stable
// reports whether it stayed open for StableAfter.
func (c *Client) stream(ctx context.Context, r *config.Reloader) (stable bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := discoverypb.NewAggregatedDiscoveryServiceClient(c.conn).StreamAggregatedResources(ctx)
	if err != nil {
		return false, err
	}
	opened := time.Now()
	defer func() { stable = time.Since(opened) >= c.opts.StableAfter }()
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

	st := streamState{}
	// The answer to a repeated response waits, so that a server which
	// answers every reply with the same response again (go-control-plane's
	// snapshot cache answers a NACK so) is not looped with at full speed.
	// A new response replaces it.
	var pending *discoverypb.DiscoveryRequest
	delay := time.NewTimer(time.Hour)
	delay.Stop()
	defer delay.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case err := <-errc:
			return false, err
		case <-delay.C:
			if err := s.Send(pending); err != nil {
				return false, err
			}
			pending = nil
		case resp := <-responses:
			delay.Stop()
			pending = nil
			req, wait := c.answer(resp, r, &st)
			if wait > 0 {
				pending = req
				delay.Reset(wait)
				continue
			}
			if err := s.Send(req); err != nil {
				return false, err
			}
		}
	}
}

// streamState is what one stream remembers.
type streamState struct {
	accepted string // the version_info of the last response ACKed on the stream
	// last is the last response ACKed, and acks the ACKs of it sent again
	// since.
	last struct {
		digest  [sha256.Size]byte
		version string
	}
	acks int
}

// answer decides the reply to resp, and how long to wait before sending
// it: a config rejected lately gets its NACK again, a config in force its
// ACK, neither compiled; any other is compiled and put in force (ACK) or
// rejected (NACK).
func (c *Client) answer(resp *discoverypb.DiscoveryResponse, r *config.Reloader, st *streamState) (*discoverypb.DiscoveryRequest, time.Duration) {
	version, digest := resp.GetVersionInfo(), digestOf(resp)
	req := &discoverypb.DiscoveryRequest{Node: c.node, TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce(), VersionInfo: st.accepted}
	if rj := c.rejectedAs(digest); rj != nil {
		rj.repeats++
		req.ErrorDetail = rj.detail
		c.log.Debug("xds: a rejected config again; NACK after a delay", "version", version, "repeats", rj.repeats)
		return req, c.paced(rj.repeats)
	}
	if c.inForce.ok && digest == c.inForce.digest {
		req.VersionInfo, st.accepted = version, version
		if st.last.digest == digest && st.last.version == version {
			st.acks++
			c.log.Debug("xds: the same response again; ACK after a delay", "version", version, "repeats", st.acks)
			return req, c.paced(st.acks)
		}
		st.last.digest, st.last.version, st.acks = digest, version, 0
		// The config in force under another name (or sent again after a
		// rejected one): nothing to compile, but the status follows.
		if version != c.inForce.version || !r.Status().LastOK {
			r.Keep(version)
			if version != c.inForce.version {
				c.reportIgnored(version, c.inForce.ignored)
			}
			c.inForce.version = version
		}
		c.log.Debug("xds: the config in force again (ACK)", "version", version, "nonce", resp.GetNonce())
		return req, 0
	}
	ignored, err := c.apply(resp, r)
	c.reportIgnored(version, ignored)
	if err != nil {
		req.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: config.Summary(err, maxNackMessage)}
		c.remember(&rejection{digest: digest, detail: req.ErrorDetail})
		// The Reloader has logged the problems, bounded.
		c.log.Error("xds: config rejected (NACK); the limits in force stay", "version", version, "nonce", resp.GetNonce(), "problems", problems(err))
		return req, 0
	}
	c.inForce = applied{ok: true, digest: digest, version: version, ignored: ignored}
	for _, rj := range c.rejected {
		rj.repeats = 0 // a config was accepted: the next rejection starts with a prompt NACK
	}
	req.VersionInfo, st.accepted = version, version
	st.last.digest, st.last.version, st.acks = digest, version, 0
	c.log.Info("xds: config applied (ACK)", "version", version, "nonce", resp.GetNonce(), "resources", len(resp.GetResources()))
	return req, 0
}

// rejectedAs returns the rejection of the config of digest, nil if it is
// not one of the configs rejected lately.
func (c *Client) rejectedAs(digest [sha256.Size]byte) *rejection {
	for i, rj := range c.rejected {
		if rj.digest == digest {
			// The most recently seen last: it is dropped last.
			c.rejected = append(append(c.rejected[:i:i], c.rejected[i+1:]...), rj)
			return rj
		}
	}
	return nil
}

// remember adds rj to the rejections, forgetting the oldest beyond
// maxRejected.
func (c *Client) remember(rj *rejection) {
	if len(c.rejected) == maxRejected {
		c.rejected = append(c.rejected[:0], c.rejected[1:]...)
	}
	c.rejected = append(c.rejected, rj)
}

// digestOf hashes a response's type and its resources in any order: a
// server may list the same resources in another order each time.
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
	h.Write([]byte(resp.GetTypeUrl()))
	h.Write([]byte{0})
	for _, s := range sums {
		h.Write(s[:])
	}
	var d [sha256.Size]byte
	h.Sum(d[:0])
	return d
}

// maxIgnoredLogged bounds the fields one WARN names.
const maxIgnoredLogged = 16

// reportIgnored makes the fields of config version that Sluice does not
// use visible: one WARN naming them, and OnIgnoredField for each.
func (c *Client) reportIgnored(version string, fields []string) {
	if len(fields) == 0 {
		return
	}
	named := fields[:min(len(fields), maxIgnoredLogged)]
	c.log.Warn("xds: the pushed config has fields Sluice does not use; they are ignored",
		"version", version, "fields", named, "more", len(fields)-len(named))
	if c.opts.OnIgnoredField != nil {
		for _, f := range fields {
			c.opts.OnIgnoredField(f)
		}
	}
}

// apply decodes and compiles a response's resources, with r's overlay,
// and puts them in force with r.UpdateVersion, all in one table. A response that does not
// decode counts as a failed reload like one that does not compile.
// ignored names the fields of the resources that Sluice does not use.
func (c *Client) apply(resp *discoverypb.DiscoveryResponse, r *config.Reloader) (ignored []string, err error) {
	err = r.UpdateVersion(resp.GetVersionInfo(), func() (*config.Table, error) {
		if resp.GetTypeUrl() != TypeURL {
			return nil, fmt.Errorf("xds: response of type %.256q; this client subscribes to %s only", resp.GetTypeUrl(), TypeURL)
		}
		cfgs := make([]*ratelimitpb.RateLimitConfig, len(resp.GetResources()))
		for i, a := range resp.GetResources() {
			if a.GetTypeUrl() != TypeURL {
				return nil, fmt.Errorf("xds: resources[%d]: type %.256q, want %s", i, a.GetTypeUrl(), TypeURL)
			}
			cfgs[i] = &ratelimitpb.RateLimitConfig{}
			if err := a.UnmarshalTo(cfgs[i]); err != nil {
				return nil, fmt.Errorf("xds: resources[%d]: %w", i, err)
			}
		}
		ignored = config.IgnoredFields(cfgs)
		opts := c.opts.Config
		opts.Overlay = r.Overlay()
		return config.CompileRateLimitConfigs(cfgs, opts)
	})
	return ignored, err
}

// problems is the number of problems err lists.
func problems(err error) int {
	var es *config.Errors
	if errors.As(err, &es) && len(es.List) > 0 {
		return len(es.List)
	}
	return 1
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
