package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ErrEmpty is wrapped by Load's error when a config directory holds no
// limits files, so that a server can choose to start without a config.
var ErrEmpty = errors.New("no *.yaml or *.yml files")

// Error is one problem in a limits file.
type Error struct {
	File string // the file's path as Load read it, or `resource "NAME"` pushed over xDS
	Line int    // 1-based; 0 when the problem is not tied to a line
	Path string // the descriptor's path, e.g. "descriptors[2].descriptors[0]"; "" for the file's top level
	Msg  string
}

// Error formats the problem as
// `config: limits/api.yaml:14: descriptors[2]: unknown unit "fortnight"`.
func (e Error) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(e.Line))
	}
	b.WriteString(": ")
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem Load found, in file order and, within a file, in
// line order. Get it from Load's error with errors.As and a *Errors.
type Errors struct {
	List []Error
}

// Error lists every problem, one per line.
func (es *Errors) Error() string {
	lines := make([]string, len(es.List))
	for i, e := range es.List {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// maxSummaryLine bounds each problem in a Summary.
const maxSummaryLine = 512

// Summary is err's message bounded to about limit bytes (at least 1024): its problems, one a line, each cut to 512 bytes, as many as fit,
// then how many more there are ("(12 more problems not shown)"). An xDS
// NACK carries it.
func Summary(err error, limit int) string {
	limit = max(limit, 1024)
	lines := strings.Split(err.Error(), "\n")
	room := limit - len(fmt.Sprintf("\n(%d more problems not shown)", len(lines)))
	var b strings.Builder
	for i, line := range lines {
		line = clip(line, maxSummaryLine)
		if i > 0 && b.Len()+1+len(line) > room {
			fmt.Fprintf(&b, "\n(%d more problems not shown)", len(lines)-i)
			break
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(line)
	}
	return b.String()
}

// clip cuts s to at most n bytes (on a character boundary), saying how
// long it was.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…(" + strconv.Itoa(len(s)) + " bytes)"
}
