package redact

import (
	"errors"
	"net/url"
	"strconv"
	"strings"
)

// Mask replaces a secret.
const Mask = "xxxxx"

// Addr returns s with the password of its user information, if any,
// replaced by Mask: redis://user:secret@host:6379/0 becomes
// redis://user:xxxxx@host:6379/0. User information without a password
// (redis://secret@host, host-less forms such as secret@host:6379) may be a
// token and is replaced whole. It does not parse s as a URL, so that a
// malformed one (the kind an error message quotes) is redacted too: the
// user information runs from after "scheme://" (or the start) to the last
// '@'.
func Addr(s string) string {
	at := strings.LastIndexByte(s, '@')
	if at < 0 {
		return s
	}
	start := userStart(s, at)
	user, _, hasPass := strings.Cut(s[start:at], ":")
	if !hasPass {
		user = Mask
	} else {
		user += ":" + Mask
	}
	return s[:start] + user + s[at:]
}

// userStart is where the user information ending at at begins: after
// "scheme://" if s has a scheme (which holds no '@'), else at 0.
func userStart(s string, at int) int {
	if i := strings.Index(s, "://"); i >= 0 && i < at && !strings.Contains(s[:i], "@") {
		return i + len("://")
	}
	return 0
}

// Addrs is Addr of each item of a comma-separated list (Redis Cluster
// seeds, sentinels).
func Addrs(s string) string {
	if !strings.Contains(s, "@") {
		return s
	}
	items := strings.Split(s, ",")
	for i, it := range items {
		items[i] = Addr(it)
	}
	return strings.Join(items, ",")
}

// Kind is how a flag's value is redacted.
type Kind int

const (
	// Plain values are shown as they are.
	Plain Kind = iota
	// Secret values (passwords, headers carrying tokens) are replaced by
	// Mask.
	Secret
	// Address values (URLs, lists of host:port) lose their passwords
	// (Addrs).
	Address
)

// Args returns a copy of a command line (os.Args: the program, then its
// arguments) with the values of its flags redacted as kind says of each
// flag name (without dashes). Flags are -name=value, --name=value, or
// -name value (a flag whose kind is not Plain takes a value); arguments
// after "--" are not flags.
func Args(args []string, kind func(name string) Kind) []string {
	out := make([]string, len(args))
	copy(out, args)
	for i := 1; i < len(out); i++ {
		a := out[i]
		if a == "--" {
			break
		}
		if len(a) < 2 || a[0] != '-' {
			continue
		}
		name := strings.TrimPrefix(a[1:], "-")
		name, value, inline := strings.Cut(name, "=")
		k := kind(name)
		if k == Plain {
			continue
		}
		if inline {
			out[i] = a[:len(a)-len(value)] + redactValue(value, k)
		} else if i+1 < len(out) {
			i++
			out[i] = redactValue(out[i], k)
		}
	}
	return out
}

func redactValue(v string, k Kind) string {
	if k == Secret {
		if v == "" {
			return v
		}
		return Mask
	}
	return Addrs(v)
}

// Error returns an error whose text describes err, an error about raw (a
// URL or address that may hold credentials), without raw's user
// information; errors.Is and errors.As still see err. The text is built
// from parts, never by replacing raw inside err's text: a message may
// quote raw escaped (url.Error quotes with %q, so a password with '"' or
// '\' is printed escaped) where no replacement would find it. A
// *url.Error of raw becomes its operation, Addr(raw) and its cause; any
// other error is kept when its text holds the user information in none of
// the forms it could be printed in, else replaced by a text that names
// Addr(raw) only.
func Error(err error, raw string) error {
	if err == nil || raw == "" || Addr(raw) == raw {
		return err
	}
	var ue *url.Error
	if errors.As(err, &ue) && ue.URL == raw {
		return &redacted{err: err, msg: ue.Op + " " + strconv.Quote(Addr(raw)) + ": " + Error(ue.Err, raw).Error()}
	}
	if leaks(err.Error(), raw) {
		return &redacted{err: err, msg: "an error about " + Addr(raw) + " (its text, which shows the credentials, is not shown)"}
	}
	return err
}

// leaks reports whether msg holds the user information of raw (what
// Addr hides) as written, unescaped, or escaped as %q or a URL would.
func leaks(msg, raw string) bool {
	at := strings.LastIndexByte(raw, '@')
	if at < 0 {
		return false
	}
	info := raw[userStart(raw, at):at]
	if _, pass, ok := strings.Cut(info, ":"); ok {
		info = pass
	}
	forms := []string{info}
	if u, err := url.PathUnescape(info); err == nil {
		forms = append(forms, u)
	}
	for _, f := range forms[:len(forms):len(forms)] {
		q := strconv.Quote(f)
		forms = append(forms, q[1:len(q)-1], url.QueryEscape(f), url.PathEscape(f))
	}
	for _, f := range forms {
		if f != "" && strings.Contains(msg, f) {
			return true
		}
	}
	return false
}

type redacted struct {
	err error
	msg string
}

func (e *redacted) Error() string { return e.msg }
func (e *redacted) Unwrap() error { return e.err }
