package memcachetest

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// DNS is a tiny DNS server on a loopback UDP port that answers SRV and A
// queries from tables the test changes, and nothing else (NXDOMAIN).
type DNS struct {
	// Addr is its host:port.
	Addr string

	pc  net.PacketConn
	mu  sync.Mutex
	srv map[string][]string // name (lower case, with the final dot) → host:port targets
	a   map[string]net.IP   // name → IPv4 address
}

// StartDNS starts a DNS server; it stops when the test ends.
func StartDNS(t testing.TB) *DNS {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("memcachetest: dns: %v", err)
	}
	d := &DNS{Addr: pc.LocalAddr().String(), pc: pc, srv: map[string][]string{}, a: map[string]net.IP{}}
	done := make(chan struct{})
	go func() { defer close(done); d.serve() }()
	t.Cleanup(func() { pc.Close(); <-done })
	return d
}

// SetSRV makes name (e.g. "_memcache._tcp.example.test") answer with
// targets, host:port each (give each host an address with SetA). No
// targets removes the name.
func (d *DNS) SetSRV(name string, targets ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.srv[fqdn(name)] = targets
}

// SetA makes host answer with the IPv4 address ip (and AAAA queries with
// no address).
func (d *DNS) SetA(host, ip string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.a[fqdn(host)] = net.ParseIP(ip).To4()
}

func fqdn(name string) string { return strings.ToLower(strings.TrimSuffix(name, ".")) + "." }

// Resolver is a resolver that asks only this server.
func (d *DNS) Resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "udp", d.Addr)
	}}
}

func (d *DNS) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := d.pc.ReadFrom(buf)
		if err != nil {
			return
		}
		if out, ok := d.answer(buf[:n]); ok {
			_, _ = d.pc.WriteTo(out, from)
		}
	}
}

// answer builds the reply to one query.
func (d *DNS) answer(q []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil, false
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		return nil, false
	}
	q0 := qs[0]
	d.mu.Lock()
	targets := d.srv[strings.ToLower(q0.Name.String())]
	ip := d.a[strings.ToLower(q0.Name.String())]
	d.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	if len(targets) == 0 && ip == nil {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(q0) != nil || b.StartAnswers() != nil {
		return nil, false
	}
	rr := dnsmessage.ResourceHeader{Name: q0.Name, Class: dnsmessage.ClassINET, TTL: 0}
	if q0.Type == dnsmessage.TypeA && ip != nil {
		if b.AResource(rr, dnsmessage.AResource{A: [4]byte(ip)}) != nil {
			return nil, false
		}
	}
	if q0.Type == dnsmessage.TypeSRV {
		for _, tg := range targets {
			host, port, err := net.SplitHostPort(tg)
			if err != nil {
				continue
			}
			pn, _ := strconv.Atoi(port)
			target, err := dnsmessage.NewName(host + ".")
			if err != nil {
				continue
			}
			if b.SRVResource(rr, dnsmessage.SRVResource{Priority: 10, Weight: 10, Port: uint16(pn), Target: target}) != nil {
				return nil, false
			}
		}
	}
	out, err := b.Finish()
	return out, err == nil
}
