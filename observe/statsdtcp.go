package observe

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// tcpSender sends statsd lines over TCP, newline-terminated, for
// StatsdSink. Send only appends to a buffer of at most max bytes, so a
// slow or absent server never blocks the caller: a line that does not
// fit is dropped and counted. The goroutine of start writes the buffer
// when woken (at each flush, or when 64 KiB are waiting), dialling when
// it has no connection and, after a failure, trying again every retry
// while lines wait. A write that fails before sending anything keeps
// its lines for the next connection; one that fails midway loses the
// rest (counted), as a half-sent line cannot be resent whole. Safe for
// concurrent use.
type tcpSender struct {
	addr    string
	max     int
	retry   time.Duration
	dropped atomic.Uint64 // lines

	mu      sync.Mutex
	buf     []byte // whole lines, each ending in '\n'
	spare   []byte // a written batch's array, for buf to reuse
	started bool
	closed  bool

	wake chan struct{}
	stop chan struct{}
	done chan struct{}
}

// tcpWakeBytes wakes the writer before a flush when that much waits.
const tcpWakeBytes = 64 << 10

func newTCPSender(addr string, max int, retry time.Duration) *tcpSender {
	return &tcpSender{addr: addr, max: max, retry: retry,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

// Send implements statsd.Sender: data is one line, without its newline.
func (s *tcpSender) Send(data []byte) (int, error) {
	s.mu.Lock()
	if len(s.buf)+len(data)+1 > s.max {
		s.mu.Unlock()
		s.dropped.Add(1)
		return len(data), nil
	}
	if s.buf == nil {
		s.buf = make([]byte, 0, 2*tcpWakeBytes)
	}
	s.buf = append(append(s.buf, data...), '\n')
	full := len(s.buf) >= tcpWakeBytes
	s.mu.Unlock()
	if full {
		s.flush()
	}
	return len(data), nil
}

// flush wakes the writer.
func (s *tcpSender) flush() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// start runs the writer until Close.
func (s *tcpSender) start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started && !s.closed {
		s.started = true
		go s.run()
	}
}

// Close writes what waits, once, and stops the writer, if started.
func (s *tcpSender) Close() error {
	s.mu.Lock()
	stop := s.started && !s.closed
	s.closed = true
	s.mu.Unlock()
	if stop {
		close(s.stop)
		<-s.done
	}
	return nil
}

func (s *tcpSender) run() {
	defer close(s.done)
	var conn net.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	var retry <-chan time.Time
	for {
		stopping := false
		select {
		case <-s.stop:
			stopping = true
		case <-s.wake:
		case <-retry:
		}
		retry = nil
		if conn = s.write(conn); conn == nil && s.waiting() && !stopping {
			retry = time.After(s.retry)
		}
		if stopping {
			return
		}
	}
}

// write sends the waiting lines on conn, dialling when conn is nil; it
// returns the connection to use next, nil after a failure.
func (s *tcpSender) write(conn net.Conn) net.Conn {
	s.mu.Lock()
	batch := s.buf
	s.buf, s.spare = s.spare, nil
	s.mu.Unlock()
	if len(batch) == 0 {
		s.recycle(batch)
		return conn
	}
	if conn != nil && peerClosed(conn) {
		conn.Close()
		conn = nil
	}
	if conn == nil {
		c, err := net.DialTimeout("tcp", s.addr, min(s.retry, 2*time.Second))
		if err != nil {
			s.requeue(batch)
			return nil
		}
		conn = c
	}
	conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
	n, err := conn.Write(batch)
	if err == nil {
		s.recycle(batch)
		return conn
	}
	conn.Close()
	if n == 0 {
		s.requeue(batch)
	} else {
		s.dropped.Add(uint64(bytes.Count(batch[n:], []byte{'\n'})))
	}
	return nil
}

// requeue puts batch back before the lines sent since it was taken,
// dropping (and counting) the oldest lines that no longer fit.
func (s *tcpSender) requeue(batch []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(batch)+len(s.buf) > s.max && len(batch) > 0 {
		i := bytes.IndexByte(batch, '\n')
		batch = batch[i+1:]
		s.dropped.Add(1)
	}
	s.buf = append(batch, s.buf...)
}

// recycle keeps batch's array, once written, for the next lines, unless
// it grew past 1 MiB (a backlog) or buf and spare have one.
func (s *tcpSender) recycle(batch []byte) {
	if batch == nil || cap(batch) > 1<<20 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.buf == nil {
		s.buf = batch[:0]
	} else if s.spare == nil {
		s.spare = batch[:0]
	}
}

func (s *tcpSender) waiting() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.buf) > 0
}

// peerClosed reports whether the server closed conn: a statsd server
// sends nothing, so a read that fails other than by timing out within a
// millisecond found the end of the stream (or a reset). Checking before each write
// keeps the lines of a flush from going into a connection the server
// already closed. (A deadline already past would fail the read before
// it looks at the socket.)
func peerClosed(conn net.Conn) bool {
	conn.SetReadDeadline(time.Now().Add(time.Millisecond))
	var one [1]byte
	if _, err := conn.Read(one[:]); err != nil {
		var ne net.Error
		return !errors.As(err, &ne) || !ne.Timeout()
	}
	return false // the server sent something: not a close
}
