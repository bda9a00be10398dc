package config

import (
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// metadata reads a descriptor's metadata: a mapping of anything, as
// envoyproxy/ratelimit's yaml.v2 reads it into a google.protobuf.Struct.
// Values become JSON-like Go values: map[string]any, []any, string,
// float64 (every number), bool and nil. Unquoted yes/no/on/off are
// booleans and timestamps stay strings, as in yaml.v2. Infinite and NaN
// numbers, which JSON cannot carry, stay strings as written. nil when the
// metadata is null or invalid.
func (l *loader) metadata(file, path string, n *yaml.Node) map[string]any {
	if n = l.mapping(file, path, "metadata", n); n == nil {
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
