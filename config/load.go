package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	// time_zone names resolve the same on every host, the image (FROM
	// scratch, no /usr/share/zoneinfo) included; a host's zoneinfo (or
	// $ZONEINFO) is still read first where there is one.
	_ "time/tzdata"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/store"
)

// Limits that keep a hostile file (deep nesting, YAML alias bombs) from
// exhausting the stack or the CPU.
const (
	maxDepth     = 64
	maxExpansion = 1 << 16 // descriptors and merged mappings beyond the file's own nodes, from aliases
	maxErrors    = 1000    // per Load
)

// readFiles reads files; a file that cannot be read is an Error of its
// own (the cause without the path, which Error names).
func readFiles(files []string) ([]source, []Error) {
	srcs := make([]source, 0, len(files))
	var readErrs []Error
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			readErrs = append(readErrs, Error{File: name, Msg: err.Error()})
			continue
		}
		srcs = append(srcs, source{name: name, id: filepath.Base(name), data: data})
	}
	return srcs, readErrs
}

// Load reads and compiles the limits files at path: a file, or every
// *.yaml and *.yml file directly inside a directory. Dotfiles (Kubernetes'
// ..data) and subdirectories are not read; symbolic links are followed. A
// directory without limits files is an error wrapping ErrEmpty. A config
// that does not validate returns Errors listing every problem of every
// file.
func Load(path string, opts Options) (*Table, error) {
	files, err := listFiles(path)
	if err != nil {
		return nil, err
	}
	srcs, readErrs := readFiles(files)
	return compile(srcs, opts, readErrs)
}

// source is one limits document: a file, or a resource pushed over xDS.
type source struct {
	name string     // the document in errors: a file's path, `resource "NAME"`
	id   string     // the document in the hash: a file's base name, a resource's name
	data []byte     // the content, hashed; a file's is parsed
	root *yaml.Node // the content as YAML nodes when it is not a file (xDS)
}

// compile builds a Table from documents; errs holds problems found before
// parsing (unreadable files).
func compile(srcs []source, opts Options, errs []Error) (*Table, error) {
	l := &loader{opts: opts, max: opts.maxValueBytes(), domains: map[string]*domain{}, errs: errs}
	h := sha256.New()
	// The same files under another overlay or default algorithm are
	// another config.
	if o := opts.Overlay; o != nil {
		n := len(o.entries)
		l.ov = &overlayState{o: o, matched: make([]bool, n), applied: make([]bool, n), problems: make([]*OverlayMiss, n)}
		h.Write([]byte("overlay " + o.hash + "\n"))
	}
	if a := opts.DefaultAlgorithm; a != 0 && a != store.FixedWindow {
		h.Write([]byte("default algorithm " + a.String() + "\n"))
	}
	for _, src := range srcs {
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(src.id))))
		h.Write([]byte(src.id))
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(src.data))))
		h.Write(src.data)
		if src.root != nil {
			l.budget = countNodes(src.root)
			l.doc(src.name, src.root)
		} else {
			l.file(src.name, src.data)
		}
	}
	l.checkReplaces()
	if len(l.errs) > 0 {
		sortErrors(l.errs)
		return nil, &Errors{List: l.errs}
	}
	t := &Table{domains: l.domains, max: l.max, hash: hex.EncodeToString(h.Sum(nil)), files: len(srcs)}
	if l.ov != nil {
		t.overlay = l.ov.report()
	}
	for name := range l.domains {
		t.names = append(t.names, name)
	}
	slices.Sort(t.names)
	for _, name := range t.names {
		t.rules = append(t.rules, l.domains[name].rules...)
	}
	return t, nil
}

// sortErrors orders problems by file, then line.
func sortErrors(errs []Error) {
	slices.SortStableFunc(errs, func(a, b Error) int {
		if c := strings.Compare(a.File, b.File); c != 0 {
			return c
		}
		return a.Line - b.Line
	})
}

