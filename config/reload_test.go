package config

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"
)

// limitsFile is a one-rule config of domain with the given limit.
func limitsFile(domain string, limit int) string {
	return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", domain, limit)
}

// writeAtomic replaces a file the way editors and config tools do.
func writeAtomic(t testing.TB, path, text string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// limitOf returns the limit of domain's user rule in the current table, or
// -1 when there is no table, domain or rule.
func limitOf(r *Reloader, domain string) int { return limitIn(r.Current(), domain) }

// limitIn is limitOf of table tbl.
func limitIn(tbl *Table, domain string) int {
	if tbl == nil {
		return -1
	}
	rule, _ := tbl.Match(domain, []Entry{{"user", "u"}}, nil)
	if rule == nil {
		return -1
	}
	return int(rule.RequestsPerUnit)
}

type reloadEvent struct {
	tbl *Table
	err error
}

// watch runs r.Run with a short debounce and returns the reload events; the
// watcher stops (and is checked to stop cleanly) when the test ends.
func watch(t *testing.T, r *Reloader) <-chan reloadEvent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan reloadEvent, 16)
	r.src.(*files).debounce = 5 * time.Millisecond
	r.OnReload(func(tbl *Table, err error) {
		select {
		case events <- reloadEvent{tbl, err}:
		case <-ctx.Done():
		}
	})
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run returned %v, want nil", err)
		}
	})
	// Run is watching once a change is seen: touch a dotfile in the watched
	// directory until one reload arrives.
	probeDir := r.src.(*files).path
	if fi, err := os.Stat(probeDir); err != nil || !fi.IsDir() {
		probeDir = filepath.Dir(probeDir)
	}
	waitUntil(t, events, "the watcher to start", func(reloadEvent) bool { return true }, func() {
		writeAtomic(t, filepath.Join(probeDir, ".probe"), "x")
	})
	return events
}

