package config

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/store"
)

// An Overlay adds Sluice's own fields to limits that come from elsewhere:
// those an xDS server pushes, whose proto has no field for an algorithm, a
// burst, a unit multiplier, a calendar, several limits per descriptor or a
// budget past 2^32 (docs/CONFIG.md, "Overlay for pushed limits").
//
// Its files have the limits format (a domain and a tree of descriptors),
// but a descriptor's rate_limit holds only algorithm, burst,
// unit_multiplier, calendar, time_zone and a requests_per_unit above
// 2^32, and its rate_limits only limits added to the pushed one. Domains,
// keys and values may hold '*', which matches any run of characters
// (none included); a descriptor without value matches only a pushed
// descriptor without value.
//
// An overlay is one more input of the compile (Options.Overlay): each
// pushed rate_limit takes the fields of the most specific entry at its
// domain and descriptor path, and the result is compiled and validated
// as if the file had said so. The pushed config stays the source of
// truth for which rules exist: an entry that matches no rule, or that
// cannot apply to one, is reported in Table.Overlay, never an error.
// An Overlay is immutable.
type Overlay struct {
	entries []*overlayEntry
	files   int
	hash    string
}

// overlayEntry is one overlay descriptor that sets fields.
type overlayEntry struct {
	file string
	line int
	// domain and steps are the patterns a pushed descriptor's domain and
	// its (key, value) path from the domain down must match.
	domain pattern
	steps  []overlayStep
	limit  *yaml.Node // rate_limit's fields; nil if it sets none
	limits *yaml.Node // rate_limits: the limits added; nil if none
	fields []string   // what the entry sets, for the status page
	// literal counts the characters of the patterns that are not '*':
	// of two entries that match, the one with more wins.
	literal int
}

type overlayStep struct{ key, value pattern }

// pattern is a domain, key or value of an overlay: literal, or with '*'.
type pattern struct {
	raw  string
	wild bool
	g    glob
}

func newPattern(s string) pattern {
	p := pattern{raw: s, wild: strings.Contains(s, "*")}
	if p.wild {
		p.g = compileGlob(s)
	}
	return p
}

func (p *pattern) match(s string) bool {
	if !p.wild {
		return p.raw == s
	}
	return p.g.match(s)
}

func (p *pattern) literal() int {
	if !p.wild {
		return len(p.raw)
	}
	return p.g.min
}

// String spells the entry's match: domain, then key=value per level.
func (e *overlayEntry) String() string {
	var b strings.Builder
	b.WriteString(e.domain.raw)
	for _, s := range e.steps {
		b.WriteString(" | ")
		b.WriteString(s.key.raw)
		if s.value.raw != "" {
			b.WriteString("=" + s.value.raw)
		}
	}
	return b.String()
}

// Overlaid says how an overlay changed a rule.
type Overlaid struct {
	// File and Line locate the overlay's descriptor.
	File string
	Line int
	// Fields lists what it set: "algorithm: token_bucket", "burst: 3",
	// "rate_limits: +1".
	Fields []string
}

// OverlayMiss is an overlay entry that changed no rule, or could not
// change one.
type OverlayMiss struct {
	File  string
	Line  int
	Match string // the entry's domain and descriptor path: "eg | rule-*"
	// Rule is the rule the entry could not apply to ("domain.path"); ""
	// for an entry that matches no rule.
	Rule   string
	Reason string
}

// String is the miss as a log or `sluice check` line.
func (m OverlayMiss) String() string {
	if m.Rule == "" {
		return fmt.Sprintf("%s: %s: %s", at(m.File, m.Line), m.Match, m.Reason)
	}
	return fmt.Sprintf("%s: %s: not applied to %s: %s", at(m.File, m.Line), m.Match, m.Rule, m.Reason)
}

