package memcache

import (
	"context"
	"net"
	"sync"
)

// conns counts the client's open connections by server address, so a
// refresh can tell whether any is left to a server no longer in use: the
// library keeps idle connections per address, and prunes them only when
// one fails or there are too many, so those to a server an SRV refresh
// dropped would stay open for ever. Safe for concurrent use.
type conns struct {
	mu   sync.Mutex
	open map[string]int // address → connections open
}

type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// dial wraps d so that the connections it opens are counted until closed.
func (cs *conns) dial(d dialFunc) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cs.mu.Lock()
		if cs.open == nil {
			cs.open = map[string]int{}
		}
		cs.open[addr]++
		cs.mu.Unlock()
		return &countedConn{Conn: c, cs: cs, addr: addr}, nil
	}
}

// outside reports whether a connection is open to an address that
// in does not hold.
func (cs *conns) outside(in func(addr string) bool) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for a := range cs.open {
		if !in(a) {
			return true
		}
	}
	return false
}

// countedConn is a connection conns counts until its first Close.
type countedConn struct {
	net.Conn
	cs   *conns
	addr string
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() {
		c.cs.mu.Lock()
		if c.cs.open[c.addr]--; c.cs.open[c.addr] == 0 {
			delete(c.cs.open, c.addr)
		}
		c.cs.mu.Unlock()
	})
	return c.Conn.Close()
}