// waitUntil reads reload events until ok accepts one. poke, if not nil, is
// called while waiting (to create the change being waited for). It fails
// the test after 10 s. ok judges the event's own table, never
// r.Current(): events of reloads from before the change may still be
// queued (watch's probe can cause several, an edit in place two) when the
// change is already in force.
func waitUntil(t *testing.T, events <-chan reloadEvent, what string, ok func(reloadEvent) bool, poke func()) reloadEvent {
	t.Helper()
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	if poke != nil {
		poke()
	}
	for {
		select {
		case ev := <-events:
			if ok(ev) {
				return ev
			}
		case <-tick.C:
			if poke != nil {
				poke()
			}
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestReloader_FirstLoad(t *testing.T) {
	dir := t.TempDir()
	writeAtomic(t, filepath.Join(dir, "api.yaml"), limitsFile("api", 10))
	r, err := NewReloader(dir, Options{}, nil)
	if err != nil {
		t.Fatalf("NewReloader: %v", err)
	}
	st := r.Status()
	if limitOf(r, "api") != 10 || !st.LastOK || st.Successes != 1 || st.Failures != 0 || st.Hash != r.Current().Hash() || st.LastSuccess.IsZero() {
		t.Errorf("after the first load: limit %d, status %+v", limitOf(r, "api"), st)
	}
}

func TestReloader_EmptyThenFirstConfig(t *testing.T) {
	dir := t.TempDir()
	r, err := NewReloader(dir, Options{}, nil)
	if !errors.Is(err, ErrEmpty) || r == nil || r.Current() != nil {
		t.Fatalf("NewReloader(empty) = %v, %v, want a Reloader without a table and ErrEmpty", r, err)
	}
	if st := r.Status(); st.LastOK || st.Failures != 1 || st.Hash != "" {
		t.Errorf("status after an empty start: %+v", st)
	}
	writeAtomic(t, filepath.Join(dir, "api.yaml"), limitsFile("api", 3))
	if err := r.Reload(); err != nil || limitOf(r, "api") != 3 {
		t.Errorf("Reload = %v, limit %d; want nil, 3", err, limitOf(r, "api"))
	}
}

// TestReloader_ChangeBeforeTheWatch: files changed after the first load
// but before Run watches them (a server's start, on a busy machine) make
// no event; Run loads them once its watch is in place. Unchanged files
// cause no reload.
func TestReloader_ChangeBeforeTheWatch(t *testing.T) {
	for _, c := range []struct {
		name    string
		first   string // "" for an empty directory
		reloads uint64 // reloads Run makes at its start
	}{
		{"first config", "", 1},
		{"edit", limitsFile("api", 10), 1},
		{"unchanged", limitsFile("api", 3), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if c.first != "" {
				writeAtomic(t, filepath.Join(dir, "api.yaml"), c.first)
			}
			r, _ := NewReloader(dir, Options{}, nil)
			before := r.Status()
			writeAtomic(t, filepath.Join(dir, "api.yaml"), limitsFile("api", 3))
			reloads := make(chan struct{}, 4)
			r.OnReload(func(*Table, error) { reloads <- struct{}{} })
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			if c.reloads > 0 {
				select {
				case <-reloads:
				case <-time.After(10 * time.Second):
					t.Fatal("no reload of the files changed before the watch")
				}
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			st := r.Status()
			if limitOf(r, "api") != 3 || st.Successes+st.Failures-before.Successes-before.Failures != c.reloads {
				t.Errorf("limit %d after %d reloads at Run's start, want 3 after %d", limitOf(r, "api"),
					st.Successes+st.Failures-before.Successes-before.Failures, c.reloads)
			}
		})
	}
}

func TestReloader_BadConfigKeepsTheOldTable(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "api.yaml")
	writeAtomic(t, file, limitsFile("api", 10))
	r, err := NewReloader(dir, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	old := r.Current()
	var hooked []error
	r.OnReload(func(tbl *Table, err error) {
		if tbl != r.Current() {
			t.Error("the hook got a table that is not in force")
		}
		hooked = append(hooked, err)
	})
	writeAtomic(t, file, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight}\n")
	err = r.Reload()
	var es *Errors
	if !errors.As(err, &es) || len(es.List) != 1 || es.List[0].Line != 4 {
		t.Fatalf("Reload(bad) = %v, want one error at line 4", err)
	}
	st := r.Status()
	if r.Current() != old || st.LastOK || st.Failures != 1 || st.Successes != 1 || st.LastError != err || st.Hash != old.Hash() {
		t.Errorf("after a bad reload: table replaced=%t, status %+v", r.Current() != old, st)
	}
	// Unchanged files: the same table stays, so counters keep their keys.
	writeAtomic(t, file, limitsFile("api", 10))
	if err := r.Reload(); err != nil || r.Current() != old {
		t.Errorf("Reload(unchanged) = %v, replaced=%t; want nil and the same table", err, r.Current() != old)
	}
	if st := r.Status(); !st.LastOK || st.LastError != nil || st.Successes != 2 {
		t.Errorf("status after recovering: %+v", st)
	}
	if len(hooked) != 2 || hooked[0] == nil || hooked[1] != nil {
		t.Errorf("hooks saw %v, want [error, nil]", hooked)
	}
}

func TestReloader_WatchEditAddRemove(t *testing.T) {
	dir := t.TempDir()
	api := filepath.Join(dir, "api.yaml")
	writeAtomic(t, api, limitsFile("api", 10))
	r, err := NewReloader(dir, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	events := watch(t, r)

	// Edit in place (truncate and write): a reload may see a half-written
	// file and fail; the next event brings the final content.
	if err := os.WriteFile(api, []byte(limitsFile("api", 20)), 0o644); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, events, "the edit", func(ev reloadEvent) bool { return limitIn(ev.tbl, "api") == 20 }, nil)

	web := filepath.Join(dir, "web.yaml")
	writeAtomic(t, web, limitsFile("web", 5))
	waitUntil(t, events, "the added file", func(ev reloadEvent) bool { return limitIn(ev.tbl, "web") == 5 }, nil)

	if err := os.Remove(web); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, events, "the removed file", func(ev reloadEvent) bool { return ev.err == nil && !ev.tbl.HasDomain("web") }, nil)

	good := r.Current()
	writeAtomic(t, api, "domain: api\ndescriptors: [{key: user, rate_limit: {unit: fortnight}}]\n")
	ev := waitUntil(t, events, "the bad edit", func(ev reloadEvent) bool { return ev.err != nil }, nil)
	if ev.tbl != good || r.Current() != good || limitOf(r, "api") != 20 || r.Status().LastOK {
		t.Errorf("after a bad edit: table replaced=%t, limit %d, status %+v", r.Current() != good, limitOf(r, "api"), r.Status())
	}
}

func TestReloader_WatchConfigMapSymlinkSwap(t *testing.T) {
	// The layout kubelet gives a mounted ConfigMap: the files are symlinks
	// through ..data, which is swapped atomically on an update.
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"..2026_01/api.yaml": limitsFile("api", 1)})
	for _, l := range [][2]string{{"..2026_01", "..data"}, {"..data/api.yaml", "api.yaml"}} {
		if err := os.Symlink(l[0], filepath.Join(dir, l[1])); err != nil {
			t.Fatal(err)
		}
	}
	r, err := NewReloader(dir, Options{}, nil)
	if err != nil || limitOf(r, "api") != 1 {
		t.Fatalf("NewReloader = %v, limit %d", err, limitOf(r, "api"))
	}
	events := watch(t, r)

	writeFiles(t, dir, map[string]string{"..2026_02/api.yaml": limitsFile("api", 2)})
	if err := os.Symlink("..2026_02", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "..2026_01")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, events, "the ..data swap", func(ev reloadEvent) bool { return limitIn(ev.tbl, "api") == 2 }, nil)
}

