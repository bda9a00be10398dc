package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	// time_zone names resolve the same on every host, the image (FROM
	// scratch, no /usr/share/zoneinfo) included; a host's zoneinfo (or
	// $ZONEINFO) is still read first where there is one.
	_ "time/tzdata"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/store"
)

// Limits that keep a hostile file (deep nesting, YAML alias bombs) from
// exhausting the stack or the CPU.
const (
	maxDepth     = 64
	maxExpansion = 1 << 16 // descriptors and merged mappings beyond the file's own nodes, from aliases
	maxErrors    = 1000    // per Load
)

// Load reads and compiles the limits files at path: a file, or every
// *.yaml and *.yml file directly inside a directory. Dotfiles (Kubernetes'
// ..data) and subdirectories are not read; symbolic links are followed. A
// directory without limits files is an error wrapping ErrEmpty. A config
// that does not validate returns Errors listing every problem of every
// file.
func Load(path string, opts Options) (*Table, error) {
	files, err := listFiles(path)
	if err != nil {
		return nil, err
	}
	srcs := make([]source, 0, len(files))
	var readErrs []Error
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			readErrs = append(readErrs, Error{File: name, Msg: err.Error()})
			continue
		}
		srcs = append(srcs, source{name: name, id: filepath.Base(name), data: data})
	}
	return compile(srcs, opts, readErrs)
}

// source is one limits document: a file, or a resource pushed over xDS.
type source struct {
	name string     // the document in errors: a file's path, `resource "NAME"`
	id   string     // the document in the hash: a file's base name, a resource's name
	data []byte     // the content, hashed; a file's is parsed
	root *yaml.Node // the content as YAML nodes when it is not a file (xDS)
}

// compile builds a Table from documents; errs holds problems found before
// parsing (unreadable files).
func compile(srcs []source, opts Options, errs []Error) (*Table, error) {
	l := &loader{opts: opts, max: opts.maxValueBytes(), domains: map[string]*domain{}, errs: errs}
	h := sha256.New()
	for _, src := range srcs {
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(src.id))))
		h.Write([]byte(src.id))
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(src.data))))
		h.Write(src.data)
		if src.root != nil {
			l.budget = countNodes(src.root)
			l.doc(src.name, src.root)
		} else {
			l.file(src.name, src.data)
		}
	}
	l.checkReplaces()
	if len(l.errs) > 0 {
		slices.SortStableFunc(l.errs, func(a, b Error) int {
			if c := strings.Compare(a.File, b.File); c != 0 {
				return c
			}
			return a.Line - b.Line
		})
		return nil, &Errors{List: l.errs}
	}
	t := &Table{domains: l.domains, max: l.max, hash: hex.EncodeToString(h.Sum(nil)), files: len(srcs)}
	for name := range l.domains {
		t.names = append(t.names, name)
	}
	slices.Sort(t.names)
	for _, name := range t.names {
		t.rules = append(t.rules, l.domains[name].rules...)
	}
	return t, nil
}

// listFiles returns the files Load reads at path, sorted.
func listFiles(path string) ([]string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if !fi.IsDir() {
		return []string{path}, nil
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	var files []string
	for _, e := range ents {
		name := e.Name()
		if ext := filepath.Ext(name); strings.HasPrefix(name, ".") || ext != ".yaml" && ext != ".yml" {
			continue
		}
		p := filepath.Join(path, name)
		st, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // a dangling symlink, e.g. in the middle of a ConfigMap swap
		}
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		if st.Mode().IsRegular() {
			files = append(files, p)
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("config: %s: %w", path, ErrEmpty)
	}
	return files, nil
}

type loader struct {
	opts      Options
	max       int
	errs      []Error
	domains   map[string]*domain
	budget    int // descriptors left for the current file
	zones     map[string]*time.Location
	calendars map[calendarKey]*store.Calendar
}

func (l *loader) errorf(file string, line int, path, format string, args ...any) {
	switch {
	case len(l.errs) < maxErrors:
		l.errs = append(l.errs, Error{File: file, Line: line, Path: path, Msg: fmt.Sprintf(format, args...)})
	case len(l.errs) == maxErrors:
		l.errs = append(l.errs, Error{File: file, Line: line, Path: path, Msg: fmt.Sprintf("more than %d errors; the rest are not shown", maxErrors)})
	}
}

// file parses one limits file into its domain.
func (l *loader) file(name string, data []byte) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if err == io.EOF {
			l.errorf(name, 0, "", "file is empty; want a domain and descriptors")
		} else {
			l.syntaxError(name, err)
		}
		return
	}
	// Without aliases no file visits more descriptors than it has nodes;
	// aliases may add a bounded number.
	l.budget = countNodes(&doc) + maxExpansion
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case err == io.EOF:
	case err != nil:
		l.syntaxError(name, err)
		return
	case len(extra.Content) > 0 && extra.Content[0].ShortTag() != "!!null":
		l.errorf(name, extra.Line, "", "a second YAML document; put each domain in its own file")
		return
	}
	if len(doc.Content) == 0 {
		l.errorf(name, 0, "", "file is empty; want a domain and descriptors")
		return
	}
	l.doc(name, resolve(doc.Content[0]))
}

