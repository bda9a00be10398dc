package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// machine describes where the benchmark ran.
type machine struct {
	cpu, kernel, memory, load, goVersion, date, commit string
	cores                                              int
}

func describe() machine {
	m := machine{cores: runtime.NumCPU(), goVersion: runtime.Version(), date: time.Now().UTC().Format("2006-01-02 15:04 MST")}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			if kb, err := strconv.ParseFloat(f[1], 64); err == nil {
				m.memory = fmt.Sprintf("%.0f GiB", kb/(1<<20))
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = "Linux " + strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		m.commit = strings.TrimSpace(string(out))
	}
	return m
}

// buildName names the Sluice build bin for the report: what its
// `version` command reports (see versionName), else its file name.
func buildName(bin string) string {
	out, err := exec.Command(bin, "version").Output()
	if err == nil {
		if name, ok := versionName(string(out)); ok {
			return name
		}
	}
	return "`" + filepath.Base(bin) + "`"
}

// versionName names a build by its `sluice version` line, "sluice V
// (commit C, GOVERSION)", C shortened to 7 digits: "commit V" if V starts
// with it (`make build` stamps `git describe --always --dirty`, without
// tags the short hash, "-dirty" added for uncommitted changes), V if V
// names it otherwise (a tag's describe) or C is unknown, "V (commit C)"
// if V does not name it, "commit C" if V is "dev" (an unstamped build
// whose commit Go recorded); false if the line is not one or names
// neither.
func versionName(line string) (string, bool) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(line), "sluice ")
	v, rest, ok2 := strings.Cut(rest, " (commit ")
	c, _, ok3 := strings.Cut(rest, ", ")
	if !ok || !ok2 || !ok3 || v == "" || strings.ContainsAny(v, " \n") || strings.ContainsAny(c, " \n()") {
		return "", false
	}
	known := c != "" && c != "unknown"
	short := c[:min(len(c), 7)]
	switch {
	case v == "dev" && !known:
		return "", false
	case v == "dev":
		return "commit " + short, true
	case known && strings.HasPrefix(v, short):
		return "commit " + v, true
	case !known || strings.Contains(v, short):
		return v, true
	default:
		return fmt.Sprintf("%s (commit %s)", v, short), true
	}
}