func TestReloader_WatchSingleFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "limits.yaml")
	writeAtomic(t, file, limitsFile("api", 1))
	r, err := NewReloader(file, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	events := watch(t, r)
	writeAtomic(t, file, limitsFile("api", 2))
	waitUntil(t, events, "the edit of the watched file", func(ev reloadEvent) bool { return limitIn(ev.tbl, "api") == 2 }, nil)
}

// TestReloader_ReloadUnderConcurrentMatching swaps between two configs 1,000
// times while goroutines match. Each config gives both rules the same limit,
// so a reader that saw a mix of two configs would see two limits.
func TestReloader_ReloadUnderConcurrentMatching(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "api.yaml")
	config := func(limit int) string {
		return fmt.Sprintf(`domain: api
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: %d}
  - key: b
    value: "x*"
    rate_limit: {unit: second, requests_per_unit: %d}
`, limit, limit)
	}
	// api.yaml is a symlink to one of two prepared files; swapping it is
	// much cheaper than rewriting a file.
	writeFiles(t, dir, map[string]string{".v1": config(1), ".v2": config(2)})
	swap := func(limit int) {
		tmp := filepath.Join(dir, ".api.yaml.tmp")
		if err := os.Symlink(fmt.Sprintf(".v%d", limit), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	swap(1)
	r, err := NewReloader(dir, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var matches atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 0, 64)
			ea, eb := []Entry{{"a", "1"}}, []Entry{{"b", "xyz"}}
			for !stop.Load() {
				tbl := r.Current()
				ra, _ := tbl.Match("api", ea, buf)
				rb, _ := tbl.Match("api", eb, buf)
				if ra == nil || rb == nil || ra.RequestsPerUnit != rb.RequestsPerUnit {
					t.Errorf("one table gave rules %v and %v", ra, rb)
					return
				}
				matches.Add(1)
				runtime.Gosched() // leave the reloading goroutine its share of 2 CPUs
			}
		}()
	}
	for i := 0; i < 1000; i++ {
		swap(1 + i%2)
		if err := r.Reload(); err != nil {
			t.Fatalf("reload %d: %v", i, err)
		}
		if got, _ := r.Current().Match("api", []Entry{{"a", "1"}}, nil); got.RequestsPerUnit != uint64(1+i%2) {
			t.Fatalf("reload %d: rule %v, want limit %d", i, got, 1+i%2)
		}
	}
	stop.Store(true)
	wg.Wait()
	if st := r.Status(); st.Successes != 1001 || matches.Load() == 0 {
		t.Errorf("status %+v after 1,000 reloads, %d matches", st, matches.Load())
	}
}

func TestReloader_WatchDirectoryThatAppearsLater(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "limits")
	r, err := NewReloader(dir, Options{}, nil)
	if !errors.Is(err, os.ErrNotExist) || r.Current() != nil {
		t.Fatalf("NewReloader(missing) = %v", err)
	}
	events := watch(t, r)
	// Create the directory with its file in place, as a deploy would.
	staging := filepath.Join(parent, ".staging")
	writeFiles(t, staging, map[string]string{"api.yaml": limitsFile("api", 4)})
	if err := os.Rename(staging, dir); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, events, "the new directory", func(ev reloadEvent) bool { return limitIn(ev.tbl, "api") == 4 }, nil)
	// Now the directory itself is watched.
	writeAtomic(t, filepath.Join(dir, "api.yaml"), limitsFile("api", 5))
	waitUntil(t, events, "an edit in the new directory", func(ev reloadEvent) bool { return limitIn(ev.tbl, "api") == 5 }, nil)
}