// doc compiles one document's top level into its domain.
func (l *loader) doc(name string, root *yaml.Node) {
	if root.Kind != yaml.MappingNode {
		l.errorf(name, root.Line, "", "want a mapping with domain and descriptors, got %s", describe(root))
		return
	}
	fields := l.fields(name, "", "", root, 0, "domain", "descriptors")
	df, ok := fields["domain"]
	if !ok {
		l.errorf(name, root.Line, "", "missing domain")
		return
	}
	dname, ok := l.str(name, "", "domain", df)
	if !ok {
		return
	}
	if dname == "" {
		l.errorf(name, df.val.Line, "", "domain is empty")
		return
	}
	d := l.domains[dname]
	switch {
	case d == nil:
		d = &domain{part: escapePart(dname, l.max), root: &level{keys: map[string]*keyNodes{}}, file: name, line: df.val.Line}
		l.domains[dname] = d
	case !l.opts.MergeDomains:
		l.errorf(name, df.val.Line, "", "domain %q is also defined at %s (merge them with --merge-domains)", dname, at(d.file, d.line))
		// Still validate the descriptors, into a domain of their own.
		d = &domain{root: &level{keys: map[string]*keyNodes{}}}
	}
	if f, ok := fields["descriptors"]; ok {
		l.descriptors(name, dname, d, d.root, f.val, "", "", 1)
	}
}

// syntaxError reports a YAML parse error at the line yaml names, if any.
func (l *loader) syntaxError(file string, err error) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, after, ok := strings.Cut(rest, ": "); ok {
			if n, err := strconv.Atoi(num); err == nil {
				line, msg = n, after
			}
		}
	}
	l.errorf(file, line, "", "invalid YAML: %s", msg)
}

// descriptors compiles the descriptor list n into lv. path is the list's
// owner in error messages, stat its stats-key path.
func (l *loader) descriptors(file, dname string, d *domain, lv *level, n *yaml.Node, path, stat string, depth int) {
	n = resolve(n)
	if isNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		l.errorf(file, n.Line, path, "descriptors: want a list, got %s", describe(n))
		return
	}
	if depth > maxDepth {
		l.errorf(file, n.Line, path, "descriptors nested deeper than %d levels", maxDepth)
		return
	}
	for i, item := range n.Content {
		if l.budget--; l.budget < 0 {
			if l.budget == -1 {
				l.errorf(file, item.Line, path, "YAML aliases expand to too many descriptors")
			}
			return
		}
		p := fmt.Sprintf("descriptors[%d]", i)
		if path != "" {
			p = path + "." + p
		}
		l.descriptor(file, dname, d, lv, resolve(item), p, stat, depth)
	}
}

var descriptorFields = []string{"key", "value", "rate_limit", "rate_limits", "descriptors", "shadow_mode",
	"detailed_metric", "value_to_metric", "share_threshold", "quota_mode", "metadata"}

