package main

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
)

// envName is the SLUICE_* variable of a flag: --grpc-addr → SLUICE_GRPC_ADDR.
func envName(flagName string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyEnv gives every flag not set on the command line its SLUICE_*
// variable, then the reference's variables (envoyproxy/ratelimit's, as
// refTable maps them) to flags still unset. It returns the warnings to
// log once the logger exists. Precedence: flag > SLUICE_* > reference
// variable > default.
func applyEnv(fs *flag.FlagSet, getenv func(string) string) (warnings []string, err error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		if v := getenv(envName(f.Name)); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", envName(f.Name), shownValue(f.Name, v), err))
			}
			set[f.Name] = true
		}
	})
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	e := &refEnv{getenv: getenv, set: func(name, value string) {
		if set[name] || fs.Lookup(name) == nil {
			return
		}
		if err := fs.Set(name, value); err != nil {
			errs = append(errs, fmt.Errorf("flag --%s from the reference's environment: %w", name, err))
		}
	}}
	for _, r := range refTable() {
		if err := r.read(e); err != nil {
			return nil, err
		}
	}
	return e.warnings, errors.Join(errs...)
}

// refEnv is what the rows of refTable read the environment with.
type refEnv struct {
	getenv func(string) string
	// set sets a flag not set by a flag or a SLUICE_* variable.
	set      func(flag, value string)
	warnings []string
}

func (e *refEnv) has(name string) bool { return e.getenv(name) != "" }

// on reports whether the reference's boolean name is true. A malformed
// value reads as false here: its own row refuses it.
func (e *refEnv) on(name string) bool {
	b, _ := refBool(e.getenv, name)
	return b
}

func (e *refEnv) warn(format string, args ...any) {
	e.warnings = append(e.warnings, fmt.Sprintf(format, args...))
}

// refVar is one environment variable of envoyproxy/ratelimit's settings
// (its src/settings/settings.go) and what serve does with it: one row of
// refTable, which both drives applyEnv and generates the table in
// docs/ENVOY-GATEWAY.md (refDocs, in the tests).
//
// A row is read when its condition holds: a boolean is parsed as the
// reference parses it (refBool), then the value is refused, mapped onto a
// flag, ignored with a warning or left alone, as the row says. An unset
// variable does nothing unless the row has a default.
type refVar struct {
	name string
	// extra, when the variable is not one of the reference's settings,
	// says whose it is (the statsd library's, OpenTelemetry's, Envoy
	// Gateway's).
	extra string
	// boolean: read with strconv.ParseBool as the reference reads it; a
	// malformed value is refused, and the value goes on as true or false.
	boolean bool
	// when, if set, is when the variable is read at all. If it does not
	// hold, a set variable is warned about with unmet ("NAME is
	// ignored"+unmet) if there is one, else left alone.
	when  *refCond
	unmet string

	// What a value does: one of refuse, ignore, flag, apply, with, note.

	// refuse: the value is refused (a boolean's only when true; with
	// accept, any value but that one) for this reason.
	refuse, accept string
	// ignore: accepted and not used, with a warning giving this reason (a
	// boolean that refuse has not refused).
	ignore string
	// flag: mapped onto this serve flag, as given or through conv; def is
	// the reference's default, mapped when the variable is unset.
	flag string
	conv refConv
	def  string
	// apply does anything else with a set value; its doc says what.
	apply refApply
	// with: read by the row of this variable.
	with string
	// note: nothing to do, and no warning, for this reason (the docs say
	// it).
	note string

	// differs, on a row that maps or applies the variable, says how
	// Sluice's behaviour differs from the reference's with it (its default
	// when unset included); empty: the same behaviour.
	differs string
}

// refConv turns a variable's value into its flag's; "" leaves the flag
// alone. doc says how, for the docs table.
type refConv struct {
	doc string
	fn  func(e *refEnv, v string) (string, error)
}

// refApply does what a row's value asks beyond setting one flag.
type refApply struct {
	doc string
	fn  func(e *refEnv, v string) error
}

// refCond is a condition on the environment under which rows are read.
type refCond struct {
	doc string // for the docs: "`CONFIG_TYPE=GRPC_XDS_SOTW`"
	// within, if set, must hold first; if it does not, the row's variable
	// is left alone without a warning.
	within *refCond
	holds  func(e *refEnv) bool
}

// check reports whether c holds, and if not whether a set variable is
// worth a warning (c failed itself, not its within).
func (c *refCond) check(e *refEnv) (ok, warn bool) {
	if c == nil {
		return true, false
	}
	if c.within != nil {
		if ok, _ := c.within.check(e); !ok {
			return false, false
		}
	}
	return c.holds(e), true
}

// read applies the row to the environment.
func (r *refVar) read(e *refEnv) error {
	v := e.getenv(r.name)
	if ok, warn := r.when.check(e); !ok {
		if v != "" && warn && r.unmet != "" {
			e.warn("%s is ignored%s", r.name, r.unmet)
		}
		return nil
	}
	if v == "" {
		if v = r.def; v == "" {
			return nil
		}
	}
	if r.boolean {
		b, err := refBool(e.getenv, r.name)
		if err != nil {
			return err
		}
		v = strconv.FormatBool(b)
	}
	switch {
	case r.refused(v):
		return r.refusal(v)
	case r.ignore != "":
		e.warn("%s is ignored: %s", r.name, r.ignore)
	case r.flag != "":
		if r.conv.fn != nil {
			var err error
			if v, err = r.conv.fn(e, v); err != nil || v == "" {
				return err
			}
		}
		e.set(r.flag, v)
	case r.apply.fn != nil:
		return r.apply.fn(e, v)
	}
	return nil
}

// refused reports whether the row refuses value v: a boolean when
// true, else any value but the row's accept.
func (r *refVar) refused(v string) bool {
	switch {
	case r.refuse == "":
		return false
	case r.boolean:
		return v == "true"
	}
	return r.accept == "" || !strings.EqualFold(v, r.accept)
}

// refusal is the error of a refused value.
func (r *refVar) refusal(v string) error {
	switch {
	case r.boolean:
		return fmt.Errorf("%s=true is not supported: %s", r.name, r.refuse)
	case r.accept != "":
		return fmt.Errorf("%s=%s is not supported: %s", r.name, v, r.refuse)
	}
	return fmt.Errorf("%s is not supported: %s", r.name, r.refuse)
}

// refBool reads one of the reference's boolean variables as it does
// (strconv.ParseBool: 1, t, true, TRUE, 0, f, false, ...); unset is false.
func refBool(getenv func(string) string, name string) (bool, error) {
	v := getenv(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s=%q: want true or false", name, v)
	}
	return b, nil
}