// OverlayReport is what an overlay did to a table.
type OverlayReport struct {
	// Files and Entries count the overlay's files and the entries
	// (descriptors that set fields) in them; 0 without an overlay.
	Files, Entries int
	// Unmatched lists the entries that changed no rule, in file order.
	Unmatched []OverlayMiss
	// Problems lists entries that match a rule but cannot apply to it
	// (the first such rule of each): the rule keeps its pushed limit.
	Problems []OverlayMiss
}

// Overlay reports what the table's overlay did; the zero report without
// one.
func (t *Table) Overlay() OverlayReport { return t.overlay }

// Hash is a SHA-256 (hex) of the overlay's files' names and contents.
func (o *Overlay) Hash() string { return o.hash }

// Entries counts the overlay's entries.
func (o *Overlay) Entries() int { return len(o.entries) }

// LoadOverlay reads an overlay at path: a file, or every *.yaml and *.yml
// file directly inside a directory, as Load reads limits files; a
// directory without any is an overlay without entries. Every problem is
// reported with its file and line.
func LoadOverlay(path string) (*Overlay, error) {
	files, err := listFiles(path)
	if errors.Is(err, ErrEmpty) {
		return compileOverlay(nil, nil)
	}
	if err != nil {
		return nil, err
	}
	srcs, readErrs := readFiles(files)
	return compileOverlay(srcs, readErrs)
}

// ParseOverlay compiles one overlay file's content, named name in errors.
func ParseOverlay(name string, data []byte) (*Overlay, error) {
	return compileOverlay([]source{{name: name, id: name, data: data}}, nil)
}

func compileOverlay(srcs []source, errs []Error) (*Overlay, error) {
	l := &loader{max: DefaultMaxValueBytes, domains: map[string]*domain{}, errs: errs}
	o := &Overlay{files: len(srcs)}
	seen := map[string]*overlayEntry{}
	h := sha256.New()
	for _, src := range srcs {
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(src.id))))
		h.Write([]byte(src.id))
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(src.data))))
		h.Write(src.data)
		if root := l.parse(src.name, src.data); root != nil {
			l.overlayDoc(o, seen, src.name, root)
		}
	}
	if len(l.errs) > 0 {
		sortErrors(l.errs)
		return nil, &Errors{List: l.errs}
	}
	o.hash = hex.EncodeToString(h.Sum(nil))
	return o, nil
}

// overlayDoc reads one overlay document: a domain pattern and its
// descriptors.
func (l *loader) overlayDoc(o *Overlay, seen map[string]*overlayEntry, name string, root *yaml.Node) {
	fields, dname, ok := l.topLevel(name, root)
	if !ok {
		return
	}
	w := &overlayWalk{o: o, seen: seen, file: name, domain: newPattern(dname)}
	if f, ok := fields["descriptors"]; ok {
		l.overlayDescriptors(w, f.val, "", 1)
	}
}

// overlayWalk is the state of one overlay document's walk.
type overlayWalk struct {
	o      *Overlay
	seen   map[string]*overlayEntry // by the entry's match, to refuse duplicates
	file   string
	domain pattern
	steps  []overlayStep
}

func (l *loader) overlayDescriptors(w *overlayWalk, n *yaml.Node, path string, depth int) {
	n = resolve(n)
	if isNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		l.errorf(w.file, n.Line, path, "descriptors: want a list, got %s", describe(n))
		return
	}
	if depth > maxDepth {
		l.errorf(w.file, n.Line, path, "descriptors nested deeper than %d levels", maxDepth)
		return
	}
	for i, item := range n.Content {
		if l.budget--; l.budget < 0 {
			if l.budget == -1 {
				l.errorf(w.file, item.Line, path, "YAML aliases expand to too many descriptors")
			}
			return
		}
		p := fmt.Sprintf("descriptors[%d]", i)
		if path != "" {
			p = path + "." + p
		}
		l.overlayDescriptor(w, resolve(item), p, depth)
	}
}

