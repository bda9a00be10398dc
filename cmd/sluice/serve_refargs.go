package main

import (
	"flag"
	"strings"
)

// ignoredArgs are the arguments refArgs dropped: the names of the flags
// serve does not know, as --name, and how many positional arguments.
// Values are never kept: a dropped flag's value may be a secret.
type ignoredArgs struct {
	flags      []string
	positional int
}

// refArgs takes args as envoyproxy/ratelimit's binary would, which reads
// only its environment: it keeps the flags fs knows, each with its value
// (the next argument for a flag that is not boolean and has no =value),
// and -h or --help; it drops every other flag, with the argument after it
// when that is not itself a flag (its value, or a positional argument:
// dropped either way), and every positional argument, all of them after
// "--".
func refArgs(fs *flag.FlagSet, args []string) (kept []string, ignored ignoredArgs) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			ignored.positional += len(args) - i - 1
			break
		}
		if len(a) < 2 || a[0] != '-' {
			ignored.positional++
			continue
		}
		name, _, hasValue := strings.Cut(strings.TrimPrefix(a[1:], "-"), "=")
		f := fs.Lookup(name)
		switch {
		case f != nil:
			kept = append(kept, a)
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !hasValue && (!ok || !b.IsBoolFlag()) && i+1 < len(args) {
				i++
				kept = append(kept, args[i])
			}
		case name == "h" || name == "help":
			kept = append(kept, a)
		default:
			ignored.flags = append(ignored.flags, "--"+name)
			if !hasValue && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				i++
			}
		}
	}
	return kept, ignored
}
