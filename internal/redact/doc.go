// Package redact hides credentials in the strings Sluice shows: command
// lines (/debug/pprof/cmdline), server addresses and URLs in logs, error
// messages and the status page.
package redact
