package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice/limiter"
)

// Refunds says who may give usage back (Envoy's is_negative_hits, our
// API's COST_KIND_REFUND). Anyone who reaches the ports may by default,
// as anyone may send hits: envoyproxy/ratelimit's ports have no
// authentication either (it has no refunds: it ignores is_negative_hits
// and counts the hits). A refund needs no token, so a client can undo
// what it spent.
type Refunds uint8

const (
	// RefundsAllow takes every refund (the default): anyone may refund,
	// as anyone may send hits.
	RefundsAllow Refunds = iota
	// RefundsToken takes a refund only from a caller that presents the
	// admin token ("authorization: Bearer TOKEN" in gRPC metadata or
	// the HTTP header).
	RefundsToken
	// RefundsDeny refuses every request with a refund.
	RefundsDeny
)

// ParseRefunds parses "allow", "token" or "deny".
func ParseRefunds(s string) (Refunds, error) {
	switch s {
	case "allow":
		return RefundsAllow, nil
	case "token":
		return RefundsToken, nil
	case "deny":
		return RefundsDeny, nil
	}
	return 0, fmt.Errorf("server: refunds %q: want allow, token or deny", s)
}

// String returns the spelling ParseRefunds accepts.
func (r Refunds) String() string {
	switch r {
	case RefundsToken:
		return "token"
	case RefundsDeny:
		return "deny"
	}
	return "allow"
}

// RefusedError is a request refused for what it may not do (a refund
// under Options.Refunds): PERMISSION_DENIED, HTTP 403.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return "server: refused: " + e.Reason }

// checkRefunds refuses req if it holds a refund its caller may not make:
// headers are an HTTP caller's, nil for a gRPC caller (whose metadata ctx
// holds). Without a refund, or with RefundsAllow, it costs a comparison.
func (o *Options) checkRefunds(ctx context.Context, headers http.Header, req *limiter.Request) error {
	if o.Refunds == RefundsAllow || !hasRefund(req) {
		return nil
	}
	if o.Refunds == RefundsDeny {
		return &RefusedError{Reason: "refunds are off (--refunds deny): is_negative_hits and COST_KIND_REFUND are refused"}
	}
	var auth string
	if headers != nil {
		auth = headers.Get("Authorization")
	} else if v := metadata.ValueFromIncomingContext(ctx, "authorization"); len(v) > 0 {
		auth = v[0]
	}
	scheme, tok, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || o.RefundAuth == nil || !o.RefundAuth.Valid([]byte(strings.TrimSpace(tok))) {
		return &RefusedError{Reason: "a refund needs the admin token (--refunds token): authorization: Bearer <the admin token>"}
	}
	return nil
}

func hasRefund(req *limiter.Request) bool {
	for i := range req.Descriptors {
		if req.Descriptors[i].Kind == limiter.Refund {
			return true
		}
	}
	return false
}
