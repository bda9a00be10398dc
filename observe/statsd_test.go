package observe_test

import (
	"bufio"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/observe"
)

// TestStatsdSink_DogStatsD: with DogStatsD and the reference's example
// mogrifier, the reference's stats arrive on a real UDP socket as a short
// name with the domain and descriptor as tags, EXTRA_TAGS as tags first.
func TestStatsdSink_DogStatsD(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	m, err := observe.NewMogrifier(`^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$`, "ratelimit.service.rate_limit.$3", "domain:$1,descriptor:$2")
	if err != nil {
		t.Fatal(err)
	}
	sink, err := observe.NewStatsdSink(pc.LocalAddr().String(), observe.StatsdOptions{DogStatsD: true, Mogrifiers: []observe.Mogrifier{m}})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	tags, err := observe.ParseTags("cluster:c1")
	if err != nil {
		t.Fatal(err)
	}
	tr := newRefTraffic(t)
	rs := observe.NewRefStats(tr.rules, tr.grpc, reloads{config.ReloadStatus{Successes: 1}}, observe.RefStatsOptions{Tags: tags})
	tr.run(t)
	if err := rs.Flush(sink); err != nil {
		t.Fatal(err)
	}
	sink.Counter("test.end", 1)
	if err := sink.Flush(); err != nil {
		t.Fatal(err)
	}
	lines := udpLines(t, pc, "test.end:1|c")
	const rl = "ratelimit.service.rate_limit."
	for _, want := range []string{
		rl + "total_hits:12|c|#cluster:c1,descriptor:k,domain:web",
		rl + "over_limit:2|c|#cluster:c1,descriptor:k,domain:web",
		rl + "within_limit:2|c|#cluster:c1,descriptor:remote_address_10_0_0_1,domain:web",
		// Not matched: the name without its serialised tags, which are tags.
		"ratelimit.service.config_load_success:1|c|#cluster:c1",
		"ratelimit_server.ShouldRateLimit.total_requests:4|c|#cluster:c1",
	} {
		if !slices.Contains(lines, want) {
			t.Errorf("no line %q in:\n%s", want, strings.Join(lines, "\n"))
		}
	}
	var timers int
	for _, l := range lines {
		if strings.HasPrefix(l, "ratelimit_server.ShouldRateLimit.response_time:") {
			timers++
			if !strings.Contains(l, "|ms") || !strings.HasSuffix(l, "|#cluster:c1") {
				t.Errorf("timer line %q: want ms with the tags last", l)
			}
		}
	}
	if timers == 0 {
		t.Errorf("no timer line in:\n%s", strings.Join(lines, "\n"))
	}
}

// tcpStatsd is a statsd server on TCP: it collects the lines of every
// connection.
type tcpStatsd struct {
	lis   net.Listener
	lines chan string
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func listenTCPStatsd(t *testing.T, addr string) *tcpStatsd {
	t.Helper()
	var lis net.Listener
	var err error
	// The port of a listener closed a moment ago: binding it again can
	// fail briefly if another test took it; try a few times.
	for range 50 {
		if lis, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	s := &tcpStatsd{lis: lis, lines: make(chan string, 1024)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				for sc := bufio.NewScanner(c); sc.Scan(); {
					s.lines <- sc.Text()
				}
			}()
		}
	}()
	t.Cleanup(s.close)
	return s
}

// close stops listening and closes every connection, as a statsd server
// that goes away.
func (s *tcpStatsd) close() {
	s.lis.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		c.Close()
	}
	s.conns = nil
	s.mu.Unlock()
	s.wg.Wait()
}

// expect reads lines until want arrives, failing after 10 seconds.
func (s *tcpStatsd) expect(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	var seen []string
	for {
		select {
		case l := <-s.lines:
			if l == want {
				return
			}
			seen = append(seen, l)
		case <-deadline:
			t.Fatalf("no line %q; got %q", want, seen)
		}
	}
}