func TestReloader_WatchRootSymlinkSwap(t *testing.T) {
	// envoyproxy/ratelimit's default deployment: RUNTIME_ROOT is a symlink
	// swapped to a new directory tree.
	root := t.TempDir()
	writeFiles(t, root, map[string]string{
		"v1/limits/api.yaml": limitsFile("api", 1),
		"v2/limits/api.yaml": limitsFile("api", 2),
	})
	if err := os.Symlink("v1", filepath.Join(root, "current")); err != nil {
		t.Fatal(err)
	}
	r, err := NewReloader(filepath.Join(root, "current", "limits"), Options{}, nil)
	if err != nil || limitOf(r, "api") != 1 {
		t.Fatalf("NewReloader = %v, limit %d", err, limitOf(r, "api"))
	}
	events := watch(t, r)
	if err := os.Symlink("v2", filepath.Join(root, ".current.tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(root, ".current.tmp"), filepath.Join(root, "current")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, events, "the root swap", func(ev reloadEvent) bool { return limitIn(ev.tbl, "api") == 2 }, nil)
	// The watch now follows the new tree.
	writeAtomic(t, filepath.Join(root, "v2", "limits", "api.yaml"), limitsFile("api", 3))
	waitUntil(t, events, "an edit in the new tree", func(ev reloadEvent) bool { return limitIn(ev.tbl, "api") == 3 }, nil)
}

func TestReloader_WatchDirectoryReplaced(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "limits")
	writeFiles(t, dir, map[string]string{"api.yaml": limitsFile("api", 1)})
	r, err := NewReloader(dir, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	events := watch(t, r)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, events, "the failed reload of a removed directory", func(ev reloadEvent) bool { return ev.err != nil }, nil)
	if limitOf(r, "api") != 1 {
		t.Errorf("after removing the directory: limit %d, want the old 1", limitOf(r, "api"))
	}
	writeFiles(t, dir, map[string]string{"api.yaml": limitsFile("api", 2)})
	waitUntil(t, events, "the recreated directory", func(ev reloadEvent) bool { return limitIn(ev.tbl, "api") == 2 }, nil)
	writeAtomic(t, filepath.Join(dir, "api.yaml"), limitsFile("api", 3))
	waitUntil(t, events, "an edit in the recreated directory", func(ev reloadEvent) bool { return limitIn(ev.tbl, "api") == 3 }, nil)
}

// pushSource is a Source whose configs a test pushes: Run applies each
// one it receives.
type pushSource struct{ pushes chan func() (*Table, error) }

func (p pushSource) String() string { return "push" }

func (p pushSource) Run(ctx context.Context, r *Reloader) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case fn := <-p.pushes:
			_ = r.Update(fn)
		}
	}
}