// overlayOwned are the fields of a descriptor or rate_limit that the
// pushed config owns: an overlay may not set them.
var overlayOwned = map[string]string{
	"shadow_mode":     "the pushed config sets it",
	"detailed_metric": "the pushed config sets it",
	"value_to_metric": "the pushed config's descriptors name their metrics",
	"share_threshold": "it changes how the pushed descriptor matches",
	"quota_mode":      "the pushed config sets it",
	"metadata":        "the pushed config sets it",
	"unit":            "the pushed rule's unit stays; change it in the policy",
	"unlimited":       "the pushed config says which rules are unlimited",
	"name":            "rule names belong to the pushed config",
	"replaces":        "rule names belong to the pushed config",
}

// owned reports the fields of fields that an overlay may not set.
func (l *loader) owned(file, path string, fields map[string]field, where string) {
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if why := overlayOwned[name]; why != "" {
			l.errorf(file, fields[name].key.Line, path, "%s%s cannot be set in an overlay: %s", name, where, why)
		}
	}
}

func (l *loader) overlayDescriptor(w *overlayWalk, n *yaml.Node, path string, depth int) {
	if n.Kind != yaml.MappingNode {
		l.errorf(w.file, n.Line, path, "want a descriptor (a mapping with a key), got %s", describe(n))
		return
	}
	fields := l.fields(w.file, path, "", n, 0, descriptorFields...)
	l.owned(w.file, path, fields, "")
	key, value, valid := l.keyValue(w.file, path, n, fields)
	w.steps = append(w.steps, overlayStep{key: newPattern(key), value: newPattern(value)})
	defer func() { w.steps = w.steps[:len(w.steps)-1] }()
	e := &overlayEntry{file: w.file, line: n.Line, domain: w.domain, steps: slices.Clone(w.steps)}
	if f, ok := fields["rate_limit"]; ok {
		e.limit = l.overlayLimit(w.file, path, f)
	}
	if f, ok := fields["rate_limits"]; ok {
		e.limits = l.overlayLimits(w.file, path, n.Line, f)
		if e.limits != nil {
			e.fields = append(e.fields, fmt.Sprintf("rate_limits: +%d", len(e.limits.Content)))
		}
	}
	_, hasChildren := fields["descriptors"]
	_, hasLimit := fields["rate_limit"]
	_, hasLimits := fields["rate_limits"]
	if !hasLimit && !hasLimits && !hasChildren {
		l.errorf(w.file, n.Line, path, "an overlay descriptor sets nothing: give it a rate_limit (algorithm, burst, ...), rate_limits or nested descriptors")
	}
	if e.limit != nil {
		e.fields = append(limitFields(e.limit), e.fields...)
	}
	if valid && (e.limit != nil || e.limits != nil) {
		e.literal = e.domain.literal()
		for _, s := range e.steps {
			e.literal += s.key.literal() + s.value.literal()
		}
		m := e.String()
		if prev := w.seen[m]; prev != nil {
			l.errorf(w.file, n.Line, path, "duplicate overlay entry: %s is also at %s", m, at(prev.file, prev.line))
		} else {
			w.seen[m] = e
			w.o.entries = append(w.o.entries, e)
		}
	}
	if f, ok := fields["descriptors"]; ok {
		l.overlayDescriptors(w, f.val, path, depth+1)
	}
}

// limitFields spells the fields of an overlay's rate_limit, in its order.
func limitFields(n *yaml.Node) []string {
	var out []string
	for i := 0; i+1 < len(n.Content); i += 2 {
		out = append(out, n.Content[i].Value+": "+resolve(n.Content[i+1]).Value)
	}
	return out
}

