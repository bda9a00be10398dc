// Command release packs Sluice's release archives and their checksums so
// that two runs on the same commit give the same bytes; `make release`
// and `make release-check` run it after building the binaries and SBOMs
// (see docs/RELEASING.md).
//
//	go run ./internal/release archive -mtime SECONDS -o OUT.tar.gz|OUT.zip DIR
//	go run ./internal/release sums -o SHA256SUMS FILE...
//
// archive packs the regular files of DIR under one top-level directory
// named after DIR, in name order, every entry with the modification time
// SECONDS (the commit's time, SOURCE_DATE_EPOCH), owner and group 0,
// mode 0755 for executables and 0644 for the rest whatever the umask of
// the checkout; a .tar.gz is USTAR in a gzip stream with no name and no
// time in its header, a .zip is deflated.
//
// sums writes FILE's SHA-256 sums in the format of `sha256sum` (so
// `sha256sum -c SHA256SUMS` verifies them), by base name, in name order.
//
// Its test TestRelease checks a dist directory that `make release` or
// `make release-check` made (SLUICE_RELEASE_DIST): the checksums, each
// archive's entries, the version each binary prints, and each SBOM's
// modules against the binary's and the build list's.
package main
