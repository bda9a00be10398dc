package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/store"
)

func init() {
	register(command{name: "check", summary: "validate limits files offline and summarise them", run: runCheck})
}

const checkUsage = `usage: sluice check --config PATH [--merge-domains] [--default-algorithm ALG] [--xds-overlay OVERLAY]

Validates the limits files at PATH (a file, or the *.yaml and *.yml files
of a directory) exactly as serve loads them. Prints a summary and exits 0,
or prints every problem with its file, line and descriptor and exits 1.

With --xds-overlay, PATH stands for the limits an xDS server pushes (one
file per RateLimitConfig, as Envoy Gateway's dump shows them) and the
overlay is applied to them as serve applies it to the pushed limits: the
summary marks each rule the overlay changed with the overlay's file:line,
and an overlay entry that changes no rule is listed and makes check exit 1.

flags:
`

func runCheck(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, checkUsage); fs.PrintDefaults() }
	path := fs.String("config", "", "limits `path`: a YAML file or a directory of them")
	merge := fs.Bool("merge-domains", false, "let several files define the same domain (merged)")
	overlay := fs.String("xds-overlay", "", "overlay `path` (a file or a directory of them) to apply to the limits, as serve --xds-overlay applies it to pushed limits")
	defAlg := fs.String("default-algorithm", "fixed_window", "`algorithm` of every rule that names none: fixed_window | sliding_window | token_bucket")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sluice check: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *path == "" {
		fmt.Fprintln(stderr, "sluice check: --config is required")
		return 2
	}
	opts := config.Options{MergeDomains: *merge}
	var ok bool
	if opts.DefaultAlgorithm, ok = algorithms[*defAlg]; !ok {
		fmt.Fprintf(stderr, "sluice check: --default-algorithm %q: want fixed_window, sliding_window or token_bucket\n", *defAlg)
		return 2
	}
	if *overlay != "" {
		o, err := config.LoadOverlay(*overlay)
		if err != nil {
			fmt.Fprintln(stderr, err)
			var es *config.Errors
			if errors.As(err, &es) {
				fmt.Fprintf(stderr, "%s: %d %s\n", *overlay, len(es.List), plural(len(es.List), "error", "errors"))
			}
			return 1
		}
		opts.Overlay = o
	}
	tbl, err := config.Load(*path, opts)
	if err != nil {
		fmt.Fprintln(stderr, err)
		var es *config.Errors
		if errors.As(err, &es) {
			fmt.Fprintf(stderr, "%s: %d %s\n", *path, len(es.List), plural(len(es.List), "error", "errors"))
		}
		return 1
	}
	printSummary(stdout, *path, tbl)
	if *overlay != "" && !printOverlay(stdout, stderr, *overlay, tbl.Overlay()) {
		return 1
	}
	return 0
}

// printOverlay says what the overlay did, and lists its entries that
// changed no rule (on stderr); false if there are any.
func printOverlay(stdout, stderr io.Writer, path string, rep config.OverlayReport) bool {
	fmt.Fprintf(stdout, "\noverlay %s: %d %s in %d %s, %d applied\n", path, rep.Entries, plural(rep.Entries, "entry", "entries"),
		rep.Files, plural(rep.Files, "file", "files"), rep.Entries-len(rep.Unmatched))
	for _, m := range rep.Problems {
		fmt.Fprintln(stderr, m)
	}
	for _, m := range rep.Unmatched {
		fmt.Fprintln(stderr, m)
	}
	if n := len(rep.Unmatched); n > 0 {
		fmt.Fprintf(stderr, "%s: %d %s changing no rule\n", path, n, plural(n, "entry", "entries"))
		return false
	}
	return len(rep.Problems) == 0
}

// printSummary lists the domains and, for each rule, its key path, limit,
// algorithm and flags.
func printSummary(w io.Writer, path string, tbl *config.Table) {
	rules := tbl.Rules()
	domains := tbl.Domains()
	fmt.Fprintf(w, "%s: OK, %d %s, %d %s\n", path, len(domains), plural(len(domains), "domain", "domains"),
		len(rules), plural(len(rules), "rule", "rules"))
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	for _, d := range domains {
		fmt.Fprintf(tw, "\ndomain %s\n", d)
		for _, r := range rules {
			if r.Domain != d {
				continue
			}
			limit, alg := "unlimited", "-"
			if !r.Unlimited {
				limit = fmt.Sprintf("%d/%s", r.RequestsPerUnit, r.Per())
				alg = r.Algorithm.String()
				if r.Algorithm == store.TokenBucket {
					alg += fmt.Sprintf(" burst %d", r.Burst)
				}
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", r.Path, limit, alg, ruleFlags(r))
		}
	}
	tw.Flush()
	for _, line := range strings.SplitAfter(buf.String(), "\n") {
		io.WriteString(w, strings.TrimRight(line, " \n"))
		if strings.HasSuffix(line, "\n") {
			io.WriteString(w, "\n")
		}
	}
}

func ruleFlags(r *config.Rule) string {
	var fl []string
	if r.Name != "" {
		fl = append(fl, "name="+r.Name)
	}
	if len(r.Replaces) > 0 {
		fl = append(fl, "replaces="+strings.Join(r.Replaces, ","))
	}
	for _, f := range []struct {
		on   bool
		name string
	}{{r.ShadowMode, "shadow_mode"}, {r.QuotaMode, "quota_mode"}, {r.DetailedMetric, "detailed_metric"}, {r.ValueToMetric, "value_to_metric"}} {
		if f.on {
			fl = append(fl, f.name)
		}
	}
	if ov := r.Overlay; ov != nil {
		fl = append(fl, fmt.Sprintf("overlay=%s:%d", ov.File, ov.Line))
	}
	return strings.Join(fl, " ")
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
