package main

import (
	"bufio"
	"flag"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the generated table of docs/ENVOY-GATEWAY.md from refTable")

// referenceSettings reads testdata/reference-settings.txt: the variables
// of envoyproxy/ratelimit's settings.
func referenceSettings(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("testdata/reference-settings.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	for sc := bufio.NewScanner(f); sc.Scan(); {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			names = append(names, l)
		}
	}
	return names
}

// TestRefTable_Complete: refTable has one row for every variable of the
// reference's settings, and for no other variable but its extras.
func TestRefTable_Complete(t *testing.T) {
	settings := referenceSettings(t)
	if len(settings) < 100 {
		t.Fatalf("%d settings read, want the reference's 114", len(settings))
	}
	rows := map[string]refVar{}
	for _, r := range refTable() {
		if _, dup := rows[r.name]; dup {
			t.Errorf("%s: two rows", r.name)
		}
		rows[r.name] = r
	}
	for _, n := range settings {
		r, ok := rows[n]
		switch {
		case !ok:
			t.Errorf("%s: a reference setting without a row", n)
		case r.extra != "":
			t.Errorf("%s: a reference setting marked extra (%s)", n, r.extra)
		}
		delete(rows, n)
	}
	for n, r := range rows {
		if r.extra == "" {
			t.Errorf("%s: a row for no reference setting, and not marked extra", n)
		}
	}
}

// TestRefTable_Rows: every row says one thing to do; the flags it maps
// onto are serve's, the variables it reads with are rows.
func TestRefTable_Rows(t *testing.T) {
	fs := newServeCmd(io.Discard).fs
	names := map[string]bool{}
	for _, r := range refTable() {
		names[r.name] = true
	}
	for _, r := range refTable() {
		var does []string
		for what, set := range map[string]bool{"refuse": r.refuse != "", "flag": r.flag != "", "apply": r.apply.fn != nil,
			"with": r.with != "", "note": r.note != "", "ignore": r.ignore != "" && r.refuse == ""} {
			if set {
				does = append(does, what)
			}
		}
		if len(does) != 1 {
			t.Errorf("%s: does %q, want one thing", r.name, does)
		}
		if r.flag != "" && fs.Lookup(r.flag) == nil {
			t.Errorf("%s: maps onto --%s, which serve does not have", r.name, r.flag)
		}
		if r.with != "" && !names[r.with] {
			t.Errorf("%s: read with %s, which has no row", r.name, r.with)
		}
		if (r.unmet != "" && r.when == nil) || (r.accept != "" && (r.refuse == "" || r.boolean)) ||
			(r.def != "" && (r.flag == "" && r.apply.fn == nil || r.boolean)) || (r.conv.fn != nil && r.flag == "") || (r.apply.fn != nil) != (r.apply.doc != "") ||
			(r.differs != "" && r.flag == "" && r.apply.fn == nil && r.note == "") {
			t.Errorf("%s: a malformed row", r.name)
		}
	}
}

// TestRefTable_RefusedAndIgnored sets each refused variable (a boolean
// to true) and each ignored one alone: serve refuses the first with the
// row's reason and warns about the second.
func TestRefTable_RefusedAndIgnored(t *testing.T) {
	for _, r := range refTable() {
		if r.when != nil || r.refuse == "" && r.ignore == "" {
			continue
		}
		v := "x"
		if r.boolean {
			v = "true"
		}
		_, warnings, err := parseServe(t, nil, serveEnv{r.name: v})
		switch {
		case r.refuse != "" && (err == nil || !strings.Contains(err.Error(), r.name) || !strings.Contains(err.Error(), r.refuse)):
			t.Errorf("%s=%s: %v, want refused: %s", r.name, v, err, r.refuse)
		case r.refuse == "" && (err != nil || !slices.Contains(warnings, r.name+" is ignored: "+r.ignore)):
			t.Errorf("%s=%s: warnings %q err %v, want %q ignored", r.name, v, warnings, err, r.name)
		}
	}
}

// The generated table of every reference setting in docs/ENVOY-GATEWAY.md.
const refDocsFile, refDocsBegin, refDocsEnd = "../../docs/ENVOY-GATEWAY.md", "<!-- BEGIN refTable -->\n", "<!-- END refTable -->"

// refDocsTable returns docs/ENVOY-GATEWAY.md and the offsets of its
// generated table.
func refDocsTable(t *testing.T) (doc string, i, j int) {
	t.Helper()
	b, err := os.ReadFile(refDocsFile)
	if err != nil {
		t.Fatal(err)
	}
	doc = string(b)
	i, j = strings.Index(doc, refDocsBegin), strings.Index(doc, refDocsEnd)
	if i < 0 || j < i || strings.Count(doc, refDocsBegin) != 1 {
		t.Fatalf("%s has no single %q ... %q block", refDocsFile, refDocsBegin, refDocsEnd)
	}
	return doc, i + len(refDocsBegin), j
}