func (l *loader) descriptor(file, dname string, d *domain, lv *level, n *yaml.Node, path, stat string, depth int) {
	if n.Kind != yaml.MappingNode {
		l.errorf(file, n.Line, path, "want a descriptor (a mapping with a key), got %s", describe(n))
		return
	}
	fields := l.fields(file, path, "", n, 0, descriptorFields...)
	var key, value string
	keyOK := false
	if f, ok := fields["key"]; !ok {
		l.errorf(file, n.Line, path, "descriptor has no key")
	} else if key, keyOK = l.str(file, path, "key", f); keyOK && key == "" {
		l.errorf(file, f.val.Line, path, "descriptor has an empty key")
		keyOK = false
	}
	valueOK := true
	if f, ok := fields["value"]; ok {
		value, valueOK = l.str(file, path, "value", f)
	}
	flag := func(name string) bool {
		f, ok := fields[name]
		if !ok {
			return false
		}
		b, _ := l.bool(file, path, name, f)
		return b
	}
	nd := &node{file: file, line: n.Line}
	seg := key
	if value != "" {
		seg += "_" + value
	}
	if stat != "" {
		seg = stat + "." + seg
	}
	wildcard := strings.Contains(value, "*")
	if flag("share_threshold") {
		if wildcard {
			nd.pattern = escapePart(value, l.max)
		} else {
			l.errorf(file, fields["share_threshold"].key.Line, path, "share_threshold needs a wildcard value (with '*'), got %s", quoteOrNone(value))
		}
	}
	if wildcard {
		nd.glob = compileGlob(value)
	}
	var metadata map[string]any
	if f, ok := fields["metadata"]; ok {
		metadata = l.metadata(file, path, f.val)
	}
	single, hasSingle := fields["rate_limit"]
	list, hasList := fields["rate_limits"]
	hasSingle = hasSingle && !isNull(resolve(single.val))
	hasList = hasList && !isNull(resolve(list.val))
	fl := flags{
		shadow:        flag("shadow_mode"),
		detailed:      flag("detailed_metric"),
		valueToMetric: flag("value_to_metric"),
		quota:         flag("quota_mode"),
		metadata:      metadata,
	}
	switch {
	case hasSingle && hasList:
		l.errorf(file, list.key.Line, path, "rate_limit and rate_limits are mutually exclusive (rate_limit is at line %d)", single.key.Line)
	case hasSingle:
		if r := l.rateLimit(file, dname, path, seg, n.Line, single, fl); r != nil {
			r.group = []*Rule{r}
			nd.rule = r
			d.rules = append(d.rules, r)
		}
	case hasList:
		if g := l.rateLimits(file, dname, path, seg, n.Line, list, fl); g != nil {
			nd.rule = g[0]
			d.rules = append(d.rules, g...)
		}
	}
	if f, ok := fields["descriptors"]; ok {
		nd.children = &level{keys: map[string]*keyNodes{}}
		l.descriptors(file, dname, d, nd.children, f.val, path, seg, depth+1)
		if len(nd.children.keys) == 0 {
			nd.children = nil
		}
	}
	if !keyOK || !valueOK {
		return
	}
	nd.part = "|" + escapePart(key, l.max) + "="
	kn := lv.keys[key]
	if kn == nil {
		kn = &keyNodes{exact: map[string]*node{}}
		lv.keys[key] = kn
	}
	prev := kn.def
	if value != "" {
		prev = kn.exact[value]
	}
	if prev != nil {
		if value == "" {
			l.errorf(file, n.Line, path, "duplicate descriptor: key %q without value is also defined at %s", key, at(prev.file, prev.line))
		} else {
			l.errorf(file, n.Line, path, "duplicate descriptor: key %q value %q is also defined at %s", key, value, at(prev.file, prev.line))
		}
		return
	}
	if value == "" {
		kn.def = nd
		return
	}
	kn.exact[value] = nd
	if wildcard {
		kn.wild = append(kn.wild, nd)
	}
}

// flags are what a descriptor gives each of its limits.
type flags struct {
	shadow, detailed, valueToMetric, quota bool
	metadata                               map[string]any
}

var rateLimitFields = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst", "unit_multiplier",
	"calendar", "time_zone"}

// listedLimitFields are the fields of one limit of a rate_limits list:
// a rate_limit's, and its own shadow_mode.
var listedLimitFields = append(slices.Clone(rateLimitFields), "shadow_mode")