// listFiles returns the files Load reads at path, sorted.
func listFiles(path string) ([]string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if !fi.IsDir() {
		return []string{path}, nil
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	var files []string
	for _, e := range ents {
		name := e.Name()
		if ext := filepath.Ext(name); strings.HasPrefix(name, ".") || ext != ".yaml" && ext != ".yml" {
			continue
		}
		p := filepath.Join(path, name)
		st, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // a dangling symlink, e.g. in the middle of a ConfigMap swap
		}
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		if st.Mode().IsRegular() {
			files = append(files, p)
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("config: %s: %w", path, ErrEmpty)
	}
	return files, nil
}

// loader compiles limits documents into domains, collecting every problem
// it finds. Its methods live by concern:
//
//   - load.go: the entry points, a file's documents and its top level
//     (domain, descriptors);
//   - descriptor.go: the tree walk, one descriptor's key, value, flags and
//     place in its level;
//   - limit.go: one rate_limit's fields as the reference has them (unit,
//     requests_per_unit, unlimited, name, replaces) and its compiled
//     store rule;
//   - extensions.go: Sluice's own keys (rate_limits, algorithm,
//     unit_multiplier, burst, calendar and time_zone);
//   - metadata.go: a descriptor's metadata, read as yaml.v2 reads it;
//   - yaml.go: reading YAML nodes as the reference's yaml.v2 does
//     (fields, strings, booleans, integers).
type loader struct {
	opts      Options
	max       int
	errs      []Error
	domains   map[string]*domain
	budget    int // descriptors left for the current file
	zones     map[string]*time.Location
	calendars map[calendarKey]*store.Calendar
	ov        *overlayState // nil without an overlay
	trail     []Entry       // the (key, value) path to the descriptor being compiled
}

func (l *loader) errorf(file string, line int, path, format string, args ...any) {
	switch {
	case len(l.errs) < maxErrors:
		l.errs = append(l.errs, Error{File: file, Line: line, Path: path, Msg: fmt.Sprintf(format, args...)})
	case len(l.errs) == maxErrors:
		l.errs = append(l.errs, Error{File: file, Line: line, Path: path, Msg: fmt.Sprintf("more than %d errors; the rest are not shown", maxErrors)})
	}
}

// file parses one limits file into its domain.
func (l *loader) file(name string, data []byte) {
	if root := l.parse(name, data); root != nil {
		l.doc(name, root)
	}
}

// parse reads one YAML document's root node; nil (the problem reported)
// if the file is empty, does not parse or holds a second document.
func (l *loader) parse(name string, data []byte) *yaml.Node {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if err == io.EOF {
			l.errorf(name, 0, "", "file is empty; want a domain and descriptors")
		} else {
			l.syntaxError(name, err)
		}
		return nil
	}
	// Without aliases no file visits more descriptors than it has nodes;
	// aliases may add a bounded number.
	l.budget = countNodes(&doc) + maxExpansion
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case err == io.EOF:
	case err != nil:
		l.syntaxError(name, err)
		return nil
	case len(extra.Content) > 0 && extra.Content[0].ShortTag() != "!!null":
		l.errorf(name, extra.Line, "", "a second YAML document; put each domain in its own file")
		return nil
	}
	if len(doc.Content) == 0 {
		l.errorf(name, 0, "", "file is empty; want a domain and descriptors")
		return nil
	}
	return resolve(doc.Content[0])
}

// topLevel reads a document's top level (of a limits file or an
// overlay): a mapping of domain, not empty, and descriptors. It reports
// an error and false when it is not one.
func (l *loader) topLevel(name string, root *yaml.Node) (fields map[string]field, domain string, ok bool) {
	if root.Kind != yaml.MappingNode {
		l.errorf(name, root.Line, "", "want a mapping with domain and descriptors, got %s", describe(root))
		return nil, "", false
	}
	fields = l.fields(name, "", "", root, 0, "domain", "descriptors")
	df, ok := fields["domain"]
	if !ok {
		l.errorf(name, root.Line, "", "missing domain")
		return nil, "", false
	}
	if domain, ok = l.str(name, "", "domain", df); !ok {
		return nil, "", false
	}
	if domain == "" {
		l.errorf(name, df.val.Line, "", "domain is empty")
		return nil, "", false
	}
	return fields, domain, true
}

// doc compiles one document's top level into its domain.
func (l *loader) doc(name string, root *yaml.Node) {
	fields, dname, ok := l.topLevel(name, root)
	if !ok {
		return
	}
	line := fields["domain"].val.Line
	d := l.domains[dname]
	switch {
	case d == nil:
		d = &domain{part: escapePart(dname, l.max), root: &level{keys: map[string]*keyNodes{}}, file: name, line: line}
		l.domains[dname] = d
	case !l.opts.MergeDomains:
		l.errorf(name, line, "", "domain %q is also defined at %s (merge them with --merge-domains)", dname, at(d.file, d.line))
		// Still validate the descriptors, into a domain of their own.
		d = &domain{root: &level{keys: map[string]*keyNodes{}}}
	}
	if f, ok := fields["descriptors"]; ok {
		l.descriptors(name, dname, d, d.root, f.val, "", "", 1)
	}
}

// syntaxError reports a YAML parse error at the line yaml names, if any.
func (l *loader) syntaxError(file string, err error) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, after, ok := strings.Cut(rest, ": "); ok {
			if n, err := strconv.Atoi(num); err == nil {
				line, msg = n, after
			}
		}
	}
	l.errorf(file, line, "", "invalid YAML: %s", msg)
}

// at locates a definition: file:line, or the file (an xDS resource) when
// there is no line.
func at(file string, line int) string {
	if line <= 0 {
		return file
	}
	return file + ":" + strconv.Itoa(line)
}
