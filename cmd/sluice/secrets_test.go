package main

import (
	"flag"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redact"
)

// TestBinary_SecretsNeverShown: passwords, the xDS stream's headers and
// credentials in addresses given on the command line appear nowhere Sluice
// shows them: /debug/pprof/cmdline, the log, the status page.
func TestBinary_SecretsNeverShown(t *testing.T) {
	p := startBinary(t, "--config-source", "xds", "--xds-server", "sluice:hunter1@127.0.0.1:1", "--start-without-config",
		"--xds-headers", "authorization:Bearer hunter2", "--redis-password=hunter3", "--redis-url", "redis://u:hunter4@127.0.0.1:1",
		"--redis-sentinel-password", "hunter5", "--debug-addr", "127.0.0.1:0")
	var debugAddr string
	for deadline := time.Now().Add(mustWithin); debugAddr == ""; {
		if m := regexp.MustCompile(`msg="debug endpoints" addr=(\S+)`).FindStringSubmatch(p.log()); m != nil {
			debugAddr = m[1]
		} else if time.Now().After(deadline) {
			t.Fatal("no debug address in the log")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The xDS client has tried to connect, and logged it.
	for deadline := time.Now().Add(mustWithin); !strings.Contains(p.log(), "xds: stream ended"); {
		if time.Now().After(deadline) {
			t.Fatal("no xDS attempt in the log")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmdline := httpGet(t, "http://"+debugAddr+"/debug/pprof/cmdline")
	args := strings.Split(cmdline, "\x00")
	if len(args) < 10 || !strings.HasSuffix(args[0], "sluice") || args[1] != "serve" {
		t.Errorf("/debug/pprof/cmdline = %q, want sluice's command line", cmdline)
	}
	for _, want := range []string{"sluice:xxxxx@127.0.0.1:1", "--redis-password=xxxxx", "redis://u:xxxxx@127.0.0.1:1"} {
		if !strings.Contains(cmdline, want) {
			t.Errorf("/debug/pprof/cmdline lacks %q: %q", want, cmdline)
		}
	}
	overview := httpGet(t, "http://"+p.httpAddr+"/ui/api/overview")
	if !strings.Contains(overview, "sluice:xxxxx@127.0.0.1:1") {
		t.Errorf("the status page does not show the xDS server: %s", overview)
	}
	for where, text := range map[string]string{"/debug/pprof/cmdline": cmdline, "the log": p.log(), "/ui/api/overview": overview} {
		if m := regexp.MustCompile(`hunter\d`).FindString(text); m != "" {
			t.Errorf("%s shows the secret %q:\n%s", where, m, text)
		}
	}
}

func TestShownValue(t *testing.T) {
	for _, tc := range []struct{ flag, value, want string }{
		{"redis-password", "hunter2", redact.Mask},
		{"redis-password", "", ""},
		{"redis-url", "redis://u:hunter2@r:6379", "redis://u:xxxxx@r:6379"},
		{"redis-cluster", "a:1,u:hunter2@b:2", "a:1,u:xxxxx@b:2"},
		{"xds-headers", "authorization:Bearer hunter2", redact.Mask},
		{"config", "limits/", "limits/"},
	} {
		if got := shownValue(tc.flag, tc.value); got != tc.want {
			t.Errorf("shownValue(%q, %q) = %q, want %q", tc.flag, tc.value, got, tc.want)
		}
	}
}

// TestRedisDeployment_NoCredentials: the status page's description of
// the Redis deployment never holds a password, whatever the form of the
// addresses.
func TestRedisDeployment_NoCredentials(t *testing.T) {
	for _, args := range [][]string{
		{"--redis-url", "redis://u:hunter2@r:6379/0"},
		{"--redis-url", "redis://u:hun%zzter2@r:6379"},
		{"--redis-cluster", "c1:7000,u:hunter2@c2:7000"},
		{"--redis-sentinel", "redis://:hunter2@s1:26379,s2:26379", "--redis-sentinel-master", "m"},
		{"--redis-persecond-url", "redis://u:hunter2@r:6379/0"},
		{"--redis-persecond-cluster", "c1:7000,u:hunter2@c2:7000"},
		{"--redis-persecond-sentinel", "redis://:hunter2@s1:26379", "--redis-persecond-sentinel-master", "m"},
	} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		var f serveFlags
		f.register(fs)
		backends["redis"].newConfig(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		for _, s := range append(redisDeployment(fs, "redis"), redisDeployment(fs, "redis-persecond")...) {
			if strings.Contains(s.Value, "hunter2") {
				t.Errorf("%q: %s = %q", args, s.Name, s.Value)
			}
		}
	}
}

// TestServe_RedisURLPasswordNeverPrinted: a Redis URL whose password has
// a character that the URL parser's error escapes ('"', '\') fails serve
// with an error that holds the password in no form.
func TestServe_RedisURLPasswordNeverPrinted(t *testing.T) {
	for _, pass := range []string{`pa"ss`, `pa\ss`, `p"a\ss`} {
		for _, flagName := range []string{"--redis-url", "--redis-persecond-url"} {
			args := []string{"serve", "--config", "testdata/serve", "--store", "redis", "--redis-url", "redis://127.0.0.1:1"}
			args = append(args, flagName, "redis://:"+pass+"@127.0.0.1:1")
			code, out, errOut := runMain(t, args...)
			q := strconv.Quote(pass)
			if code == 0 || strings.Contains(out+errOut, pass) || strings.Contains(out+errOut, q[1:len(q)-1]) {
				t.Errorf("%s with the password %s: exit %d, output %q", flagName, pass, code, out+errOut)
			}
		}
	}
}
