package config

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultDebounce is how long Run waits after the last change in the config
// directory before it reloads, so that an editor's or kubelet's burst of
// events causes one reload.
const DefaultDebounce = 100 * time.Millisecond

// ReloadStatus describes the reload history, for health checks and metrics.
type ReloadStatus struct {
	LastOK      bool      // whether the last attempt succeeded
	LastError   error     // the last attempt's error; nil if it succeeded
	Successes   uint64    // attempts that loaded a valid config
	Failures    uint64    // attempts that kept the old table
	LastSuccess time.Time // the zero time before the first success
	Hash        string    // Table.Hash of the table in force; "" if none
	// Version is the source's name for the config in force: an xDS
	// push's version_info; "" for files.
	Version string
}

// Source supplies a Reloader's configs: the limits files at a path (see
// NewReloader), or the pushes of an xDS server (package config/xds).
type Source interface {
	// Run follows the source until ctx is done and hands every new
	// config to r.Update. It returns nil when ctx is done, or an error
	// when it cannot follow the source at all.
	Run(ctx context.Context, r *Reloader) error
	// String names the source in logs: a path, "xds 10.0.0.1:18001".
	String() string
}

// Reloader holds the current Table and replaces it when its Source has a
// new config. Files and xDS pushes go through the same Update: the same
// compile, the same swap, status and hooks. Its methods are safe for
// concurrent use.
type Reloader struct {
	src Source
	log *slog.Logger

	cur     atomic.Pointer[Table]
	overlay atomic.Pointer[Overlay] // the overlay in force; nil if none

	mu     sync.Mutex // serialises updates; guards the fields below
	status ReloadStatus
	hooks  []func(*Table, error)
	// last is the compile of the config in force, run again when the
	// overlay changes.
	last     func() (*Table, error)
	ostatus  ReloadStatus // the overlay's load history
	overlaid bool         // an overlay was ever asked for
}

// NewReloader loads the config at path once and returns a Reloader for it.
// The Reloader is returned even when the load fails, together with the
// error (which wraps ErrEmpty for an empty directory): a server that allows
// starting without a config runs it and waits for a first good load;
// Current is nil until then.
func NewReloader(path string, opts Options, logger *slog.Logger) (*Reloader, error) {
	r := NewSourceReloader(&files{path: path, opts: opts, debounce: DefaultDebounce}, nil, logger)
	return r, r.Reload()
}

// NewSourceReloader returns a Reloader fed by src, which loads nothing
// until Run. initial, if not nil, is in force until the first successful
// update (Empty serves with no limits); otherwise Current is nil until then.
func NewSourceReloader(src Source, initial *Table, logger *slog.Logger) *Reloader {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &Reloader{src: src, log: logger}
	if initial != nil {
		r.cur.Store(initial)
		r.status.Hash = initial.Hash()
	}
	return r
}

// Current returns the table in force: one atomic load. It is nil only
// before a first successful load.
func (r *Reloader) Current() *Table { return r.cur.Load() }

// Status reports the reload history.
func (r *Reloader) Status() ReloadStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

// OnReload registers fn to be called after every reload attempt with the
// table in force afterwards and the attempt's error (nil on success). Hooks
// run one at a time, in the reloading goroutine; they must not call Reload
// or Update. Register them before Run.
func (r *Reloader) OnReload(fn func(*Table, error)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hooks = append(r.hooks, fn)
}

// Reload reads a file source's whole config again now (see Update). A
// Reloader of another source has nothing to read on demand: Reload
// returns an error and changes nothing.
func (r *Reloader) Reload() error {
	f, ok := r.src.(*files)
	if !ok {
		return fmt.Errorf("config: %s: reload on demand needs a file source", r.src)
	}
	return r.Update(func() (*Table, error) { return f.load(r.Overlay()) })
}

// Update compiles a new config with compile and, if it is valid, swaps it
// in with one pointer store. On failure the old table stays in force and
// the error, listing every problem, is logged and returned. A config
// whose content is unchanged (same Table.Hash) keeps the current table
// (and its counters' keys) as it is. Every attempt is counted in Status
// and passed to the OnReload hooks. Updates run one at a time. A failure
// logs its first problems, one a line, and how many more there are.
func (r *Reloader) Update(compile func() (*Table, error)) error {
	return r.UpdateVersion("", compile)
}

// UpdateVersion is Update for a source that names its configs (an xDS
// push's version_info): on success Status().Version becomes version.
func (r *Reloader) UpdateVersion(version string, compile func() (*Table, error)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.update(version, compile)
}