// rateLimits compiles a descriptor's rate_limits list: several limits
// that every request matching the descriptor consumes from at once. Their
// stats paths are stat[i]; a limit whose counter key would equal an
// earlier one's gets "|k" appended for its k-th occurrence, so no two
// limits share a counter. nil if the list is invalid.
func (l *loader) rateLimits(file, dname, path, stat string, line int, f field, fl flags) []*Rule {
	n := resolve(f.val)
	if n.Kind != yaml.SequenceNode {
		l.errorf(file, n.Line, path, "rate_limits: want a list of rate_limit mappings, got %s", describe(n))
		return nil
	}
	if len(n.Content) == 0 {
		l.errorf(file, n.Line, path, "rate_limits is empty; give at least one limit, or leave it out")
		return nil
	}
	nerr := len(l.errs)
	var group []*Rule
	seen := map[string]int{}
	for i, item := range n.Content {
		p := fmt.Sprintf("%s.rate_limits[%d]", path, i)
		item = resolve(item)
		if isNull(item) {
			l.errorf(file, item.Line, p, "want a rate_limit mapping, got null")
			continue
		}
		r := l.rateLimitFrom(file, dname, p, fmt.Sprintf("%s[%d]", stat, i), line, item, fl, true)
		if r == nil {
			continue
		}
		r.Index = i
		seen[r.suffix]++
		if k := seen[r.suffix]; k > 1 {
			r.suffix += "|" + strconv.Itoa(k)
		}
		group = append(group, r)
	}
	if len(l.errs) > nerr {
		return nil
	}
	for _, r := range group {
		r.group = group
	}
	return group
}

// rateLimit compiles a rate_limit block; nil if it is null or invalid.
func (l *loader) rateLimit(file, dname, path, stat string, line int, f field, fl flags) *Rule {
	return l.rateLimitFrom(file, dname, path, stat, line, f.val, fl, false)
}

