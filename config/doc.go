// Package config reads envoyproxy/ratelimit limits files, compiles them into
// an immutable Table and matches request descriptors to rules.
//
// Load reads a file, or every *.yaml and *.yml file of a directory (dotfiles
// and subdirectories are skipped), validates all of it and reports every
// problem with its file, line and descriptor path. Table.Match walks a
// descriptor down the compiled tree with map lookups only and appends the
// rule's counter key to a caller's buffer; it allocates nothing else.
//
// A Reloader keeps the current Table behind an atomic pointer: Reload parses
// everything, then swaps the pointer, so a request sees the old table or the
// new one, never a mix; a bad config keeps the old table in force. Run
// watches the config directory (not the files, so Kubernetes ConfigMap
// symlink swaps are seen) and reloads after a short debounce.
//
// Files are one Source of configs; an xDS server is another (package
// config/xds): CompileRateLimitConfigs compiles the RateLimitConfig
// resources it pushes into the same Table, and every source applies its
// configs with Reloader.Update, so reload status, hooks and metrics are
// the same whatever the source.
//
// An Overlay (LoadOverlay) adds Sluice's own fields to pushed rules by
// domain and descriptor path. It is one more input of the same compile
// (Options.Overlay), not a second compiler: each matched rate_limit is
// compiled with the overlay's fields as a file's would be. A Reloader
// holds the overlay in force (Reloader.LoadOverlay, RunOverlay) and
// compiles its config again when the overlay changes. Options.DefaultAlgorithm
// is the algorithm of rules that name none.
//
// docs/CONFIG.md describes the file format, Sluice's extensions and the
// counter key format.
package config
