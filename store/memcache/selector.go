package memcache

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/bradfitz/gomemcache/memcache"
)

// selector spreads keys over servers by rendezvous (highest random
// weight) hashing: a key goes to the server whose hash of (server, key)
// is highest. Adding or removing one of n servers moves only the keys it
// gains or held (about 1/n of them), where the library's ServerList
// (crc32 modulo n) moves most keys, and a moved key starts its count
// afresh. Every replica with the same server names picks the same server
// for a key. With modulo, it picks as the library's ServerList does
// instead (the CRC-32 of the key modulo the number of servers, in the
// order given), as envoyproxy/ratelimit's pods do. Safe for concurrent
// use.
type selector struct {
	servers atomic.Pointer[[]server]
	modulo  bool
}

type server struct {
	name string // as configured, or an SRV target:port: what the hash uses
	addr net.Addr
	seed uint64
}

var _ memcache.ServerSelector = (*selector)(nil)

// set replaces the servers. Names are host:port or a Unix socket's path;
// duplicates count once (with modulo, each as given). It resolves every
// name first (host names by r, nil for the system's resolver) and changes
// nothing if one fails: a lookup that failed is a *lookupError.
func (s *selector) set(ctx context.Context, r *net.Resolver, names []string) error {
	if err := checkNames(names); err != nil {
		return err
	}
	if !s.modulo {
		names = slices.Clone(names)
		slices.Sort(names)
		names = slices.Compact(names)
	}
	list := make([]server, len(names))
	for i, n := range names {
		a, err := resolve(ctx, r, n)
		if err != nil {
			return fmt.Errorf("memcache: server %q: %w", n, err)
		}
		list[i] = server{name: n, addr: a, seed: mix(fnv(n))}
	}
	s.servers.Store(&list)
	return nil
}

// checkNames reports the first malformed name of servers, or no servers.
func checkNames(names []string) error {
	if len(names) == 0 {
		return errors.New("memcache: no servers")
	}
	for _, n := range names {
		if strings.Contains(n, "/") {
			continue
		}
		if _, _, err := net.SplitHostPort(n); err != nil {
			return fmt.Errorf("memcache: server %q: %w", n, err)
		}
	}
	return nil
}

// lookupError is a DNS lookup that failed: at startup, the name may not
// resolve yet (a headless Service with no ready pods), so New does not
// fail on it.
type lookupError struct{ err error }

func (e *lookupError) Error() string { return e.err.Error() }
func (e *lookupError) Unwrap() error { return e.err }

// resolve turns a server's name into its address: a Unix socket's path,
// or host:port with the host looked up by r (nil: the system's resolver).
func resolve(ctx context.Context, r *net.Resolver, name string) (net.Addr, error) {
	if strings.Contains(name, "/") {
		return net.ResolveUnixAddr("unix", name)
	}
	host, port, err := net.SplitHostPort(name)
	if err != nil {
		return nil, err
	}
	if r == nil {
		r = net.DefaultResolver
	}
	ips, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, &lookupError{err}
	}
	p, err := r.LookupPort(ctx, "tcp", port)
	if err != nil {
		return nil, err
	}
	ip := ips[0]
	for _, a := range ips {
		if a.Is4() { // as net.ResolveTCPAddr prefers
			ip = a
			break
		}
	}
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(ip.Unmap(), uint16(p))), nil
}

// empty reports whether there are no servers yet (none resolved).
func (s *selector) empty() bool { return s.servers.Load() == nil }

// names lists the servers' names, sorted (with modulo, as given).
func (s *selector) names() []string {
	p := s.servers.Load()
	if p == nil {
		return nil
	}
	out := make([]string, len(*p))
	for i, sv := range *p {
		out[i] = sv.name
	}
	return out
}

// has reports whether addr (as net.Addr's String) is a server's address.
func (s *selector) has(addr string) bool {
	p := s.servers.Load()
	if p == nil {
		return false
	}
	for _, sv := range *p {
		if sv.addr.String() == addr {
			return true
		}
	}
	return false
}

// PickServer returns the server that holds key.
func (s *selector) PickServer(key string) (net.Addr, error) {
	p := s.servers.Load()
	if p == nil || len(*p) == 0 {
		return nil, memcache.ErrNoServers
	}
	list := *p
	if len(list) == 1 {
		return list[0].addr, nil
	}
	if s.modulo {
		return list[crc32.ChecksumIEEE([]byte(key))%uint32(len(list))].addr, nil
	}
	k := fnv(key)
	best, bestW := 0, uint64(0)
	for i, sv := range list {
		if w := mix(k ^ sv.seed); i == 0 || w > bestW {
			best, bestW = i, w
		}
	}
	return list[best].addr, nil
}

// Each calls f with every server, stopping at its first error.
func (s *selector) Each(f func(net.Addr) error) error {
	p := s.servers.Load()
	if p == nil {
		return nil
	}
	for _, sv := range *p {
		if err := f(sv.addr); err != nil {
			return err
		}
	}
	return nil
}

// fnv is 64-bit FNV-1a.
func fnv(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// mix is splitmix64's finaliser: every input bit moves every output bit.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

var srvName = regexp.MustCompile(`^_([^.]+)\._([^.]+)\.(.+)$`)

// lookupSRV resolves an SRV name (_service._proto.name) to its targets'
// host:port, sorted.
func lookupSRV(ctx context.Context, r *net.Resolver, name string) ([]string, error) {
	m := srvName.FindStringSubmatch(name)
	if m == nil {
		return nil, fmt.Errorf("memcache: SRV %q: want _service._proto.name", name)
	}
	if r == nil {
		r = net.DefaultResolver
	}
	_, recs, err := r.LookupSRV(ctx, m[1], m[2], m[3])
	if err != nil {
		return nil, &lookupError{fmt.Errorf("memcache: SRV %s: %w", name, err)}
	}
	if len(recs) == 0 {
		return nil, &lookupError{fmt.Errorf("memcache: SRV %s: no targets", name)}
	}
	out := make([]string, len(recs))
	for i, rec := range recs {
		out[i] = net.JoinHostPort(strings.TrimSuffix(rec.Target, "."), strconv.Itoa(int(rec.Port)))
	}
	slices.Sort(out)
	return out, nil
}