// rateLimitFrom compiles the rate_limit mapping n; nil if it is null or
// invalid. A listed limit (one of rate_limits) may set its own
// shadow_mode and may not be unlimited.
func (l *loader) rateLimitFrom(file, dname, path, stat string, line int, n *yaml.Node, fl flags, listed bool) *Rule {
	n = resolve(n)
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		l.errorf(file, n.Line, path, "rate_limit: want a mapping, got %s", describe(n))
		return nil
	}
	nerr := len(l.errs)
	allowed, where := rateLimitFields, " in rate_limit"
	if listed {
		allowed, where = listedLimitFields, ""
	}
	fields := l.fields(file, path, where, n, 0, allowed...)
	if f, ok := fields["shadow_mode"]; ok {
		fl.shadow, _ = l.bool(file, path, "shadow_mode", f)
	}
	r := &Rule{Domain: dname, Path: stat, File: file, Line: line, Algorithm: store.FixedWindow,
		ShadowMode: fl.shadow, DetailedMetric: fl.detailed, ValueToMetric: fl.valueToMetric, QuotaMode: fl.quota,
		Metadata: fl.metadata}
	if f, ok := fields["unlimited"]; ok {
		r.Unlimited, _ = l.bool(file, path, "unlimited", f)
		if r.Unlimited && listed {
			l.errorf(file, f.key.Line, path, "unlimited is not allowed in rate_limits; use rate_limit: {unlimited: true}")
			return nil
		}
	}
	if f, ok := fields["name"]; ok {
		r.Name, _ = l.str(file, path, "name", f)
	}
	unitField, hasUnit := fields["unit"]
	unit := ""
	if hasUnit {
		unit, hasUnit = l.str(file, path, "unit", unitField)
		hasUnit = hasUnit && unit != ""
	}
	switch {
	case r.Unlimited && hasUnit:
		l.errorf(file, unitField.key.Line, path, "an unlimited rate_limit takes no unit")
	case r.Unlimited:
	case !hasUnit:
		l.errorf(file, n.Line, path, "rate_limit has no unit")
	default:
		u, err := ParseUnit(unit)
		if err != nil {
			l.errorf(file, unitField.val.Line, path, "%v", err)
		}
		r.Unit = u
	}
	if f, ok := fields["requests_per_unit"]; ok {
		if v, ok := l.uint(file, path, "requests_per_unit", f); ok {
			if v > store.MaxLimit {
				l.errorf(file, f.val.Line, path, "requests_per_unit: %d exceeds %d (2^53)", v, uint64(store.MaxLimit))
			}
			r.RequestsPerUnit = v
		}
	}
	if f, ok := fields["algorithm"]; ok {
		a, _ := l.str(file, path, "algorithm", f)
		switch {
		case r.Unlimited:
			l.errorf(file, f.key.Line, path, "an unlimited rate_limit takes no algorithm")
		case a == "fixed_window":
		case a == "token_bucket":
			r.Algorithm = store.TokenBucket
		case a == "sliding_window":
			r.Algorithm = store.SlidingWindow
		default:
			l.errorf(file, f.val.Line, path, "unknown algorithm %q (want fixed_window, sliding_window or token_bucket)", a)
		}
	}
	r.UnitMultiplier = 1
	if f, ok := fields["unit_multiplier"]; ok {
		switch v, ok := l.uint(file, path, "unit_multiplier", f); {
		case !ok:
		case r.Unlimited:
			l.errorf(file, f.key.Line, path, "an unlimited rate_limit takes no unit_multiplier")
		case v == 0 || v > math.MaxUint32:
			l.errorf(file, f.val.Line, path, "unit_multiplier: %d is not between 1 and %d", v, uint64(math.MaxUint32))
		case uint64(r.Unit.Duration()/time.Second)*v > math.MaxUint32:
			l.errorf(file, f.val.Line, path, "unit_multiplier: %d %ss is too long (at most %d seconds)", v, r.Unit, uint64(math.MaxUint32))
		default:
			r.UnitMultiplier = uint32(v)
		}
	}
	r.Burst = r.RequestsPerUnit
	if f, ok := fields["burst"]; ok {
		switch v, ok := l.uint(file, path, "burst", f); {
		case !ok:
		case r.Algorithm != store.TokenBucket:
			l.errorf(file, f.key.Line, path, "burst needs algorithm: token_bucket")
		case v > store.MaxLimit:
			l.errorf(file, f.val.Line, path, "burst: %d exceeds %d (2^53)", v, uint64(store.MaxLimit))
		default:
			r.Burst = v
		}
	}
	l.calendarFields(file, path, r, fields)
	if f, ok := fields["replaces"]; ok {
		r.Replaces, r.replacesAt = l.replaces(file, path, r.Name, f.val)
		r.desc = path
	}
	if len(l.errs) > nerr {
		return nil
	}
	if !r.Unlimited {
		var err error
		period := r.Period()
		switch {
		case r.Calendar:
			r.Limit, err = l.calendarRule(r)
		case r.Algorithm == store.TokenBucket:
			r.Limit, err = store.NewTokenBucket(r.RequestsPerUnit, period, r.Burst)
		case r.Algorithm == store.SlidingWindow:
			r.Limit, err = store.NewSlidingWindow(r.RequestsPerUnit, period)
		default:
			r.Limit, err = store.NewFixedWindow(r.RequestsPerUnit, period)
		}
		if err != nil {
			l.errorf(file, n.Line, path, "rate_limit: %s", strings.TrimPrefix(err.Error(), "store: "))
			return nil
		}
	}
	r.suffix = keySuffix(r)
	return r
}

// calendarUnits are the units a calendar counts in.
var calendarUnits = map[Unit]store.CalendarUnit{Day: store.CalendarDay, Week: store.CalendarWeek,
	Month: store.CalendarMonth, Year: store.CalendarYear}

