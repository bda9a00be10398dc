package harness

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ProcStats returns a process's resident set size in KiB (VmRSS) and its
// open file descriptors, from /proc (0 where unreadable).
func ProcStats(pid int) (rssKiB float64, fds int) {
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				if f := strings.Fields(v); len(f) > 0 {
					rssKiB, _ = strconv.ParseFloat(f[0], 64)
				}
			}
		}
	}
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		fds = len(ents)
	}
	return rssKiB, fds
}

// ProcCPU returns the CPU time (user and system) a process has used, from
// /proc (0 where unreadable), to the clock tick.
func ProcCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the parenthesised command name: state is field 3,
	// utime and stime are fields 14 and 15, in clock ticks (100 a second
	// on Linux).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// Metrics is one scrape of a Prometheus text endpoint.
type Metrics struct {
	// Series is the number of samples (lines that are neither comments
	// nor blank): each label set of a counter or gauge, each bucket,
	// sum and count of a histogram.
	Series int
	// Bytes is the size of the answer.
	Bytes int
	// Sum is the samples of each metric asked for added up, labels
	// dropped; a metric without samples is absent.
	Sum map[string]float64
}

// Scrape reads url (a /metrics) with c, summing the samples of names.
func Scrape(ctx context.Context, c *http.Client, url string, names ...string) (*Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	res, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("harness: %s: %s", url, res.Status)
	}
	return ParseMetrics(res.Body, names...)
}

// ParseMetrics reads the Prometheus text format, counting every sample
// and summing those of names. Only the lines of names are parsed, so
// that counting the series of a large endpoint costs little.
func ParseMetrics(r io.Reader, names ...string) (*Metrics, error) {
	m := &Metrics{Sum: map[string]float64{}}
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A line longer than the buffer: read it whole.
			rest, err2 := br.ReadBytes('\n')
			line, err = append(slices.Clone(line), rest...), err2
		}
		m.Bytes += len(line)
		if s := bytes.TrimSpace(line); len(s) > 0 && s[0] != '#' {
			m.Series++
			for _, n := range names {
				if len(s) > len(n) && string(s[:len(n)]) == n && (s[len(n)] == '{' || s[len(n)] == ' ') {
					m.add(n, string(s[len(n):]))
				}
			}
		}
		if err == io.EOF {
			return m, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// add adds a sample of name, rest being what follows the name
// ("{labels} value [timestamp]" or " value [timestamp]"), to Sum.
func (m *Metrics) add(name, rest string) {
	if strings.HasPrefix(rest, "{") {
		// Label values may hold spaces and braces, escaped quotes only.
		i, quoted := 1, false
		for ; i < len(rest) && (quoted || rest[i] != '}'); i++ {
			switch {
			case rest[i] == '\\':
				i++
			case rest[i] == '"':
				quoted = !quoted
			}
		}
		if i >= len(rest) {
			return
		}
		rest = rest[i+1:]
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return
	}
	if v, err := strconv.ParseFloat(f[0], 64); err == nil {
		m.Sum[name] += v
	}
}
