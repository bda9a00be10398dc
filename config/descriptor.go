package config

import (
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

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

// descriptor compiles descriptor n into lv, its limits into d's rules and
// its nested descriptors below it. path is the descriptor in error
// messages, stat its owner's stats-key path. A descriptor whose key or
// value is invalid is still checked through, but takes no place in lv.
func (l *loader) descriptor(file, dname string, d *domain, lv *level, n *yaml.Node, path, stat string, depth int) {
	if n.Kind != yaml.MappingNode {
		l.errorf(file, n.Line, path, "want a descriptor (a mapping with a key), got %s", describe(n))
		return
	}
	fields := l.fields(file, path, "", n, 0, descriptorFields...)
	key, value, valid := l.keyValue(file, path, n, fields)
	seg := statPath(stat, key, value)
	nd := &node{file: file, line: n.Line}
	l.wildcard(file, path, nd, value, fields)
	d.shares = d.shares || nd.share != ""
	fl := l.descriptorFlags(file, path, fields)
	l.trail = append(l.trail, Entry{Key: key, Value: value})
	l.limits(file, dname, d, nd, path, seg, fields, fl)
	if f, ok := fields["descriptors"]; ok {
		nd.children = &level{keys: map[string]*keyNodes{}}
		l.descriptors(file, dname, d, nd.children, f.val, path, seg, depth+1)
		if len(nd.children.keys) == 0 {
			nd.children = nil
		}
	}
	l.trail = l.trail[:len(l.trail)-1]
	if valid {
		l.insert(file, path, lv, nd, key, value)
	}
}

// keyValue reads descriptor n's key and value; valid is false when either
// is missing or not a string (the problem reported).
func (l *loader) keyValue(file, path string, n *yaml.Node, fields map[string]field) (key, value string, valid bool) {
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
	return key, value, keyOK && valueOK
}

// statPath is a descriptor's stats-key path: its owner's path, a dot, and
// the descriptor's key, or key_value when it has a value.
func statPath(owner, key, value string) string {
	seg := key
	if value != "" {
		seg += "_" + value
	}
	if owner != "" {
		seg = owner + "." + seg
	}
	return seg
}

// wildcard compiles a value with '*' into nd's glob and, with
// share_threshold, into the pattern that the values it matches share a
// counter under.
func (l *loader) wildcard(file, path string, nd *node, value string, fields map[string]field) {
	wildcard := strings.Contains(value, "*")
	if l.flag(file, path, fields, "share_threshold") {
		if wildcard {
			nd.pattern, nd.share = escapePart(value, l.max), value
		} else {
			l.errorf(file, fields["share_threshold"].key.Line, path, "share_threshold needs a wildcard value (with '*'), got %s", quoteOrNone(value))
		}
	}
	if wildcard {
		nd.glob = compileGlob(value)
	}
}

func quoteOrNone(s string) string {
	if s == "" {
		return "no value"
	}
	return strconv.Quote(s)
}

// flags are what a descriptor gives each of its limits.
type flags struct {
	shadow, detailed, valueToMetric, quota bool
	metadata                               map[string]any
}

// descriptorFlags reads the descriptor's metadata and its flags.
func (l *loader) descriptorFlags(file, path string, fields map[string]field) flags {
	var fl flags
	if f, ok := fields["metadata"]; ok {
		fl.metadata = l.metadata(file, path, f.val)
	}
	fl.shadow = l.flag(file, path, fields, "shadow_mode")
	fl.detailed = l.flag(file, path, fields, "detailed_metric")
	fl.valueToMetric = l.flag(file, path, fields, "value_to_metric")
	fl.quota = l.flag(file, path, fields, "quota_mode")
	return fl
}

// flag reads the descriptor's boolean field name: false when it is absent
// or invalid (the problem reported).
func (l *loader) flag(file, path string, fields map[string]field, name string) bool {
	f, ok := fields[name]
	if !ok {
		return false
	}
	b, _ := l.bool(file, path, name, f)
	return b
}

// limits compiles the descriptor's rate_limit (limit.go) or rate_limits
// (extensions.go) into nd's rule and d's rules; a rate_limit with an
// overlay's fields (overlay.go) if one applies. Their stats paths start
// with stat.
func (l *loader) limits(file, dname string, d *domain, nd *node, path, stat string, fields map[string]field, fl flags) {
	single, hasSingle := fields["rate_limit"]
	list, hasList := fields["rate_limits"]
	hasSingle = hasSingle && !isNull(resolve(single.val))
	hasList = hasList && !isNull(resolve(list.val))
	switch {
	case hasSingle && hasList:
		l.errorf(file, list.key.Line, path, "rate_limit and rate_limits are mutually exclusive (rate_limit is at line %d)", single.key.Line)
	case hasSingle:
		if l.ov != nil {
			if g := l.overlaid(file, dname, path, stat, nd.line, single, fl); g != nil {
				nd.rule = g[0]
				d.rules = append(d.rules, g...)
				return
			}
		}
		if r := l.rateLimit(file, dname, path, stat, nd.line, single, fl); r != nil {
			r.group = []*Rule{r}
			nd.rule = r
			d.rules = append(d.rules, r)
		}
	case hasList:
		if g := l.rateLimits(file, dname, path, stat, nd.line, list, fl); g != nil {
			nd.rule = g[0]
			d.rules = append(d.rules, g...)
		}
	}
}

// insert puts descriptor nd into lv under its key and value; a second
// descriptor of the same key and value is an error.
func (l *loader) insert(file, path string, lv *level, nd *node, key, value string) {
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
			l.errorf(file, nd.line, path, "duplicate descriptor: key %q without value is also defined at %s", key, at(prev.file, prev.line))
		} else {
			l.errorf(file, nd.line, path, "duplicate descriptor: key %q value %q is also defined at %s", key, value, at(prev.file, prev.line))
		}
		return
	}
	if value == "" {
		kn.def = nd
		return
	}
	kn.exact[value] = nd
	if strings.Contains(value, "*") {
		kn.wild = append(kn.wild, nd)
	}
}
