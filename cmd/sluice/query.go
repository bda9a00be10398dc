package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/client"
)

func init() {
	register(command{name: "query", summary: "ask a rate-limit service about descriptors (Envoy RLS)", run: runQuery})
}

const queryUsage = `usage: sluice query --domain D --descriptor k=v[,k2=v2] [--descriptor ...] [flags]

Asks a rate-limit service (Sluice, or any Envoy RLS v3 server) about one
request of the given descriptors and prints each descriptor's status.
Exit status: 0 when the (last) answer is OK, 1 when it is over the limit,
2 on a usage or RPC error.

`

// descriptorFlags collects repeated --descriptor k=v[,k2=v2] flags.
type descriptorFlags []client.Descriptor

func (d *descriptorFlags) String() string { return "" }

func (d *descriptorFlags) Set(s string) error {
	var desc client.Descriptor
	for _, pair := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return fmt.Errorf("%q: want key=value pairs separated by commas", s)
		}
		desc = append(desc, client.Entry{Key: k, Value: v})
	}
	*d = append(*d, desc)
	return nil
}

type queryFlags struct {
	addr        string
	domain      string
	descriptors descriptorFlags
	hits        uint
	jsonOut     bool
	repeat      int
	interval    time.Duration
	timeout     time.Duration
	tls         tlsClientFlags
}

func (f *queryFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.addr, "addr", "localhost:8081", "rate-limit service `address` (gRPC target syntax)")
	fs.StringVar(&f.domain, "domain", "", "rate-limit `domain` (required)")
	fs.Var(&f.descriptors, "descriptor", "a descriptor as `key=value[,key2=value2]`; repeat for more (at least one)")
	fs.UintVar(&f.hits, "hits", 1, "hits_addend: the request's cost for every descriptor")
	fs.BoolVar(&f.jsonOut, "json", false, "print each answer as a line of JSON")
	fs.IntVar(&f.repeat, "repeat", 1, "ask this many times, to watch a limit drain")
	fs.DurationVar(&f.interval, "interval", 0, "pause between repeated asks")
	fs.DurationVar(&f.timeout, "timeout", time.Second, "deadline of each call")
	f.tls.register(fs)
}

// check returns what is wrong with the parsed flags of fs, "" if nothing.
func (f *queryFlags) check(fs *flag.FlagSet) string {
	switch {
	case fs.NArg() > 0:
		return fmt.Sprintf("unexpected argument %q", fs.Arg(0))
	case f.domain == "":
		return "--domain is required"
	case len(f.descriptors) == 0:
		return "at least one --descriptor is required"
	case f.hits == 0 || f.hits > 1<<32-1:
		return "--hits must be between 1 and 4294967295"
	case f.repeat < 1:
		return "--repeat must be at least 1"
	case f.timeout <= 0 || f.interval < 0:
		return "--timeout must be positive and --interval not negative"
	}
	return ""
}

func runQuery(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var f queryFlags
	fs := flag.NewFlagSet("query", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, queryUsage); fs.PrintDefaults() }
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	usageErr := func(msg string) int {
		fmt.Fprintf(stderr, "sluice query: %s\n", msg)
		return 2
	}
	if msg := f.check(fs); msg != "" {
		return usageErr(msg)
	}
	tlsCfg, err := f.tls.config()
	if err != nil {
		return usageErr(err.Error())
	}
	opts := []client.Option{client.WithTimeout(f.timeout)}
	if tlsCfg != nil {
		opts = append(opts, client.WithTLS(tlsCfg))
	}
	c, err := client.Dial(f.addr, opts...)
	if err != nil {
		return usageErr(err.Error())
	}
	defer c.Close()
	return f.ask(ctx, c, stdout, stderr)
}

// ask asks --repeat times and prints each answer; it returns the exit
// code of the last one.
func (f *queryFlags) ask(ctx context.Context, c *client.Client, stdout, stderr io.Writer) int {
	code := 0
	for i := 1; i <= f.repeat; i++ {
		if i > 1 && f.interval > 0 {
			select {
			case <-ctx.Done():
				return 2
			case <-time.After(f.interval):
			}
		}
		r, err := c.ShouldRateLimit(ctx, f.domain, f.descriptors, uint32(f.hits))
		if err != nil {
			fmt.Fprintf(stderr, "sluice query: %s: %v\n", f.addr, err)
			return 2
		}
		if f.jsonOut {
			err = writeQueryJSON(stdout, i, f.descriptors, r)
		} else {
			err = writeQueryTable(stdout, i, f.repeat, f.descriptors, r)
		}
		if err != nil {
			fmt.Fprintf(stderr, "sluice query: %v\n", err)
			return 2
		}
		code = 0
		if !r.Allowed {
			code = 1
		}
	}
	return code
}

func codeName(allowed bool) string {
	if allowed {
		return "OK"
	}
	return "OVER_LIMIT"
}

func descriptorString(d client.Descriptor) string {
	var b strings.Builder
	for i, e := range d {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.Key)
		b.WriteByte('=')
		b.WriteString(e.Value)
	}
	return b.String()
}

// writeQueryTable prints one answer as a table, headed by the overall
// code (and the call number when repeating).
func writeQueryTable(w io.Writer, call, of int, ds []client.Descriptor, r client.Result) error {
	if of > 1 {
		fmt.Fprintf(w, "#%d ", call)
	}
	fmt.Fprintln(w, codeName(r.Allowed))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DESCRIPTOR\tCODE\tLIMIT\tREMAINING\tRESET\tRULE")
	for i, s := range r.Statuses {
		d := "?"
		if i < len(ds) {
			d = descriptorString(ds[i])
		}
		if !s.Limited {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\n", d, codeName(s.Allowed))
			continue
		}
		name := s.Name
		if name == "" {
			name = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d/%s\t%d\t%v\t%s\n", d, codeName(s.Allowed), s.Limit, s.Unit, s.Remaining, s.ResetAfter, name)
	}
	return tw.Flush()
}

type queryJSON struct {
	Call     int          `json:"call"`
	Code     string       `json:"code"`
	Statuses []statusJSON `json:"statuses"`
}

type statusJSON struct {
	Descriptor   string  `json:"descriptor"`
	Code         string  `json:"code"`
	Rule         string  `json:"rule,omitempty"`
	Limit        uint64  `json:"limit,omitempty"`
	Unit         string  `json:"unit,omitempty"`
	Remaining    *uint64 `json:"remaining,omitempty"`
	ResetSeconds *int64  `json:"reset_seconds,omitempty"`
}

// writeQueryJSON prints one answer as a line of JSON.
func writeQueryJSON(w io.Writer, call int, ds []client.Descriptor, r client.Result) error {
	out := queryJSON{Call: call, Code: codeName(r.Allowed), Statuses: make([]statusJSON, len(r.Statuses))}
	for i, s := range r.Statuses {
		sj := &out.Statuses[i]
		sj.Code = codeName(s.Allowed)
		if i < len(ds) {
			sj.Descriptor = descriptorString(ds[i])
		}
		if s.Limited {
			remaining, reset := s.Remaining, int64(s.ResetAfter/time.Second)
			sj.Rule, sj.Limit, sj.Unit, sj.Remaining, sj.ResetSeconds = s.Name, s.Limit, s.Unit, &remaining, &reset
		}
	}
	return json.NewEncoder(w).Encode(out)
}
