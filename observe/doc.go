// Package observe makes a running Sluice visible: Prometheus metrics per
// rule and for the service, and the debug HTTP endpoints.
//
// Every collector registers on a registry the caller passes in, never the
// global one. Rules implements limiter.Observer; its hot path is a map
// lookup by rule pointer and a few atomic adds, with label values resolved
// once per rule, not per request. Descriptor values never become label
// values unless a rule opts in with detailed_metric or value_to_metric,
// and then at most MaxValuesPerRule distinct values per rule, the rest
// counted under "_other". docs/METRICS.md lists every metric.
package observe