// calendarFields reads rate_limit.calendar and rate_limit.time_zone into
// r, after its unit, algorithm and unit_multiplier: a calendar counts days,
// weeks, months or years (months also in runs that divide a year), with a
// fixed or a sliding window.
func (l *loader) calendarFields(file, path string, r *Rule, fields map[string]field) {
	f, ok := fields["calendar"]
	want := false
	if ok {
		want, ok = l.bool(file, path, "calendar", f)
	}
	if ok && want {
		_, unitOK := calendarUnits[r.Unit]
		switch {
		case r.Unlimited:
			l.errorf(file, f.key.Line, path, "an unlimited rate_limit takes no calendar")
		case r.Algorithm == store.TokenBucket:
			l.errorf(file, f.key.Line, path, "calendar needs algorithm fixed_window or sliding_window (a token bucket refills continuously: it has no periods)")
		case r.Unit == UnitUnknown:
		case !unitOK:
			l.errorf(file, f.key.Line, path, "calendar periods are days, weeks, months or years, not %ss (those windows are aligned to the clock already)", r.Unit)
		case r.UnitMultiplier > 1 && (r.Unit != Month || 12%r.UnitMultiplier != 0):
			l.errorf(file, fields["unit_multiplier"].val.Line, path, "unit_multiplier: %d calendar %ss: only months run in multiples, of 2, 3, 4, 6 or 12 (aligned to January)", r.UnitMultiplier, r.Unit)
		default:
			r.Calendar, r.TimeZone = true, time.UTC
		}
	}
	f, ok = fields["time_zone"]
	if !ok {
		return
	}
	name, ok := l.str(file, path, "time_zone", f)
	switch {
	case !ok:
	case !want:
		l.errorf(file, f.key.Line, path, "time_zone needs calendar: true")
	case name == "":
		l.errorf(file, f.val.Line, path, "time_zone is empty; leave it out for UTC")
	case name == "Local":
		l.errorf(file, f.val.Line, path, "time_zone: \"Local\" is this host's zone; name the zone (such as Europe/Berlin) so that every replica counts the same periods")
	default:
		loc, err := l.location(name)
		if err != nil {
			l.errorf(file, f.val.Line, path, "unknown time_zone %q (want an IANA time zone name such as Europe/Berlin or UTC)", name)
		} else if r.Calendar {
			r.TimeZone = loc
		}
	}
}

// location loads a time zone once per Load.
func (l *loader) location(name string) (*time.Location, error) {
	if loc, ok := l.zones[name]; ok {
		return loc, nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, err
	}
	if l.zones == nil {
		l.zones = map[string]*time.Location{}
	}
	l.zones[name] = loc
	return loc, nil
}

// calendarRule compiles calendar rule r. Its calendar is one per unit,
// run of months and zone per Load, so that rules of one calendar share
// what it remembers of the current period.
func (l *loader) calendarRule(r *Rule) (*store.Rule, error) {
	k := calendarKey{calendarUnits[r.Unit], max(r.UnitMultiplier, 1), r.TimeZone}
	c, ok := l.calendars[k]
	if !ok {
		var err error
		if c, err = store.NewCalendar(k.unit, int(k.months), k.loc); err != nil {
			return nil, err
		}
		if l.calendars == nil {
			l.calendars = map[calendarKey]*store.Calendar{}
		}
		l.calendars[k] = c
	}
	if r.Algorithm == store.SlidingWindow {
		return store.NewCalendarSliding(r.RequestsPerUnit, c)
	}
	return store.NewCalendarWindow(r.RequestsPerUnit, c)
}

type calendarKey struct {
	unit   store.CalendarUnit
	months uint32
	loc    *time.Location
}

// replaces reads rate_limit.replaces: the names and their lines.
func (l *loader) replaces(file, path, self string, n *yaml.Node) (names []string, lines []int) {
	n = resolve(n)
	if isNull(n) {
		return nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		l.errorf(file, n.Line, path, "replaces: want a list of {name: ...}, got %s", describe(n))
		return nil, nil
	}
	for i, item := range n.Content {
		item = resolve(item)
		if item.Kind != yaml.MappingNode {
			l.errorf(file, item.Line, path, "replaces[%d]: want {name: ...}, got %s", i, describe(item))
			continue
		}
		fields := l.fields(file, path, fmt.Sprintf(" in replaces[%d]", i), item, 0, "name")
		name := ""
		if f, ok := fields["name"]; ok {
			name, _ = l.str(file, path, fmt.Sprintf("replaces[%d].name", i), f)
		}
		switch {
		case name == "":
			l.errorf(file, item.Line, path, "replaces[%d] has an empty name", i)
		case name == self:
			l.errorf(file, item.Line, path, "replaces[%d] names the rule itself (%q)", i, name)
		default:
			names = append(names, name)
			lines = append(lines, item.Line)
		}
	}
	return names, lines
}

// checkReplaces reports replaces that name no rule of their domain.
func (l *loader) checkReplaces() {
	for dname, d := range l.domains {
		named := map[string]bool{}
		for _, r := range d.rules {
			named[r.Name] = true
		}
		for _, r := range d.rules {
			for i, name := range r.Replaces {
				if !named[name] {
					l.errorf(r.File, r.replacesAt[i], r.desc, "replaces[%d] names %q, but no rule of domain %q has that name", i, name, dname)
				}
			}
		}
	}
}

