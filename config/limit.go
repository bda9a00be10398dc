package config

import (
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/store"
)

var rateLimitFields = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst", "unit_multiplier",
	"calendar", "time_zone"}

// listedLimitFields are the fields of one limit of a rate_limits list:
// a rate_limit's, and its own shadow_mode.
var listedLimitFields = append(slices.Clone(rateLimitFields), "shadow_mode")

// rateLimit compiles a rate_limit block; nil if it is null or invalid.
func (l *loader) rateLimit(file, dname, path, stat string, line int, f field, fl flags) *Rule {
	return l.rateLimitFrom(file, dname, path, stat, line, f.val, fl, false)
}

// rateLimitFrom compiles the rate_limit mapping n of the descriptor at
// line; nil if it is null or invalid. A listed limit (one of rate_limits)
// may set its own shadow_mode and may not be unlimited.
//
// The fields are read in steps, each reporting its own problems at the
// field's line: the reference's fields (this file), then Sluice's
// extensions (extensions.go), each of which may depend on the fields
// read before it, then replaces. A rule whose fields are all valid is
// compiled into its store rule (compileLimit). The order of the steps is
// the order of the problems a line reports.
func (l *loader) rateLimitFrom(file, dname, path, stat string, line int, n *yaml.Node, fl flags, listed bool) *Rule {
	if n = l.mapping(file, path, "rate_limit", n); n == nil {
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
	r := &Rule{Domain: dname, Path: stat, File: file, Line: line, Algorithm: l.defaultAlgorithm(fields),
		ShadowMode: fl.shadow, DetailedMetric: fl.detailed, ValueToMetric: fl.valueToMetric, QuotaMode: fl.quota,
		Metadata: fl.metadata}
	if !l.unlimited(file, path, r, fields, listed) {
		return nil
	}
	if f, ok := fields["name"]; ok {
		r.Name, _ = l.str(file, path, "name", f)
	}
	l.unit(file, path, n.Line, r, fields)
	l.requestsPerUnit(file, path, r, fields)
	l.algorithm(file, path, r, fields)
	l.unitMultiplier(file, path, r, fields)
	l.burst(file, path, r, fields)
	l.calendarFields(file, path, r, fields)
	if f, ok := fields["replaces"]; ok {
		r.Replaces, r.replacesAt = l.replaces(file, path, r.Name, f.val)
		r.desc = path
	}
	if len(l.errs) > nerr {
		return nil
	}
	if !r.Unlimited && !l.compileLimit(file, path, n.Line, r) {
		return nil
	}
	r.suffix = keySuffix(r)
	return r
}

// defaultAlgorithm is the algorithm of a rule that names none
// (Options.DefaultAlgorithm): a fixed window for a calendar rule when the
// default is a token bucket, which has no periods.
func (l *loader) defaultAlgorithm(fields map[string]field) store.Algorithm {
	a := l.opts.DefaultAlgorithm
	if a == 0 {
		return store.FixedWindow
	}
	if f, ok := fields["calendar"]; ok && a == store.TokenBucket {
		if on, _ := boolValue(resolve(f.val)); on {
			return store.FixedWindow
		}
	}
	return a
}

// unlimited reads rate_limit.unlimited into r; false (the problem
// reported) for an unlimited listed limit, which the caller drops.
func (l *loader) unlimited(file, path string, r *Rule, fields map[string]field, listed bool) bool {
	f, ok := fields["unlimited"]
	if !ok {
		return true
	}
	r.Unlimited, _ = l.bool(file, path, "unlimited", f)
	if r.Unlimited && listed {
		l.errorf(file, f.key.Line, path, "unlimited is not allowed in rate_limits; use rate_limit: {unlimited: true}")
		return false
	}
	return true
}

// unit reads rate_limit.unit into r: required, unless r is unlimited,
// which takes none. line is the rate_limit's.
func (l *loader) unit(file, path string, line int, r *Rule, fields map[string]field) {
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
		l.errorf(file, line, path, "rate_limit has no unit")
	default:
		u, err := ParseUnit(unit)
		if err != nil {
			l.errorf(file, unitField.val.Line, path, "%v", err)
		}
		r.Unit = u
	}
}

// requestsPerUnit reads rate_limit.requests_per_unit into r: up to 2^53
// (store.MaxLimit).
func (l *loader) requestsPerUnit(file, path string, r *Rule, fields map[string]field) {
	f, ok := fields["requests_per_unit"]
	if !ok {
		return
	}
	if v, ok := l.uint(file, path, "requests_per_unit", f); ok {
		if v > store.MaxLimit {
			l.errorf(file, f.val.Line, path, "requests_per_unit: %d exceeds %d (2^53)", v, uint64(store.MaxLimit))
		}
		r.RequestsPerUnit = v
	}
}

// compileLimit compiles r, a limited rule whose fields are all valid, into
// its store rule (r.Limit); false if the store's constructor refuses the
// algorithm, window and limit together (the problem reported at line, the
// rate_limit's).
func (l *loader) compileLimit(file, path string, line int, r *Rule) bool {
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
		l.errorf(file, line, path, "rate_limit: %s", strings.TrimPrefix(err.Error(), "store: "))
		return false
	}
	return true
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