// overlayLimit checks an overlay's rate_limit: only Sluice's own fields,
// each valid on its own (whether they suit the pushed rule is decided
// when they are applied). It returns the fields as a mapping of their
// own, nil if there are none or a problem.
func (l *loader) overlayLimit(file, path string, f field) *yaml.Node {
	n := l.mapping(file, path, "rate_limit", f.val)
	if n == nil {
		return nil
	}
	nerr := len(l.errs)
	fields := l.fields(file, path, " in rate_limit", n, 0, rateLimitFields...)
	l.owned(file, path, fields, " in rate_limit")
	probe := &Rule{Unit: Second}
	l.algorithm(file, path, probe, fields)
	if rf, ok := fields["requests_per_unit"]; ok {
		if v, ok := l.uint(file, path, "requests_per_unit", rf); ok && (v <= math.MaxUint32 || v > store.MaxLimit) {
			l.errorf(file, rf.val.Line, path, "requests_per_unit: an overlay sets only budgets above 2^32 (4294967295, the most the pushed proto holds) up to 2^53; change %d in the policy", v)
		}
	}
	if uf, ok := fields["unit_multiplier"]; ok {
		if v, ok := l.uint(file, path, "unit_multiplier", uf); ok && (v == 0 || v > math.MaxUint32) {
			l.errorf(file, uf.val.Line, path, "unit_multiplier: %d is not between 1 and %d", v, uint64(math.MaxUint32))
		}
	}
	if bf, ok := fields["burst"]; ok {
		if v, ok := l.uint(file, path, "burst", bf); ok && v > store.MaxLimit {
			l.errorf(file, bf.val.Line, path, "burst: %d exceeds %d (2^53)", v, uint64(store.MaxLimit))
		}
	}
	if cf, ok := fields["calendar"]; ok {
		l.bool(file, path, "calendar", cf)
	}
	if tf, ok := fields["time_zone"]; ok {
		if name, ok := l.str(file, path, "time_zone", tf); ok {
			if _, err := l.location(name); err != nil || name == "" || name == "Local" {
				l.errorf(file, tf.val.Line, path, "unknown time_zone %q (want an IANA time zone name such as Europe/Berlin or UTC)", name)
			}
		}
	}
	if len(l.errs) > nerr || len(fields) == 0 {
		return nil
	}
	m := mapping()
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := resolve(n.Content[i]); k.ShortTag() != "!!merge" {
			m.Content = append(m.Content, k, n.Content[i+1])
		}
	}
	return m
}

// overlayLimits checks an overlay's rate_limits: whole limits (a unit and
// requests_per_unit, and any of Sluice's fields) that every request of
// the pushed rule consumes from as well. Each is compiled as a limits
// file's would be.
func (l *loader) overlayLimits(file, path string, line int, f field) *yaml.Node {
	n := resolve(f.val)
	if n.Kind != yaml.SequenceNode || len(n.Content) == 0 {
		l.errorf(file, n.Line, path, "rate_limits: want a list of one or more rate_limit mappings, got %s", describe(n))
		return nil
	}
	nerr := len(l.errs)
	for i, item := range n.Content {
		p := fmt.Sprintf("%s.rate_limits[%d]", path, i)
		item = resolve(item)
		if item.Kind == yaml.MappingNode {
			before := len(l.errs)
			fields := l.fields(file, p, "", item, 0, listedLimitFields...)
			for _, name := range []string{"unlimited", "name", "replaces", "shadow_mode"} {
				if lf, ok := fields[name]; ok {
					l.errorf(file, lf.key.Line, p, "%s cannot be set in an overlay's rate_limits: %s", name, overlayOwned[name])
				}
			}
			if len(l.errs) > before {
				continue // reported; compiling it would report its fields again
			}
		}
		l.rateLimitFrom(file, "", p, "", line, item, flags{}, true)
	}
	if len(l.errs) > nerr {
		return nil
	}
	return n
}