// field is one key: value pair of a mapping.
type field struct{ key, val *yaml.Node }

// fields indexes mapping n's fields and reports unknown and repeated ones.
// YAML merge keys (<<: *anchor) are expanded; explicit fields win.
func (l *loader) fields(file, path, where string, n *yaml.Node, depth int, allowed ...string) map[string]field {
	m := map[string]field{}
	var merged []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), n.Content[i+1]
		if k.ShortTag() == "!!merge" {
			merged = append(merged, resolve(v))
			continue
		}
		if k.Kind != yaml.ScalarNode {
			l.errorf(file, k.Line, path, "field names must be strings, got %s%s", describe(k), where)
			continue
		}
		if !slices.Contains(allowed, k.Value) {
			l.errorf(file, k.Line, path, "unknown field %q%s", k.Value, where)
			continue
		}
		if prev, dup := m[k.Value]; dup {
			l.errorf(file, k.Line, path, "field %q given twice (first at line %d)", k.Value, prev.key.Line)
			continue
		}
		m[k.Value] = field{key: k, val: v}
	}
	if depth > maxDepth {
		return m
	}
	for _, v := range merged {
		var maps []*yaml.Node
		switch v.Kind {
		case yaml.MappingNode:
			maps = []*yaml.Node{v}
		case yaml.SequenceNode:
			for _, c := range v.Content {
				maps = append(maps, resolve(c))
			}
		}
		for _, mm := range maps {
			if l.budget--; l.budget < 0 {
				if l.budget == -1 {
					l.errorf(file, mm.Line, path, "YAML aliases expand to too many descriptors")
				}
				return m
			}
			if mm.Kind != yaml.MappingNode {
				l.errorf(file, mm.Line, path, "a merge key (<<) needs a mapping, got %s", describe(mm))
				continue
			}
			for name, f := range l.fields(file, path, where, mm, depth+1, allowed...) {
				if _, set := m[name]; !set {
					m[name] = f
				}
			}
		}
	}
	return m
}

// str reads a scalar as a string, as yaml.v2 does for string fields: any
// scalar's text, null as "".
func (l *loader) str(file, path, name string, f field) (string, bool) {
	v := resolve(f.val)
	if isNull(v) {
		return "", true
	}
	if v.Kind == yaml.ScalarNode {
		return v.Value, true
	}
	l.errorf(file, v.Line, path, "%s: want a string, got %s", name, describe(v))
	return "", false
}

// bool reads a YAML 1.1 boolean (true/false, yes/no, on/off, y/n), which
// is what envoyproxy/ratelimit's yaml.v2 accepts. Null is false.
func (l *loader) bool(file, path, name string, f field) (bool, bool) {
	v := resolve(f.val)
	if isNull(v) {
		return false, true
	}
	if v.Kind == yaml.ScalarNode && v.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 {
		switch v.Value {
		case "true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", "y", "Y":
			return true, true
		case "false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF", "n", "N":
			return false, true
		}
	}
	l.errorf(file, v.Line, path, "%s: want true or false, got %s", name, describe(v))
	return false, false
}

// uint reads a non-negative integer in YAML's forms (1000, 1_000, 0x3e8,
// 0o1750). Null is 0.
func (l *loader) uint(file, path, name string, f field) (uint64, bool) {
	v := resolve(f.val)
	if isNull(v) {
		return 0, true
	}
	if v.Kind == yaml.ScalarNode && v.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 {
		s := strings.TrimPrefix(strings.ReplaceAll(v.Value, "_", ""), "+")
		if s != "" && s[0] != '-' && s[0] != '+' {
			n, err := strconv.ParseUint(s, 0, 64)
			if err == nil {
				return n, true
			}
			if errors.Is(err, strconv.ErrRange) {
				l.errorf(file, v.Line, path, "%s: %s is out of range", name, v.Value)
				return 0, false
			}
		}
	}
	l.errorf(file, v.Line, path, "%s: want a non-negative integer, got %s", name, describe(v))
	return 0, false
}

// countNodes counts the nodes of a parsed file, not following aliases.
func countNodes(n *yaml.Node) int {
	c := 1
	for _, child := range n.Content {
		c += countNodes(child)
	}
	return c
}

// resolve follows aliases to the node they name.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < maxDepth; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" || n.Kind == 0
}

