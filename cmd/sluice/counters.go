package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/server"
)

func init() {
	register(command{name: "counters", summary: "look up or reset counters of descriptors (HTTP /v1/counters)", run: runCounters})
}

const countersUsage = `usage: sluice counters get|reset --domain D --descriptor k=v[,k2=v2] [--descriptor ...] [flags]

get asks a Sluice server's HTTP port (POST /v1/counters) which rule each
descriptor matches and its counters now: used, remaining, when the window
resets or the bucket refills, and when one more request would fit. It
consumes nothing.

reset sets those counters back to empty (POST /v1/counters/reset). The
server must run with --admin-token-file; --token-file is a file holding
the same token.

Exit status: 0 on an answer, 2 on a usage or HTTP error.

`

type countersFlags struct {
	addr        string
	domain      string
	descriptors descriptorFlags
	tokenFile   string
	jsonOut     bool
	timeout     time.Duration
	tls         tlsClientFlags
}

func (f *countersFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.addr, "addr", "localhost:8080", "Sluice's HTTP `address` (host:port, or a URL such as https://sluice.example:8080)")
	fs.StringVar(&f.domain, "domain", "", "rate-limit `domain` (required)")
	fs.Var(&f.descriptors, "descriptor", "a descriptor as `key=value[,key2=value2]`; repeat for more (at least one)")
	fs.StringVar(&f.tokenFile, "token-file", "", "reset: `file` holding the admin token (the server's --admin-token-file)")
	fs.BoolVar(&f.jsonOut, "json", false, "print the server's JSON answer")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Second, "deadline of the call")
	f.tls.register(fs)
}

func runCounters(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var f countersFlags
	fs := flag.NewFlagSet("counters", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, countersUsage); fs.PrintDefaults() }
	f.register(fs)
	usageErr := func(msg string) int {
		fmt.Fprintf(stderr, "sluice counters: %s\n", msg)
		return 2
	}
	if len(args) == 0 || (args[0] != "get" && args[0] != "reset") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fs.Usage()
			return 0
		}
		fs.Usage()
		return 2
	}
	verb := args[0]
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := f.validate(fs, verb); err != nil {
		return usageErr(err.Error())
	}
	req, res, body, err := f.exchange(ctx, verb)
	if err != nil {
		return usageErr(err.Error())
	}
	if res.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		json.Unmarshal(body, &e)
		if e.Error == "" {
			e.Error = strings.TrimSpace(string(body))
		}
		return usageErr(fmt.Sprintf("%s: %s: %s", req.URL.Redacted(), res.Status, e.Error))
	}
	if f.jsonOut {
		stdout.Write(body)
		return 0
	}
	var out server.CountersResponse
	if err := json.Unmarshal(body, &out); err != nil {
		return usageErr(fmt.Sprintf("%s: answer: %v", req.URL.Redacted(), err))
	}
	if verb == "reset" {
		fmt.Fprintln(stdout, "reset; the counters now:")
	}
	writeCounters(stdout, &out)
	return 0
}

// validate checks the flags of verb (get or reset) that fs parsed.
func (f *countersFlags) validate(fs *flag.FlagSet, verb string) error {
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case f.domain == "":
		return errors.New("--domain is required")
	case len(f.descriptors) == 0:
		return errors.New("at least one --descriptor is required")
	case f.timeout <= 0:
		return errors.New("--timeout must be positive")
	case verb == "reset" && f.tokenFile == "":
		return errors.New("reset needs --token-file")
	}
	return nil
}

// exchange sends verb's request and reads the answer (at most 16 MiB).
func (f *countersFlags) exchange(ctx context.Context, verb string) (*http.Request, *http.Response, []byte, error) {
	tlsCfg, err := f.tls.config()
	if err != nil {
		return nil, nil, nil, err
	}
	hc := &http.Client{Timeout: f.timeout}
	if tlsCfg != nil {
		hc.Transport = &http.Transport{TLSClientConfig: tlsCfg}
	}
	req, err := f.request(ctx, verb, tlsCfg != nil)
	if err != nil {
		return nil, nil, nil, err
	}
	res, err := hc.Do(req)
	if err != nil {
		return nil, nil, nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 16<<20))
	if err != nil {
		return nil, nil, nil, err
	}
	return req, res, body, nil
}

// request builds the POST of verb with the descriptors as JSON.
func (f *countersFlags) request(ctx context.Context, verb string, tls bool) (*http.Request, error) {
	base := f.addr
	if !strings.Contains(base, "://") {
		scheme := "http://"
		if tls {
			scheme = "https://"
		}
		base = scheme + base
	}
	path := "/v1/counters"
	if verb == "reset" {
		path += "/reset"
	}
	type entry struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	}
	type descriptor struct {
		Entries []entry `json:"entries"`
	}
	in := struct {
		Domain      string       `json:"domain"`
		Descriptors []descriptor `json:"descriptors"`
	}{Domain: f.domain}
	for _, d := range f.descriptors {
		var ds descriptor
		for _, e := range d {
			ds.Entries = append(ds.Entries, entry{e.Key, e.Value})
		}
		in.Descriptors = append(in.Descriptors, ds)
	}
	b, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(base, "/")+path, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if verb == "reset" {
		tok, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	return req, nil
}

// writeCounters prints each descriptor's rule and a table of its
// counters.
func writeCounters(w io.Writer, out *server.CountersResponse) {
	for _, d := range out.Descriptors {
		var kv []string
		for _, e := range d.Entries {
			kv = append(kv, e.Key+"="+e.Value)
		}
		desc := strings.Join(kv, ",")
		switch {
		case !d.Matched:
			fmt.Fprintf(w, "%s: no rule matches in domain %s\n", desc, out.Domain)
			continue
		case d.Unlimited:
			fmt.Fprintf(w, "%s: %s.%s, unlimited\n", desc, out.Domain, d.Path)
			continue
		case d.Override:
			fmt.Fprintf(w, "%s: the request's limit override\n", desc)
		default:
			fmt.Fprintf(w, "%s: %s.%s\n", desc, out.Domain, d.Path)
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  LIMIT\tALGORITHM\tPER\tUSED\tREMAINING\tRESET\tNEXT FITS")
		for _, l := range d.Limits {
			name := l.Name
			if name == "" {
				name = l.Path
			}
			if name == "" {
				name = "override"
			}
			if l.Shadow {
				name += " (shadow)"
			}
			if l.Replaced {
				fmt.Fprintf(tw, "  %s\t%s\t%s\treplaced by another descriptor's rule\t\t\t\n", name, l.Algorithm, l.Per)
				continue
			}
			next := "now"
			switch {
			case l.Never:
				next = "never (cost above the limit)"
			case !l.Allowed:
				next = "in " + seconds(l.RetryAfterS)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d/%d\t%d\t%s\t%s\n", name, l.Algorithm, l.Per, l.Used, l.Limit, l.Remaining,
				seconds(l.ResetAfterS), next)
		}
		tw.Flush()
	}
}

// seconds spells a number of seconds as a duration ("1m30s", "250ms").
func seconds(s float64) string {
	d := time.Duration(s * float64(time.Second))
	if d >= time.Millisecond {
		d = d.Round(time.Millisecond)
	}
	return d.String()
}
