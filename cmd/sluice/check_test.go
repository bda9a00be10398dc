package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func runMain(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	code = Main(ctx, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestCheck_ExampleConfigs(t *testing.T) {
	code, out, errOut := runMain(t, "check", "--config", "../../examples/config")
	if code != 0 || errOut != "" {
		t.Fatalf("check examples/config: exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{
		"../../examples/config: OK, 3 domains, 19 rules\n",
		"\ndomain plans\n",
		"  customer[0]  20/second     fixed_window  name=per_second\n",
		"  customer[2]  5000/day      fixed_window  name=per_day_next shadow_mode\n",
		"  feature      100000/month  fixed_window  quota_mode\n",
		"\ndomain edge\n",
		"\ndomain internal\n",
		"  remote_address                 100/second  fixed_window\n",
		"  path_/v1/uploads/*             10/minute   token_bucket burst 20\n",
		"  plan_premium.path_/v1/search*  600/minute  fixed_window           replaces=search\n",
		"  path_/healthz                  unlimited   -\n",
		"  user_agent_*bot*               30/minute   fixed_window           shadow_mode\n",
		"  password_reset                    3/15*minute   sliding_window\n",
		"  export                            20/30*second  fixed_window\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, " \n") {
		t.Errorf("summary has trailing spaces:\n%s", out)
	}
	code, out, _ = runMain(t, "check", "--config", "../../examples/bench.yaml")
	if code != 0 || !strings.Contains(out, "OK, 1 domain, 6 rules") || !strings.Contains(out, "  hot_hot  10/second ") {
		t.Errorf("check examples/bench.yaml: exit %d\n%s", code, out)
	}
}

func TestCheck_ReportsEveryError(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"a.yaml": "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
		"b.yaml": "domain: web\ndescriptors:\n  - key: \"\"\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 2}\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut := runMain(t, "check", "--config", dir)
	want := "config: " + filepath.Join(dir, "a.yaml") + `:4: descriptors[0]: unknown unit "fortnight" (want second, minute, hour, day, week, month or year)
config: ` + filepath.Join(dir, "b.yaml") + `:3: descriptors[0]: descriptor has an empty key
config: ` + filepath.Join(dir, "b.yaml") + `:5: descriptors[1]: burst needs algorithm: token_bucket
` + dir + ": 3 errors\n"
	if code != 1 || out != "" || errOut != want {
		t.Errorf("check: exit %d, stdout %q, stderr:\n%s\nwant exit 1 and:\n%s", code, out, errOut, want)
	}
}

// TestCheck_Calendar: a calendar rule reads as its period and zone; an
// unknown zone is an error at its line.
func TestCheck_Calendar(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "budgets.yaml")
	text := "domain: budgets\ndescriptors:\n" +
		"  - key: tenant\n    rate_limit: {unit: month, requests_per_unit: 1000000, calendar: true, time_zone: Europe/Berlin}\n" +
		"  - key: team\n    rate_limit: {unit: month, unit_multiplier: 3, requests_per_unit: 50, calendar: true, algorithm: sliding_window}\n"
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runMain(t, "check", "--config", file)
	for _, want := range []string{
		"  tenant  1000000/calendar month (Europe/Berlin)  fixed_window\n",
		"  team    50/3 calendar months (UTC)              sliding_window\n",
	} {
		if code != 0 || errOut != "" || !strings.Contains(out, want) {
			t.Errorf("check: exit %d, stderr %q, summary lacks %q:\n%s", code, errOut, want, out)
		}
	}
	text = strings.Replace(text, "Europe/Berlin", "Europe/Atlantis", 1)
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = runMain(t, "check", "--config", file)
	want := "config: " + file + `:4: descriptors[0]: unknown time_zone "Europe/Atlantis" (want an IANA time zone name such as Europe/Berlin or UTC)` + "\n"
	if code != 1 || !strings.HasPrefix(errOut, want) {
		t.Errorf("check: exit %d, stderr %q, want it to start with %q", code, errOut, want)
	}
}

func TestCheck_MergeDomains(t *testing.T) {
	dir := t.TempDir()
	for name, key := range map[string]string{"a.yaml": "user", "b.yaml": "team"} {
		text := "domain: api\ndescriptors:\n  - key: " + key + "\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if code, _, errOut := runMain(t, "check", "--config", dir); code != 1 || !strings.Contains(errOut, "--merge-domains") {
		t.Errorf("without --merge-domains: exit %d, stderr %q", code, errOut)
	}
	if code, out, _ := runMain(t, "check", "--config", dir, "--merge-domains"); code != 0 || !strings.Contains(out, "OK, 1 domain, 2 rules") {
		t.Errorf("with --merge-domains: exit %d, stdout %q", code, out)
	}
}

func TestCheck_Usage(t *testing.T) {
	cases := []struct {
		args []string
		code int
		err  string
	}{
		{[]string{"check"}, 2, "--config is required"},
		{[]string{"check", "--config", "x", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"check", "--bogus"}, 2, "flag provided but not defined"},
		{[]string{"check", "-h"}, 0, "usage: sluice check"},
		{[]string{"check", "--config", t.TempDir()}, 1, "no *.yaml or *.yml files"},
		{[]string{"check", "--config", filepath.Join(t.TempDir(), "missing")}, 1, "no such file or directory"},
	}
	for _, c := range cases {
		code, _, errOut := runMain(t, c.args...)
		if code != c.code || !strings.Contains(errOut, c.err) {
			t.Errorf("sluice %s: exit %d, stderr %q; want exit %d and %q", strings.Join(c.args, " "), code, errOut, c.code, c.err)
		}
	}
}

// TestCheck_Overlay: check applies an overlay to limits as serve applies
// it to pushed ones, marks the rules it changed with its file:line, and
// exits 1 on an entry that changes no rule or on a bad overlay.
func TestCheck_Overlay(t *testing.T) {
	const limits = "testdata/envoy-gateway/limits"
	code, out, errOut := runMain(t, "check", "--config", limits, "--xds-overlay", "../../examples/overlay")
	if code != 0 || errOut != "" {
		t.Fatalf("check with examples/overlay: exit %d, stderr %q\n%s", code, errOut, out)
	}
	// Columns aligned with runs of spaces, compared as one.
	spaced := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{
		".rule-0-match-0 60/hour token_bucket burst 3 overlay=../../examples/overlay/token-bucket.yaml:11 ",
		".rule-1-match-0[0] 10/30*second sliding_window overlay=../../examples/overlay/sliding-window.yaml:9 ",
		".rule-1-match-0[1] 5000000000/day fixed_window overlay=../../examples/overlay/sliding-window.yaml:9 ",
		".rule-0-match--1_rule-0-match--1[0] 10/30*second fixed_window overlay=../../examples/overlay/fixed-window.yaml:10 ",
		".rule-0-match--1_rule-0-match--1[1] 10000000000/month fixed_window overlay=../../examples/overlay/fixed-window.yaml:10 ",
		"overlay ../../examples/overlay: 3 entries in 3 files, 3 applied",
	} {
		if !strings.Contains(spaced, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}

	dir := t.TempDir()
	overlay := filepath.Join(dir, "o.yaml")
	if err := os.WriteFile(overlay, []byte("domain: default/eg/http\ndescriptors:\n  - key: httproute/default/*\n    value: \"*\"\n    descriptors:\n      - key: rule-9-match-0\n        rate_limit: {algorithm: token_bucket}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = runMain(t, "check", "--config", limits, "--xds-overlay", overlay)
	if want := overlay + ":6: default/eg/http | httproute/default/*=* | rule-9-match-0: matches no rate_limit of the pushed config\n"; code != 1 || !strings.Contains(errOut, want) {
		t.Errorf("an entry matching nothing: exit %d, stderr %q, want 1 and %q", code, errOut, want)
	}
	if err := os.WriteFile(overlay, []byte("domain: default/eg/http\ndescriptors:\n  - key: rule-0-match-0\n    rate_limit: {unit: minute}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = runMain(t, "check", "--config", limits, "--xds-overlay", overlay)
	if want := overlay + ":4: descriptors[0]: unit in rate_limit cannot be set in an overlay"; code != 1 || !strings.Contains(errOut, want) {
		t.Errorf("a bad overlay: exit %d, stderr %q, want 1 and %q", code, errOut, want)
	}
}