func TestReloader_SourceUpdates(t *testing.T) {
	src := pushSource{make(chan func() (*Table, error))}
	r := NewSourceReloader(src, Empty(), nil)
	if tbl := r.Current(); tbl == nil || len(tbl.Domains()) != 0 {
		t.Fatalf("initial table %v, want Empty", tbl)
	}
	if st := r.Status(); st.Successes != 0 || st.Failures != 0 || st.Hash != Empty().Hash() {
		t.Errorf("initial status %+v", st)
	}
	if err := r.Reload(); err == nil {
		t.Error("Reload of a push source succeeded")
	}
	events := make(chan reloadEvent, 4)
	r.OnReload(func(tbl *Table, err error) { events <- reloadEvent{tbl, err} })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()

	load := func(text string) func() (*Table, error) {
		return func() (*Table, error) {
			return compile([]source{{name: "push.yaml", id: "push", data: []byte(text)}}, Options{}, nil)
		}
	}
	src.pushes <- load(limitsFile("api", 5))
	if ev := <-events; ev.err != nil || limitOf(r, "api") != 5 || ev.tbl != r.Current() {
		t.Fatalf("good push: %v, limit %d", ev.err, limitOf(r, "api"))
	}
	good := r.Current()
	src.pushes <- load("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight}\n")
	if ev := <-events; ev.err == nil || ev.tbl != good || r.Current() != good {
		t.Fatalf("bad push: %v; the table in force changed", ev.err)
	}
	if st := r.Status(); st.Successes != 1 || st.Failures != 1 || st.LastOK || st.Hash != good.Hash() {
		t.Errorf("status %+v, want 1 success then 1 failure", st)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
}

// TestReloader_FailureLogIsBounded: a config with thousands of problems,
// one of them huge, logs its first ten, one a line and each cut, then a
// count; an error that is not a list of problems is cut too.
func TestReloader_FailureLogIsBounded(t *testing.T) {
	var buf bytes.Buffer
	r := NewSourceReloader(pushSource{}, Empty(), slog.New(slog.NewTextHandler(&buf, nil)))
	es := &Errors{}
	for i := range 5000 {
		es.List = append(es.List, Error{File: `resource "r"`, Path: fmt.Sprintf("descriptors[%d]", i), Msg: "rate_limit has no unit"})
	}
	es.List[0].Msg = strings.Repeat("é", 40000)
	if err := r.Update(func() (*Table, error) { return nil, es }); err == nil {
		t.Fatal("Update succeeded")
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != maxLoggedProblems+1 || !strings.Contains(lines[maxLoggedProblems], "problems=5000 not_logged=4990") {
		t.Fatalf("%d lines, the last %q; want %d problems then the count", len(lines), lines[len(lines)-1], maxLoggedProblems)
	}
	for i, l := range lines {
		if len(l) > 2*maxLoggedBytes || !utf8.ValidString(l) {
			t.Errorf("line %d: %d bytes (valid UTF-8: %v)", i, len(l), utf8.ValidString(l))
		}
	}
	if !strings.Contains(lines[0], "(80000 bytes)") {
		t.Errorf("the huge problem does not say how long it was: %.300s", lines[0])
	}

	buf.Reset()
	_ = r.Update(func() (*Table, error) { return nil, errors.New(strings.Repeat("x", 100000)) })
	if n := strings.Count(buf.String(), "\n"); n != 1 || buf.Len() > 2*maxLoggedBytes {
		t.Errorf("a long error logged as %d lines of %d bytes", n, buf.Len())
	}
}

// TestReloader_Keep: the config in force named anew, after a failed
// update, makes the status good again without a load.
func TestReloader_Keep(t *testing.T) {
	calls := 0
	r := NewSourceReloader(pushSource{}, nil, nil)
	r.OnReload(func(*Table, error) { calls++ })
	if err := r.UpdateVersion("1", func() (*Table, error) { return Parse("a.yaml", []byte(limitsFile("api", 5)), Options{}) }); err != nil {
		t.Fatal(err)
	}
	good := r.Current()
	_ = r.UpdateVersion("2", func() (*Table, error) { return nil, errors.New("bad") })
	r.Keep("3")
	st := r.Status()
	if !st.LastOK || st.LastError != nil || st.Version != "3" || st.Successes != 1 || st.Failures != 1 || r.Current() != good || calls != 2 {
		t.Errorf("status %+v after Keep, %d hooks called; want version 3 good, 1 success, 1 failure, 2 hooks", st, calls)
	}
}

func TestSummary(t *testing.T) {
	es := &Errors{}
	for i := range 200 {
		es.List = append(es.List, Error{File: `resource "r"`, Path: fmt.Sprintf("descriptors[%d]", i), Msg: "rate_limit has no unit"})
	}
	msg := Summary(es, 4096)
	lines := strings.Split(msg, "\n")
	shown := len(lines) - 1
	if len(msg) > 4096 || lines[0] != es.List[0].Error() || lines[shown] != fmt.Sprintf("(%d more problems not shown)", 200-shown) {
		t.Errorf("summary of %d bytes, %d lines, ending %q", len(msg), len(lines), lines[shown])
	}
	// A single huge problem is cut; a short error is whole.
	huge := Summary(errors.New(strings.Repeat("y", 100000)), 4096)
	if len(huge) > 4096 || !strings.HasSuffix(huge, "(100000 bytes)") {
		t.Errorf("summary of one huge problem: %d bytes, ending %q", len(huge), huge[len(huge)-20:])
	}
	if got := Summary(errors.New("config: a: b"), 4096); got != "config: a: b" {
		t.Errorf("Summary = %q", got)
	}
}
