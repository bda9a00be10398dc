package main

import (
	"bufio"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/loadgen"
	"github.com/sluicehq/sluice/loadgen/harness"
)

func TestParseInfo(t *testing.T) {
	const info = "# Server\r\nredis_version:7.0.15\r\nos:Linux 6.1 x86_64\r\n\r\n" +
		"# Stats\r\ntotal_connections_received:3\r\ntotal_commands_processed:1234\r\n\r\n" +
		"# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:0.000301\r\n" +
		"used_cpu_sys_children:9.000000\r\nused_cpu_user_main_thread:7.000000\r\n"
	got, err := parseInfo(info)
	if err != nil {
		t.Fatal(err)
	}
	if want := (redisStats{cpu: 1250301 * time.Microsecond, commands: 1234}); got != want {
		t.Errorf("parseInfo = %+v, want %+v", got, want)
	}

	for name, bad := range map[string]string{
		"no commands":   "used_cpu_sys:1\r\nused_cpu_user:1\r\n",
		"no user CPU":   "used_cpu_sys:1\r\ntotal_commands_processed:1\r\n",
		"bad CPU":       "used_cpu_sys:x\r\nused_cpu_user:1\r\ntotal_commands_processed:1\r\n",
		"bad commands":  "used_cpu_sys:1\r\nused_cpu_user:1\r\ntotal_commands_processed:-1\r\n",
		"twice":         "used_cpu_sys:1\r\nused_cpu_sys:1\r\ntotal_commands_processed:1\r\n",
		"empty":         "",
		"children only": "used_cpu_sys_children:1\r\nused_cpu_user_children:1\r\ntotal_commands_processed:1\r\n",
	} {
		if s, err := parseInfo(bad); err == nil {
			t.Errorf("%s: parseInfo = %+v, want an error", name, s)
		}
	}
}

func TestReadBulk(t *testing.T) {
	for _, tc := range []struct {
		reply, want string
		ok          bool
	}{
		{"$5\r\nhello\r\n", "hello", true},
		{"$0\r\n\r\n", "", true},
		{"$6\r\na\r\nb:c\r\n", "a\r\nb:c", true},
		{"-ERR unknown command\r\n", "", false},
		{"+OK\r\n", "", false},
		{"$-1\r\n", "", false},
		{"$10\r\nshort\r\n", "", false},
		{"", "", false},
	} {
		got, err := readBulk(bufio.NewReader(strings.NewReader(tc.reply)))
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("readBulk(%q) = %q, %v; want %q, ok %v", tc.reply, got, err, tc.want, tc.ok)
		}
	}
}

// TestRedisInfo reads a real redis-server's counters.
func TestRedisInfo(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("no redis-server")
	}
	r, err := harness.StartRedis(bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Kill()
	s0, err := redisInfo(r.Addr)
	if err != nil {
		t.Fatal(err)
	}
	s1, err := redisInfo(r.Addr)
	if err != nil {
		t.Fatal(err)
	}
	// The second INFO counts the first, not itself.
	if n := s1.commands - s0.commands; n != 1 {
		t.Errorf("commands between two INFOs = %d, want 1", n)
	}
	if s1.cpu < s0.cpu {
		t.Errorf("CPU went back from %v to %v", s0.cpu, s1.cpu)
	}
	r.Kill()
	if _, err := redisInfo(r.Addr); err == nil {
		t.Error("INFO answered after Kill")
	}
}

func TestPairedRatios(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want string
	}{
		{nil, "–"},
		{[]float64{0.6}, "0.60"},
		{[]float64{0.7, 0.5, 0.6, 0.9}, "0.60 (0.50–0.90)"}, // the lower median of an even count
		{[]float64{0.58, 0.47, 0.67, 0.55, 0.58}, "0.58 (0.47–0.67)"},
	} {
		if got := pairedRatios(c.in); got != c.want {
			t.Errorf("pairedRatios(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestCodeListAndFailed(t *testing.T) {
	m := measured{Result: &loadgen.Result{Requests: 12, Codes: map[string]uint64{"Unavailable": 2, "OK": 9, "DeadlineExceeded": 1}}}
	if got, want := codeList(m.Codes), "DeadlineExceeded 1, OK 9, Unavailable 2"; got != want {
		t.Errorf("codeList = %q, want %q", got, want)
	}
	if got := failed(m); got != 3 {
		t.Errorf("failed = %d, want 3", got)
	}
}

// TestChosen: the Redis store's runs keep to -workloads.
func TestChosen(t *testing.T) {
	b := &bench{s: settings{workloads: []string{"hot", "multi"}}}
	if got := b.chosen(redisWorkloads); !slices.Equal(got, []string{"multi", "hot"}) {
		t.Errorf("Redis workloads with -workloads hot,multi: %v, want [multi hot]", got)
	}
	b.s.workloads = []string{"hot"}
	if got := b.chosen(keyWorkloads); len(got) != 0 {
		t.Errorf("key workloads with -workloads hot: %v, want none", got)
	}
}
