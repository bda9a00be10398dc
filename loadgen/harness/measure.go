package harness

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
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

// Metrics is one scrape of a Prometheus text endpoint.
type Metrics struct {
	// Series is the number of samples (lines that are neither comments
	// nor blank): each label set of a counter or gauge, each bucket,
	// sum and count of a histogram.
	Series int
	// Bytes is the size of the answer.
	Bytes int
	// Sum is each metric name's samples added up, labels dropped.
	Sum map[string]float64
}

// Scrape reads url (a /metrics) with c.
func Scrape(ctx context.Context, c *http.Client, url string) (*Metrics, error) {
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
	return ParseMetrics(res.Body)
}

// ParseMetrics reads the Prometheus text format.
func ParseMetrics(r io.Reader) (*Metrics, error) {
	m := &Metrics{Sum: map[string]float64{}}
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadString('\n')
		m.Bytes += len(line)
		if s := strings.TrimSpace(line); s != "" && s[0] != '#' {
			m.Series++
			m.add(s)
		}
		if err == io.EOF {
			return m, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// add adds one sample line ("name{labels} value [timestamp]") to Sum.
func (m *Metrics) add(line string) {
	name, rest := line, ""
	if i := strings.IndexAny(line, "{ "); i >= 0 {
		name, rest = line[:i], line[i:]
	}
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
