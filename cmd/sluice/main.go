// Command sluice is the Sluice rate-limit service and its tools.
//
// Each subcommand lives in its own file and registers itself from init:
// serve, check, query, bench, version.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// command is one `sluice NAME` subcommand. run returns the process exit code.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

var commands = map[string]command{}

func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("sluice: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Main(ctx, mainArgs(os.Args), os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// mainArgs returns the subcommand and its arguments from the process's
// argv. Installed as `ratelimit`, envoyproxy/ratelimit's binary name (the
// image has /bin/ratelimit for the Deployments that Envoy Gateway, Envoy
// AI Gateway and the reference's own manifests run), the binary behaves
// like the reference's, which reads only its environment: unless its
// first argument names a subcommand or asks for help, it runs the
// ratelimit command, serve ignoring the arguments it does not know.
func mainArgs(argv []string) []string {
	if len(argv) == 0 {
		return nil
	}
	args := argv[1:]
	if strings.TrimSuffix(filepath.Base(argv[0]), ".exe") != "ratelimit" {
		return args
	}
	if len(args) > 0 {
		if _, ok := commands[args[0]]; ok || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
			return args
		}
	}
	return append([]string{"ratelimit"}, args...)
}

// Main runs the subcommand named by args[0] and returns the exit code.
// ctx is cancelled on SIGINT/SIGTERM.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "sluice: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	return c.run(ctx, args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: sluice COMMAND [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'sluice COMMAND -h' for a command's flags.")
}