// update is UpdateVersion with r.mu held.
func (r *Reloader) update(version string, compile func() (*Table, error)) error {
	t, err := compile()
	cur := r.cur.Load()
	if err != nil {
		r.status.LastOK, r.status.LastError = false, err
		r.status.Failures++
		r.logError(err, cur != nil)
	} else {
		if cur == nil || cur.Hash() != t.Hash() {
			r.cur.Store(t)
			r.log.Info("config loaded", "source", r.src.String(), "domains", len(t.Domains()), "rules", len(t.Rules()), "files", t.Files(), "hash", t.Hash())
			r.logOverlay(t)
		}
		r.last = compile
		cur = r.cur.Load()
		r.status.LastOK, r.status.LastError = true, nil
		r.status.Successes++
		r.status.LastSuccess = time.Now()
		r.status.Hash = cur.Hash()
		r.status.Version = version
	}
	for _, fn := range r.hooks {
		fn(cur, err)
	}
	return err
}

// Overlay returns the overlay in force (see LoadOverlay); nil if none. A
// Source's compile gives it to the config as Options.Overlay.
func (r *Reloader) Overlay() *Overlay { return r.overlay.Load() }

// OverlayStatus is an overlay's load history (Hash is the overlay's,
// Version empty) and the size of the overlay in force.
type OverlayStatus struct {
	ReloadStatus
	Files, Entries int // 0 before a first successful load
}

// OverlayStatus reports the overlay's load history; the zero status when
// no overlay was loaded.
func (r *Reloader) OverlayStatus() OverlayStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := OverlayStatus{ReloadStatus: r.ostatus}
	if o := r.overlay.Load(); o != nil {
		st.Files, st.Entries = o.files, len(o.entries)
	}
	return st
}

// HasOverlay reports whether LoadOverlay was ever called.
func (r *Reloader) HasOverlay() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.overlaid
}

// LoadOverlay reads the overlay at path (see config.LoadOverlay). A valid
// one goes in force, and the config in force is compiled again with it
// (recompile); an invalid one is logged with every problem's file and
// line and counted in OverlayStatus, and the overlay in force stays. The
// error is the load's.
func (r *Reloader) LoadOverlay(path string) error {
	o, err := LoadOverlay(path)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.overlaid = true
	if err != nil {
		r.ostatus.LastOK, r.ostatus.LastError = false, err
		r.ostatus.Failures++
		r.logProblems(err, "overlay not loaded", "overlay not reloaded; the previous overlay stays in force", r.overlay.Load() != nil, path)
		return err
	}
	r.ostatus.LastOK, r.ostatus.LastError = true, nil
	r.ostatus.Successes++
	r.ostatus.LastSuccess = time.Now()
	if cur := r.overlay.Load(); cur != nil && cur.Hash() == o.Hash() {
		return nil
	}
	r.ostatus.Hash = o.Hash()
	r.overlay.Store(o)
	r.log.Info("overlay loaded", "path", path, "files", o.files, "entries", len(o.entries), "hash", o.Hash())
	r.recompile()
	return nil
}

// recompile compiles the config in force again, with the overlay now in
// force, and swaps the table in if it changed, calling the OnReload
// hooks. It is not a load of the source: Status keeps its counts and its
// last attempt (a push rejected since stays the last attempt, and
// failed). Called with r.mu held.
func (r *Reloader) recompile() {
	if r.last == nil {
		return // nothing in force yet: the first load takes the overlay
	}
	t, err := r.last()
	if err != nil {
		// It compiled before, and an overlay makes no errors: only a
		// file source whose files changed since gets here. Its watch
		// reloads them.
		r.log.Error("config not compiled again with the new overlay; the config in force stays", "source", r.src.String(), "err", clip(err.Error(), maxLoggedBytes))
		return
	}
	if cur := r.cur.Load(); cur != nil && cur.Hash() == t.Hash() {
		return
	}
	r.cur.Store(t)
	r.status.Hash = t.Hash()
	r.log.Info("config compiled again with the new overlay", "source", r.src.String(), "rules", len(t.Rules()), "hash", t.Hash())
	r.logOverlay(t)
	for _, fn := range r.hooks {
		fn(t, nil)
	}
}

