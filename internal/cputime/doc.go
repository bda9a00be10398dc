// Package cputime reads the CPU time this process has used, for the load
// generator's and the benchmarks' CPU per request.
package cputime
