// Package observe makes a running Sluice visible: Prometheus metrics per
// rule and for the service, and the debug HTTP endpoints.
//
// Every collector registers on a registry the caller passes in, never the
// global one. Rules implements limiter.Observer; its hot path is a map
// lookup by rule pointer and a few atomic adds, with label values resolved
// once per rule, not per request. Descriptor values never become label
// values unless a rule opts in with detailed_metric or value_to_metric,
// and then at most MaxValuesPerRule distinct values per rule, the rest
// counted under "_other". Rules also counts counter resets
// (sluice_counter_resets_total, Rules.Reset). What Rules, RefStats and the
// sinks hold per rule is bounded by the config in force: a rule that
// leaves it is dropped at the reload, and one that stays (same domain and
// path) keeps its counts and its values' cap. docs/METRICS.md lists every metric.
//
// IgnoredFields counts the fields of received messages that Sluice does
// not use (sluice_config_ignored_fields_total for pushed configs,
// sluice_rls_ignored_fields_total for Envoy's requests), at most
// MaxIgnoredFields series each.
//
// RefStats writes envoyproxy/ratelimit's stats to Sinks: StatsdSink
// (statsd or DogStatsD lines, over UDP or TCP; over TCP a goroutine of its
// own, run by Start and stopped by Close, writes a bounded buffer so that
// a flush never waits for the network) and MappedSink (the reference's
// Prometheus series).
package observe