// describe names a node's kind for error messages, quoting scalars.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if isNull(n) {
			return "null"
		}
		if n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0 {
			return "the quoted string " + strconv.Quote(n.Value)
		}
		return strconv.Quote(n.Value)
	case yaml.AliasNode:
		return "an unresolved alias"
	}
	return "nothing"
}

// at locates a definition: file:line, or the file (an xDS resource) when
// there is no line.
func at(file string, line int) string {
	if line <= 0 {
		return file
	}
	return file + ":" + strconv.Itoa(line)
}

func quoteOrNone(s string) string {
	if s == "" {
		return "no value"
	}
	return strconv.Quote(s)
}

// metadata reads a descriptor's metadata: a mapping of anything, as
// envoyproxy/ratelimit's yaml.v2 reads it into a google.protobuf.Struct.
// Values become JSON-like Go values: map[string]any, []any, string,
// float64 (every number), bool and nil. Unquoted yes/no/on/off are
// booleans and timestamps stay strings, as in yaml.v2. Infinite and NaN
// numbers, which JSON cannot carry, stay strings as written. nil when the
// metadata is null or invalid.
func (l *loader) metadata(file, path string, n *yaml.Node) map[string]any {
	n = resolve(n)
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		l.errorf(file, n.Line, path, "metadata: want a mapping, got %s", describe(n))
		return nil
	}
	nerr := len(l.errs)
	v := l.metaValue(file, path, n, 0)
	if len(l.errs) > nerr {
		return nil
	}
	m, _ := v.(map[string]any)
	if len(m) == 0 {
		return nil
	}
	return m
}

func (l *loader) metaValue(file, path string, n *yaml.Node, depth int) any {
	n = resolve(n)
	if l.budget--; l.budget < 0 {
		if l.budget == -1 {
			l.errorf(file, n.Line, path, "metadata: YAML aliases expand to too many values")
		}
		return nil
	}
	if depth > maxDepth {
		l.errorf(file, n.Line, path, "metadata nested deeper than %d levels", maxDepth)
		return nil
	}
	switch n.Kind {
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		var merged []*yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := resolve(n.Content[i]), n.Content[i+1]
			if k.ShortTag() == "!!merge" {
				merged = append(merged, resolve(v))
				continue
			}
			if k.Kind != yaml.ScalarNode {
				l.errorf(file, k.Line, path, "metadata: keys must be strings, got %s", describe(k))
				continue
			}
			m[k.Value] = l.metaValue(file, path, v, depth+1)
		}
		// Merge keys (<<: *anchor), as yaml.v2 expands them: explicit
		// keys win, then earlier merged mappings.
		for _, v := range merged {
			maps := []*yaml.Node{v}
			if v.Kind == yaml.SequenceNode {
				maps = v.Content
			}
			for _, mm := range maps {
				mv, ok := l.metaValue(file, path, mm, depth+1).(map[string]any)
				if !ok {
					l.errorf(file, mm.Line, path, "metadata: a merge key (<<) needs a mapping, got %s", describe(resolve(mm)))
					continue
				}
				for k, v := range mv {
					if _, set := m[k]; !set {
						m[k] = v
					}
				}
			}
		}
		return m
	case yaml.SequenceNode:
		s := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			s = append(s, l.metaValue(file, path, c, depth+1))
		}
		return s
	case yaml.ScalarNode:
		return metaScalar(n)
	}
	return nil
}

// metaScalar converts a scalar as yaml.v2 decodes it into an interface{}
// and structpb.NewValue then converts it.
func metaScalar(n *yaml.Node) any {
	if n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
		return n.Value
	}
	switch n.ShortTag() {
	case "!!null":
		return nil
	case "!!int":
		if i, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64); err == nil {
			return float64(i)
		}
		if u, err := strconv.ParseUint(strings.ReplaceAll(n.Value, "_", ""), 0, 64); err == nil {
			return float64(u)
		}
	case "!!float":
		if f, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
			return f
		}
	case "!!bool":
		return n.Value == "true" || n.Value == "True" || n.Value == "TRUE"
	}
	switch n.Value {
	case "yes", "Yes", "YES", "on", "On", "ON", "y", "Y":
		return true
	case "no", "No", "NO", "off", "Off", "OFF", "n", "N":
		return false
	}
	return n.Value
}
