package harness

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"
)

// Redis is a redis-server without persistence on one loopback port,
// which it keeps across restarts. Safe for concurrent use.
type Redis struct {
	// Addr is its host:port.
	Addr string

	bin, dir string
	mu       sync.Mutex
	cmd      *exec.Cmd // nil while killed
	restarts int
}

// StartRedis runs bin on a free loopback port with its files (log) in dir
// and waits until it answers PING; one that does not is killed.
func StartRedis(bin, dir string) (*Redis, error) {
	addr, err := FreePort()
	if err != nil {
		return nil, err
	}
	r := &Redis{Addr: addr, bin: bin, dir: dir}
	return r, r.start()
}

// FreePort returns a loopback address whose port was free a moment ago.
func FreePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func (r *Redis) start() error {
	_, port, _ := net.SplitHostPort(r.Addr)
	cmd := exec.Command(r.bin, "--bind", "127.0.0.1", "--port", port, "--dir", r.dir,
		"--logfile", filepath.Join(r.dir, "redis.log"), "--save", "", "--appendonly", "no")
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("harness: redis-server: %w", err)
	}
	r.mu.Lock()
	r.cmd = cmd
	r.mu.Unlock()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if r.ping() == nil {
			return nil
		}
		if time.Now().After(deadline) {
			r.Kill()
			log, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
			return fmt.Errorf("harness: redis-server not answering on %s within 10s:\n%s", r.Addr, log)
		}
	}
}

// ping sends one inline PING on a connection of its own.
func (r *Redis) ping() error {
	c, err := net.DialTimeout("tcp", r.Addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, "PING\r\n"); err != nil {
		return err
	}
	buf := make([]byte, 7)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != "+PONG\r\n" {
		return fmt.Errorf("harness: redis answered %q to PING", buf)
	}
	return nil
}

// Kill kills the process (SIGKILL: Redis forgets every counter) and waits
// for it. Killing a killed Redis does nothing.
func (r *Redis) Kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		r.cmd = nil
	}
}

// Restarts is how many times RestartEvery has started Redis again.
func (r *Redis) Restarts() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.restarts
}

// RestartPlan says when and how RestartEvery restarts Redis.
type RestartPlan struct {
	// Every is the time from one kill to the next; First the time until
	// the first (zero: Every).
	Every, First time.Duration
	// Down is how long Redis stays killed.
	Down time.Duration
	// Grace is how long after the new process answers the outage still
	// lasts, for the clients' breakers and connections to recover.
	Grace time.Duration
	// Before, if set, runs before each kill, before the outage begins;
	// After once the new process answers.
	Before, After func()
}

// RestartEvery kills Redis and starts it again as p says until ctx ends,
// recording each outage, from the kill to Grace after the new process
// answers, in down. A restart under way when ctx ends is completed. A
// failed start is returned.
func (r *Redis) RestartEvery(ctx context.Context, p RestartPlan, down *Outages) error {
	first := p.First
	if first <= 0 {
		first = p.Every
	}
	// Kills keep to their schedule, however long a restart takes.
	for next := time.Now().Add(first); ; next = next.Add(p.Every) {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Until(next)):
		}
		if p.Before != nil {
			p.Before()
		}
		down.Begin(time.Now())
		r.Kill()
		time.Sleep(p.Down)
		if err := r.start(); err != nil {
			down.End(time.Now())
			return err
		}
		r.mu.Lock()
		r.restarts++
		r.mu.Unlock()
		if p.After != nil {
			p.After()
		}
		time.Sleep(p.Grace)
		down.End(time.Now())
	}
}

// Outages are the intervals while Redis was down. Safe for concurrent use.
type Outages struct {
	mu   sync.Mutex
	from []time.Time
	to   []time.Time // zero while the latest is under way
}

// Begin starts an outage at t.
func (o *Outages) Begin(t time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.from, o.to = append(o.from, t), append(o.to, time.Time{})
}

// End ends the outage under way at t.
func (o *Outages) End(t time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.to[len(o.to)-1] = t
}

// Overlaps reports whether [a, b] meets an outage.
func (o *Outages) Overlaps(a, b time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := range o.from {
		if !b.Before(o.from[i]) && (o.to[i].IsZero() || !a.After(o.to[i])) {
			return true
		}
	}
	return false
}

// Total is the time spent in ended outages.
func (o *Outages) Total() time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	var d time.Duration
	for i := range o.from {
		if !o.to[i].IsZero() {
			d += o.to[i].Sub(o.from[i])
		}
	}
	return d
}
