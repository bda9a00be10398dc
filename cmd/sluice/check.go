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

const checkUsage = `usage: sluice check --config PATH [--merge-domains]

Validates the limits files at PATH (a file, or the *.yaml and *.yml files
of a directory) exactly as serve loads them. Prints a summary and exits 0,
or prints every problem with its file, line and descriptor and exits 1.

flags:
`

func runCheck(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, checkUsage); fs.PrintDefaults() }
	path := fs.String("config", "", "limits `path`: a YAML file or a directory of them")
	merge := fs.Bool("merge-domains", false, "let several files define the same domain (merged)")
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
	tbl, err := config.Load(*path, config.Options{MergeDomains: *merge})
	if err != nil {
		fmt.Fprintln(stderr, err)
		var es *config.Errors
		if errors.As(err, &es) {
			fmt.Fprintf(stderr, "%s: %d %s\n", *path, len(es.List), plural(len(es.List), "error", "errors"))
		}
		return 1
	}
	printSummary(stdout, *path, tbl)
	return 0
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
	return strings.Join(fl, " ")
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
