// Package docslinks holds no code: its test checks that every relative
// link of the repository's Markdown files (README, CHANGELOG,
// CONTRIBUTING, SECURITY, docs/ and the rest that git tracks) names a
// file that exists and, when it has a #fragment into a Markdown file, a
// heading of that file, as GitHub derives the anchors.
package docslinks
