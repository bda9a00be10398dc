// Package ui serves Sluice's status page: a read-only web UI embedded in
// the binary (go:embed; plain HTML, CSS and JavaScript, no network needed)
// that shows the build, the store, the config source and its last load,
// every rule of the config table with its live traffic, and a "how it
// works" demo of the token bucket and the fixed window.
//
// The page and its small JSON endpoints use relative URLs only, so they
// work at the root of the HTTP port or behind a reverse proxy's path
// prefix. The live traffic comes from the per-rule counters of
// observe.Rules (the ones /metrics exports), sampled once a second by
// Traffic, which holds the rules of the config in force only; the JSON
// never carries a descriptor value of real traffic
// unless the rule opted into detailed_metric (or value_to_metric), and
// every list in it is bounded. The demo runs on a private limiter with a
// memory store and a built-in config of its own, served by the same
// server.HTTP /v1/check handler as production requests. A "Look up a
// client" form shows one descriptor's counters through the server's
// /v1/counters (Options.Counters), forwarded under ui/counters/; it
// offers a reset, which needs the admin token, when the server resets
// counters. What the operator types is posted, never put in a URL or
// stored. docs/UI.md describes the page.
package ui