// TestRefTable_Docs: the table of docs/ENVOY-GATEWAY.md is refDocs of
// refTable (-update rewrites it), and the variables the container
// contract of docs/ENVOY-GATEWAY.md names are rows.
func TestRefTable_Docs(t *testing.T) {
	file := refDocsFile
	doc, i, j := refDocsTable(t)
	want := refDocs(refTable())
	if got := doc[i:j]; got != want {
		if *update {
			if err := os.WriteFile(file, []byte(doc[:i]+want+doc[j:]), 0o644); err != nil {
				t.Fatal(err)
			}
		} else {
			t.Errorf("%s disagrees with refTable; go test ./cmd/sluice -run TestRefTable_Docs -update rewrites it", file)
		}
	}

	names := map[string]bool{}
	for _, r := range refTable() {
		names[r.name] = true
	}
	contract := doc[strings.Index(doc, "## The container contract"):]
	contract = contract[:strings.Index(contract, "\n## ")]
	seen := 0
	for _, m := range regexp.MustCompile(`(?m)^\| (.*?) \|`).FindAllStringSubmatch(contract, -1) {
		for _, v := range regexp.MustCompile("`([A-Z][A-Z0-9_]*)[=`]").FindAllStringSubmatch(m[1], -1) {
			seen++
			if !names[v[1]] {
				t.Errorf("docs/ENVOY-GATEWAY.md's container contract names %s, which refTable has no row for", v[1])
			}
		}
	}
	if seen < 20 {
		t.Errorf("%d variables found in docs/ENVOY-GATEWAY.md's container contract, want Envoy Gateway's", seen)
	}
}

// refDocs is the Markdown table of rows: each variable, how it is read,
// its behaviour (refBehaviour) and what Sluice does with it.
func refDocs(rows []refVar) string {
	var b strings.Builder
	b.WriteString("| variable | read as | behaviour | Sluice |\n| --- | --- | --- | --- |\n")
	for _, r := range rows {
		name := "`" + r.name + "`"
		if r.extra != "" {
			name += " (not a setting of the reference: " + r.extra + ")"
		}
		read := "text"
		switch {
		case r.boolean:
			read = "boolean"
		case r.flag != "" && r.conv.fn == nil:
			read = "by the flag"
		}
		what := r.does()
		if r.when != nil {
			what = "only with " + r.when.docs() + map[bool]string{true: " (else ignored with a warning)"}[r.unmet != ""] + ": " + what
		}
		if r.differs != "" {
			what += ". **Differs**: " + r.differs
		}
		b.WriteString("| " + name + " | " + read + " | " + r.behaviour() + " | " + what + " |\n")
	}
	return b.String()
}

// The behaviour column: what Sluice does with a reference setting,
// compared with the reference.
const (
	behaviourSame    = "same"    // mapped (or read), and behaves as the reference
	behaviourDiffers = "differs" // mapped, with the difference the row states
	behaviourIgnored = "ignored" // not used, for the reason the row states
	behaviourRefused = "refused" // serve stops: no row may
)

// behaviour is the row's behaviour column. A row that is not read
// because another setting is refused refuses too.
func (r *refVar) behaviour() string {
	switch {
	case r.refuse != "" || strings.Contains(r.note, "refused"):
		return behaviourRefused
	case r.ignore != "" || strings.HasPrefix(r.note, "not read"):
		return behaviourIgnored
	case r.differs != "":
		return behaviourDiffers
	}
	return behaviourSame
}

// TestRefTable_Settings reads the table of docs/ENVOY-GATEWAY.md as a
// user would: every variable of the reference's settings has one row
// whose behaviour column is same, differs (with the difference), ignored
// (with the reason), and that column is what the code does (refTable's
// row); no row refuses (serve stopping on a setting the reference's users
// set is what issue 24 removed).
func TestRefTable_Settings(t *testing.T) {
	doc, i, j := refDocsTable(t)
	type docRow struct{ behaviour, sluice string }
	rows := map[string]docRow{}
	cell := regexp.MustCompile("^`([A-Z][A-Z0-9_]*)`")
	for line := range strings.Lines(doc[i:j]) {
		f := strings.Split(strings.TrimSpace(line), " | ")
		if len(f) != 4 || !strings.HasPrefix(f[0], "| ") {
			continue
		}
		m := cell.FindStringSubmatch(strings.TrimPrefix(f[0], "| "))
		if m == nil {
			continue
		}
		if _, dup := rows[m[1]]; dup {
			t.Errorf("%s: two rows in the table", m[1])
		}
		rows[m[1]] = docRow{behaviour: f[2], sluice: strings.TrimSuffix(f[3], " |")}
	}
	code := map[string]refVar{}
	for _, r := range refTable() {
		code[r.name] = r
	}
	settings := referenceSettings(t)
	for _, n := range settings {
		row, ok := rows[n]
		if !ok {
			t.Errorf("%s: a reference setting missing from the table of %s", n, refDocsFile)
			continue
		}
		r := code[n]
		if want := r.behaviour(); row.behaviour != want {
			t.Errorf("%s: the table says %q, the code does %q (go test ./cmd/sluice -run TestRefTable_Docs -update)", n, row.behaviour, want)
		}
		switch row.behaviour {
		case behaviourSame:
		case behaviourDiffers:
			if !strings.Contains(row.sluice, "**Differs**: ") {
				t.Errorf("%s: differs, and the table does not say how", n)
			}
		case behaviourIgnored:
			if !strings.Contains(row.sluice, ": ") {
				t.Errorf("%s: ignored, and the table does not say why: %q", n, row.sluice)
			}
		case behaviourRefused:
			t.Errorf("%s: refused; every reference setting is mapped or ignored (with a reason)", n)
		default:
			t.Errorf("%s: behaviour %q, want same, differs, ignored or refused", n, row.behaviour)
		}
	}
	for n, row := range rows {
		if row.behaviour == behaviourRefused && !slices.Contains(settings, n) {
			t.Errorf("%s (not a reference setting): refused", n)
		}
	}
}