// RunOverlay watches the overlay at path as a files source's Run watches
// limits files, and loads it again (LoadOverlay) after changes settle,
// until ctx is done.
func (r *Reloader) RunOverlay(ctx context.Context, path string) error {
	return watchPath(ctx, path, DefaultDebounce, r.log, func() { _ = r.LoadOverlay(path) }, func() {
		o, err := LoadOverlay(path)
		cur := r.Overlay()
		if err == nil && (cur == nil || cur.Hash() != o.Hash()) || err != nil && cur != nil {
			_ = r.LoadOverlay(path)
		}
	})
}

// Bound of the overlay entries logged after a load.
const maxLoggedMisses = 10

// logOverlay warns of the overlay entries of t that change no rule or
// cannot apply to one.
func (r *Reloader) logOverlay(t *Table) {
	rep := t.Overlay()
	n := 0
	for _, list := range [][]OverlayMiss{rep.Problems, rep.Unmatched} {
		for _, m := range list {
			if n++; n > maxLoggedMisses {
				continue
			}
			msg := "overlay entry matches no rule"
			if m.Rule != "" {
				msg = "overlay entry cannot apply to a rule; the rule keeps its pushed limit"
			}
			r.log.Warn(msg, "file", m.File, "line", m.Line, "entry", clip(m.Match, maxLoggedBytes), "rule", clip(m.Rule, maxLoggedBytes), "reason", clip(m.Reason, maxLoggedBytes))
		}
	}
	if n > maxLoggedMisses {
		r.log.Warn("overlay entries not applied", "total", n, "not_logged", n-maxLoggedMisses)
	}
}

// Keep records that the source's config is, again, the one in force,
// now named version: an xDS server sent it again under a new version_info,
// or went back to it after a config that was rejected. The status becomes
// that of a successful load (LastOK, Version) without a compile: Successes,
// LastSuccess and the OnReload hooks are for loads.
func (r *Reloader) Keep(version string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status.LastOK, r.status.LastError = true, nil
	r.status.Version = version
}

// Run follows the source (for files: watches the config directory) until
// ctx is done.
func (r *Reloader) Run(ctx context.Context) error { return r.src.Run(ctx, r) }

// Bounds of the log of a failed load: a config with thousands of problems,
// or a huge one, must not flood the log on every attempt (an xDS server
// can push one every second).
const (
	maxLoggedProblems = 10   // problems logged one a line; then a count
	maxLoggedBytes    = 1024 // of one problem's message, or an error's
)

// logError logs a failed load: its first problems, one a line, then how
// many more there are.
func (r *Reloader) logError(err error, kept bool) {
	r.logProblems(err, "config not loaded", "config not reloaded; the previous config stays in force", kept, r.src.String())
}

// logProblems logs a failed load of source, msg or, when the previous load
// stays in force, keptMsg: its first problems, one a line, then how many
// more there are.
func (r *Reloader) logProblems(err error, msg, keptMsg string, kept bool, source string) {
	if kept {
		msg = keptMsg
	}
	var es *Errors
	if !errors.As(err, &es) {
		r.log.Error(msg, "source", source, "err", clip(err.Error(), maxLoggedBytes))
		return
	}
	for i, e := range es.List {
		if i == maxLoggedProblems {
			r.log.Error(msg, "source", source, "problems", len(es.List), "not_logged", len(es.List)-i)
			return
		}
		r.log.Error(msg, "file", clip(e.File, maxLoggedBytes), "line", e.Line, "descriptor", clip(e.Path, maxLoggedBytes), "err", clip(e.Msg, maxLoggedBytes))
	}
}

// files is the Source of limits files at a path: a file, or the *.yaml
// files of a directory.
type files struct {
	path     string
	opts     Options
	debounce time.Duration
}

func (f *files) String() string { return f.path }

// load compiles the files with overlay o (nil: none).
func (f *files) load(o *Overlay) (*Table, error) {
	opts := f.opts
	opts.Overlay = o
	return Load(f.path, opts)
}

// Run watches the config directory (a file's parent directory) and reloads
// after changes settle, until ctx is done. Watching the directory rather
// than the files sees edits, added and removed files, and the Kubernetes
// ConfigMap swap of the ..data symlink. When a directory on the path is a
// symbolic link (envoyproxy/ratelimit's RUNTIME_ROOT swap), the directory
// holding the link is watched too, and the watch follows the link to its
// new target. While the path does not exist, Run watches its parent and
// picks the path up when it appears. Run returns nil when ctx is done, or
// an error if it cannot watch at all.
func (f *files) Run(ctx context.Context, r *Reloader) error {
	return watchPath(ctx, f.path, f.debounce, r.log, func() { _ = r.Reload() }, func() { f.catchUp(r) })
}

