package docslinks

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// markdownFiles lists the Markdown files git tracks, relative to the
// repository's root.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	out, err := exec.Command("git", "-C", root, "ls-files", "*.md").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (the test reads a git checkout)", err)
	}
	return strings.Fields(string(out))
}

var (
	fence   = regexp.MustCompile("^\\s*(```|~~~)")
	heading = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	// An inline link or image: [text](target) or [text](target "title").
	link = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	// A reference definition: [label]: target.
	refDef = regexp.MustCompile(`^\s*\[[^\]]+\]:\s+(\S+)`)
	// Code spans hold examples, not links.
	codeSpan = regexp.MustCompile("`[^`]*`")
	// What a heading's anchor leaves out: code marks, bold marks, a
	// link's target (its text stays).
	markup = regexp.MustCompile("`|\\*\\*|\\[([^\\]]*)\\]\\([^)]*\\)")
)

// slug is GitHub's anchor of a heading: lower case, the characters other
// than letters, digits, spaces, hyphens and underscores dropped, spaces
// made hyphens.
func slug(h string) string {
	h = markup.ReplaceAllStringFunc(h, func(m string) string {
		if strings.HasPrefix(m, "[") {
			return m[1:strings.Index(m, "]")]
		}
		return ""
	})
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// parse returns a Markdown file's anchors and its links with their line
// numbers, outside code blocks and code spans.
func parse(text string) (anchors map[string]bool, links map[int][]string) {
	anchors, links = map[string]bool{}, map[int][]string{}
	seen := map[string]int{}
	inFence := false
	for i, line := range strings.Split(text, "\n") {
		if fence.MatchString(line) {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		if m := heading.FindStringSubmatch(line); m != nil {
			s := slug(m[1])
			if n := seen[s]; n > 0 {
				anchors[s+"-"+strconv.Itoa(n)] = true
			} else {
				anchors[s] = true
			}
			seen[s]++
		}
		plain := codeSpan.ReplaceAllString(line, "")
		for _, m := range link.FindAllStringSubmatch(plain, -1) {
			links[i+1] = append(links[i+1], m[1])
		}
		if m := refDef.FindStringSubmatch(plain); m != nil {
			links[i+1] = append(links[i+1], m[1])
		}
	}
	return anchors, links
}

// TestLinks checks every relative link of every tracked Markdown file.
func TestLinks(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	files := markdownFiles(t, root)
	if len(files) < 10 {
		t.Fatalf("%d Markdown files found, want the repository's", len(files))
	}
	anchorsOf := map[string]map[string]bool{}
	linksOf := map[string]map[int][]string{}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		anchorsOf[f], linksOf[f] = parse(string(b))
	}
	checked := 0
	for _, f := range files {
		for line, targets := range linksOf[f] {
			for _, target := range targets {
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				path, frag, _ := strings.Cut(target, "#")
				dest := f
				if path != "" {
					dest = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(f), path)))
					if _, err := os.Stat(filepath.Join(root, dest)); err != nil {
						t.Errorf("%s:%d: %s: no such file", f, line, target)
						continue
					}
				}
				if frag == "" || !strings.HasSuffix(dest, ".md") {
					continue
				}
				if a, ok := anchorsOf[dest]; !ok {
					t.Errorf("%s:%d: %s: %s is not a tracked Markdown file", f, line, target, dest)
				} else if !a[frag] {
					t.Errorf("%s:%d: %s: %s has no heading #%s", f, line, target, dest, frag)
				}
			}
		}
	}
	t.Logf("%d relative links in %d files", checked, len(files))
	if checked < 50 {
		t.Errorf("%d relative links checked, want the repository's", checked)
	}
}