// does says what the row does with a set value.
func (r *refVar) does() string {
	switch {
	case r.refuse != "" && r.boolean && r.ignore != "":
		return "`true` refused: " + r.refuse + "; `false` ignored with a warning: " + r.ignore
	case r.refuse != "" && r.boolean:
		return "`true` refused: " + r.refuse
	case r.refuse != "" && r.accept != "":
		return "refused unless `" + r.accept + "`: " + r.refuse
	case r.refuse != "":
		return "refused: " + r.refuse
	case r.ignore != "":
		return "ignored with a warning: " + r.ignore
	case r.flag != "":
		s := "mapped: `--" + r.flag + "`"
		if r.conv.doc != "" {
			s += ", " + r.conv.doc
		}
		if r.def != "" {
			s += "; `" + r.def + "` when unset (the reference's default)"
		}
		return s
	case r.apply.fn != nil:
		return r.apply.doc
	case r.with != "":
		return "read with `" + r.with + "`"
	}
	return r.note
}

func (c *refCond) docs() string {
	if c.within != nil {
		return c.within.docs() + " and " + c.doc
	}
	return c.doc
}

// TestRefEnv_KeyFormat: with the reference's Redis or memcached settings
// the keys are the reference's and expire with its jitter (300 s unless
// EXPIRATION_JITTER_MAX_SECONDS says otherwise), unless the operator opts
// out; without them, and for `sluice serve` alone, Sluice's.
func TestRefEnv_KeyFormat(t *testing.T) {
	for _, c := range []struct {
		name        string
		args        []string
		env         serveEnv
		format, jit string
	}{
		{"sluice alone", nil, serveEnv{}, "sluice", "0s"},
		{"REDIS_URL", nil, serveEnv{"REDIS_URL": "127.0.0.1:6379"}, "reference", "5m0s"},
		{"memcache", nil, serveEnv{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "127.0.0.1:11211"}, "reference", "5m0s"},
		{"jitter 0", nil, serveEnv{"REDIS_URL": "127.0.0.1:6379", "EXPIRATION_JITTER_MAX_SECONDS": "0"}, "reference", "0s"},
		{"memory", nil, serveEnv{"BACKEND_TYPE": "memory"}, "sluice", "0s"},
		{"opt out by SLUICE_KEY_FORMAT", nil, serveEnv{"REDIS_URL": "127.0.0.1:6379", "SLUICE_KEY_FORMAT": "sluice"}, "sluice", "5m0s"},
		{"opt out by flag", []string{"--key-format", "sluice"}, serveEnv{"REDIS_URL": "127.0.0.1:6379"}, "sluice", "5m0s"},
	} {
		fs, _, err := parseServe(t, c.args, c.env)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got, jit := flagValue(fs, "key-format"), flagValue(fs, "redis-expiry-jitter"); got != c.format || jit != c.jit {
			t.Errorf("%s: --key-format %s --redis-expiry-jitter %s, want %s and %s", c.name, got, jit, c.format, c.jit)
		}
		// The reference's placement of keys on memcached servers comes
		// with its memcached settings.
		if got, want := flagValue(fs, "memcache-modulo"), strconv.FormatBool(c.env["BACKEND_TYPE"] == "memcache"); got != want {
			t.Errorf("%s: --memcache-modulo %s, want %s", c.name, got, want)
		}
	}
	if _, _, err := parseServe(t, nil, serveEnv{"REDIS_URL": "127.0.0.1:6379", "EXPIRATION_JITTER_MAX_SECONDS": "-1"}); err == nil ||
		!strings.Contains(err.Error(), "EXPIRATION_JITTER_MAX_SECONDS") {
		t.Errorf("EXPIRATION_JITTER_MAX_SECONDS=-1: %v, want refused", err)
	}
}