// TestStatsdSink_TCPReconnect: over TCP, lines arrive newline-terminated;
// when the server goes away the lines flushed meanwhile wait in the
// buffer, and arrive once a server listens again on the address.
func TestStatsdSink_TCPReconnect(t *testing.T) {
	srv := listenTCPStatsd(t, "127.0.0.1:0")
	addr := srv.lis.Addr().String()
	sink, err := observe.NewStatsdSink(addr, observe.StatsdOptions{Protocol: "tcp", DogStatsD: true, RetryEvery: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sink.Start()
	defer sink.Close()

	sink.Counter("a.__zone=eu", 1)
	sink.Timer("t", 5, 3)
	if err := sink.Flush(); err != nil {
		t.Fatal(err)
	}
	srv.expect(t, "a:1|c|#zone:eu")
	srv.expect(t, "t:5|ms|@0.5")

	srv.close()
	sink.Counter("b", 2) // while no server listens
	if err := sink.Flush(); err != nil {
		t.Fatal(err)
	}
	back := listenTCPStatsd(t, addr)
	back.expect(t, "b:2|c")
	sink.Counter("c", 3)
	sink.Flush()
	back.expect(t, "c:3|c")
	if d := sink.Dropped(); d != 0 {
		t.Errorf("%d lines dropped, want 0", d)
	}
}

// TestStatsdSink_TCPBounded: with no server, Counter never blocks; the
// lines past the buffer's bound are dropped, counted and reported by
// Flush.
func TestStatsdSink_TCPBounded(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens there now
	sink, err := observe.NewStatsdSink(addr, observe.StatsdOptions{Protocol: "tcp", MaxBuffered: 100, RetryEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	sink.Start()
	defer sink.Close()
	for range 1000 {
		sink.Counter("ratelimit.service.rate_limit.web.k.total_hits", 1)
	}
	err = sink.Flush()
	// 100 bytes hold 2 lines of 47: at least 998 are dropped.
	if d := sink.Dropped(); d < 998 || d > 1000 {
		t.Errorf("%d lines dropped, want 998 to 1000", d)
	}
	if err == nil || !strings.Contains(err.Error(), "lines dropped") {
		t.Errorf("Flush: %v, want the drops reported", err)
	}
	if err := sink.Flush(); err != nil && strings.Contains(err.Error(), "lines dropped") {
		t.Errorf("second Flush: %v, want the drops reported once", err)
	}
	if _, err := observe.NewStatsdSink(addr, observe.StatsdOptions{Protocol: "sctp"}); err == nil {
		t.Error("protocol sctp: no error")
	}
}

// BenchmarkStatsdSink_Counter: one counter line, as a flush writes it,
// over UDP and TCP, plain and as DogStatsD with the reference's example
// mogrifier (its name and tags worked out once).
func BenchmarkStatsdSink_Counter(b *testing.B) {
	m, err := observe.NewMogrifier(`^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$`, "ratelimit.service.rate_limit.$3", "domain:$1,descriptor:$2")
	if err != nil {
		b.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer pc.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 1<<16)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	for _, c := range []struct {
		name string
		addr string
		o    observe.StatsdOptions
	}{
		{"udp", pc.LocalAddr().String(), observe.StatsdOptions{}},
		{"tcp", lis.Addr().String(), observe.StatsdOptions{Protocol: "tcp"}},
		{"udp-dogstatsd", pc.LocalAddr().String(), observe.StatsdOptions{DogStatsD: true, Mogrifiers: []observe.Mogrifier{m}}},
		{"tcp-dogstatsd", lis.Addr().String(), observe.StatsdOptions{Protocol: "tcp", DogStatsD: true, Mogrifiers: []observe.Mogrifier{m}}},
	} {
		b.Run(c.name, func(b *testing.B) {
			sink, err := observe.NewStatsdSink(c.addr, c.o)
			if err != nil {
				b.Fatal(err)
			}
			sink.Start()
			defer sink.Close()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				sink.Counter("ratelimit.service.rate_limit.web.path.total_hits.__cluster=c1", 3)
				if i%1000 == 999 {
					sink.Flush()
				}
			}
		})
	}
}