// match returns the entry for the pushed descriptor at trail in domain:
// the matching entry with the most literal characters, the first in file
// order of those; -1 if none matches. matched, if not nil, is set for
// every entry that matches.
func (o *Overlay) match(domain string, trail []Entry, matched []bool) int {
	best := -1
	for i, e := range o.entries {
		if len(e.steps) != len(trail) || !e.domain.match(domain) {
			continue
		}
		ok := true
		for j, s := range e.steps {
			if !s.key.match(trail[j].Key) || !s.value.match(trail[j].Value) {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		if matched != nil {
			matched[i] = true
		}
		if best < 0 || e.literal > o.entries[best].literal {
			best = i
		}
	}
	return best
}

// overlayState is what one compile's overlay did.
type overlayState struct {
	o        *Overlay
	matched  []bool         // the entry matches a rule (whether or not it applies)
	applied  []bool         // the entry changed a rule
	problems []*OverlayMiss // the first of each entry
}

// overlaid compiles the pushed rate_limit single of the descriptor at
// l.trail with the fields of the overlay's entry for it, if any. It
// returns the descriptor's limits, or nil when no entry matches or the
// entry cannot apply (its problems recorded, not reported as errors):
// the caller then compiles the pushed rate_limit alone.
func (l *loader) overlaid(file, dname, path, stat string, line int, single field, fl flags) []*Rule {
	ov := l.ov
	i := ov.o.match(dname, l.trail, ov.matched)
	if i < 0 {
		return nil
	}
	e := ov.o.entries[i]
	base := resolve(single.val)
	if base.Kind != yaml.MappingNode {
		return nil // not a rate_limit: the caller reports it
	}
	merged := mergeLimit(base, e.limit)
	nerr := len(l.errs)
	var g []*Rule
	if e.limits == nil {
		if r := l.rateLimitFrom(file, dname, path, stat, line, merged, fl, false); r != nil {
			r.group = []*Rule{r}
			g = r.group
		}
	} else {
		seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Content: append([]*yaml.Node{merged}, e.limits.Content...)}
		g = l.rateLimits(file, dname, path, stat, line, field{key: single.key, val: seq}, fl)
	}
	if len(l.errs) > nerr || g == nil {
		if ov.problems[i] == nil {
			msgs := make([]string, 0, len(l.errs)-nerr)
			for _, err := range l.errs[nerr:] {
				msgs = append(msgs, err.Msg)
			}
			ov.problems[i] = &OverlayMiss{File: e.file, Line: e.line, Match: e.String(), Rule: dname + "." + stat,
				Reason: strings.Join(msgs, "; ")}
		}
		l.errs = l.errs[:nerr]
		return nil
	}
	ov.applied[i] = true
	origin := &Overlaid{File: e.file, Line: e.line, Fields: e.fields}
	for _, r := range g {
		r.Overlay = origin
	}
	return g
}

// mergeLimit is the pushed rate_limit base with the overlay's fields:
// base's fields the overlay does not set, then the overlay's.
func mergeLimit(base, over *yaml.Node) *yaml.Node {
	if over == nil {
		return base
	}
	set := map[string]bool{}
	for i := 0; i+1 < len(over.Content); i += 2 {
		set[over.Content[i].Value] = true
	}
	m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: base.Line}
	for i := 0; i+1 < len(base.Content); i += 2 {
		if k := resolve(base.Content[i]); !set[k.Value] {
			m.Content = append(m.Content, base.Content[i], base.Content[i+1])
		}
	}
	m.Content = append(m.Content, over.Content...)
	return m
}

// report is what the overlay did, for the table.
func (ov *overlayState) report() OverlayReport {
	r := OverlayReport{Files: ov.o.files, Entries: len(ov.o.entries)}
	for i, e := range ov.o.entries {
		if p := ov.problems[i]; p != nil {
			r.Problems = append(r.Problems, *p)
		}
		if !ov.applied[i] {
			reason := "matches no rate_limit of the pushed config"
			switch {
			case ov.problems[i] != nil:
				reason = "cannot apply to any rule it matches (see its problem)"
			case ov.matched[i]:
				reason = "every rule it matches takes a more specific entry"
			}
			r.Unmatched = append(r.Unmatched, OverlayMiss{File: e.file, Line: e.line, Match: e.String(), Reason: reason})
		}
	}
	return r
}
