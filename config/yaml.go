package config

import (
	"errors"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

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

// mapping resolves field name's value n to a mapping: nil when it is
// null, or not a mapping (the problem reported).
func (l *loader) mapping(file, path, name string, n *yaml.Node) *yaml.Node {
	n = resolve(n)
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		l.errorf(file, n.Line, path, "%s: want a mapping, got %s", name, describe(n))
		return nil
	}
	return n
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
	if b, ok := boolValue(v); ok {
		return b, true
	}
	l.errorf(file, v.Line, path, "%s: want true or false, got %s", name, describe(v))
	return false, false
}

// boolValue reads v as bool does, reporting nothing; ok is false when v
// is not a boolean.
func boolValue(v *yaml.Node) (b, ok bool) {
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