// watchPath watches path's directory (see files.Run) and calls reload after
// changes settle, until ctx is done; catchUp, once the watch is in place,
// reloads if path changed since its last load. reload and catchUp log and
// count their own failures.
func watchPath(ctx context.Context, path string, debounce time.Duration, log *slog.Logger, reload, catchUp func()) error {
	f := &files{path: path, debounce: debounce}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("config: watch: %w", err)
	}
	defer w.Close()
	dirs := &watchSet{w: w, src: f, log: log, watched: map[string]string{}}
	if err := dirs.follow(); err != nil && len(dirs.watched) == 0 {
		return err
	}
	catchUp()
	// Reload once things have been quiet for the debounce time, or at the
	// latest ten debounce times after the first event of a burst.
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var first time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			log.Debug("config change", "event", ev.String())
			dirs.gone(ev)
			now := time.Now()
			if first.IsZero() {
				first = now
			}
			timer.Reset(f.settle(first, now))
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			log.Warn("config watch", "err", err)
			// Events may have been lost (queue overflow): reload to be sure.
			timer.Reset(f.debounce)
		case <-timer.C:
			first = time.Time{}
			// Watch the right directories before reading, so that no
			// change after the read goes unseen.
			if err := dirs.follow(); err != nil {
				log.Error("config watch", "err", err)
			}
			reload() // logged and counted; the old config stays
		}
	}
}

// catchUp reloads if the files changed between the last load and the
// start of the watch (a change then makes no event): it loads them once
// more and reloads when they load to another table, or fail to load where
// they loaded before.
func (f *files) catchUp(r *Reloader) {
	t, err := f.load(r.Overlay())
	cur := r.Current()
	if err == nil && (cur == nil || cur.Hash() != t.Hash()) || err != nil && cur != nil {
		_ = r.Reload() // logged and counted; the old table stays
	}
}

// settle is how long Run waits after an event at now, in a burst whose
// first event came at first: the debounce time, but not past ten debounce
// times after first.
func (f *files) settle(first, now time.Time) time.Duration {
	wait := f.debounce
	if deadline := first.Add(10 * f.debounce); now.Add(wait).After(deadline) {
		wait = max(deadline.Sub(now), 0)
	}
	return wait
}

// watchSet is the directories a files source's Run watches.
type watchSet struct {
	w       *fsnotify.Watcher
	src     *files
	log     *slog.Logger
	watched map[string]string // watched name -> the directory it resolved to
}

// follow makes the watch match src.watchDirs(): it drops the directories
// no longer wanted or that now resolve elsewhere, and adds the new ones.
// It returns the first error adding one.
func (s *watchSet) follow() error {
	want := s.src.watchDirs()
	for name, real := range s.watched {
		if want[name] != real {
			_ = s.w.Remove(name) // fails when the directory is gone, which ends the watch anyway
			delete(s.watched, name)
		}
	}
	var first error
	for name, real := range want {
		if _, ok := s.watched[name]; ok {
			continue
		}
		if err := s.w.Add(name); err != nil {
			if first == nil {
				first = fmt.Errorf("config: watch %s: %w", name, err)
			}
			continue
		}
		s.watched[name] = real
		s.log.Debug("config watch", "dir", name, "resolved", real)
	}
	return first
}

// gone forgets a watched directory that ev removed or renamed: its watch
// is gone; follow adds it again if it comes back.
func (s *watchSet) gone(ev fsnotify.Event) {
	if _, self := s.watched[ev.Name]; self && ev.Has(fsnotify.Remove|fsnotify.Rename) {
		delete(s.watched, ev.Name)
	}
}

// watchDirs returns the directories Run watches, each with what it
// resolves to: the config directory (a file's directory, or the parent of
// a path that does not exist yet) and the directory of every symbolic link
// on the way to it.
func (f *files) watchDirs() map[string]string {
	dir := f.path
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		dir = filepath.Dir(dir)
	}
	dirs := map[string]string{}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		real = dir
	}
	dirs[dir] = real
	for p := dir; ; p = filepath.Dir(p) {
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			parent := filepath.Dir(p)
			if real, err := filepath.EvalSymlinks(parent); err == nil {
				dirs[parent] = real
			}
		}
		if filepath.Dir(p) == p {
			return dirs
		}
	}
}
