package observe

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
)

// RefStats writes envoyproxy/ratelimit's stats, named as its gostats
// store names them, from the counters Sluice keeps anyway: the per-rule
// counts of Rules, the gRPC calls of GRPCMetrics and the config's reload
// history. Nothing is counted twice on the request path, except each
// unary call's duration in whole milliseconds (the reference's
// response_time timer), one atomic add.
//
// The stats (DOMAIN.KEY is the reference's stats key, Domain + "." +
// config.Rule.Path; a detailed rule's is DOMAIN.VALUE, VALUE as in
// Rules' value label):
//
//	ratelimit.service.rate_limit.DOMAIN.KEY.{total_hits,over_limit,near_limit,within_limit,shadow_mode,over_limit_with_local_cache}
//	ratelimit.service.config_load_success, ratelimit.service.config_load_error
//	ratelimit.service.call.should_rate_limit.redis_error (store failures), .service_error (invalid requests)
//	ratelimit_server.METHOD.total_requests, ratelimit_server.METHOD.response_time (timer, ms)
//
// Counters go out as the increase since the previous flush, and only
// when it is not zero, as gostats flushes them; timers as the number of
// calls of each duration. Tags (the reference's EXTRA_TAGS) are appended
// to every name as gostats serialises them: ".__KEY=VALUE", by key.
// Safe for concurrent use.
type RefStats struct {
	rules  *Rules
	grpc   *GRPCMetrics
	config ReloadStatuser
	tags   string

	mu      sync.Mutex
	flushes uint64                 // Flush calls so far
	last    map[string]uint64      // the service's counter totals at the previous flush
	byRule  map[*counters]*refRule // the live label sets of rules
}

// refRuleStats end the names of a label set's stats, in the order of
// refTotals.
var refRuleStats = [...]string{"total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode", "over_limit_with_local_cache"}

// refRule is one label set of Rules: its stat names, made once, and its
// totals at the previous flush. It is dropped at the first flush that
// does not see the label set (its rule left the config).
type refRule struct {
	names [len(refRuleStats)]string
	last  [len(refRuleStats)]uint64
	seen  uint64 // the last flush that saw it
}

// refTotals are c's counts in the order of refRuleStats.
func refTotals(c *counters) [len(refRuleStats)]uint64 {
	within, over := c.within.Load(), c.over.Load()
	return [...]uint64{within + over, over, c.near.Load(), within, c.shadow.Load(), c.local.Load()}
}

// Sink receives RefStats's stats at each flush.
type Sink interface {
	// Counter adds delta to the counter name.
	Counter(name string, delta uint64)
	// Timer records n calls that took ms milliseconds.
	Timer(name string, ms, n uint64)
	// Forget tells the sink that the counters named will not be written
	// again (their rule left the config): a sink that keeps something
	// per name drops it.
	Forget(names []string)
	// Flush ends a flush: the sink sends what it holds back. It returns
	// the errors met since the previous Flush.
	Flush() error
}

// RefStatsOptions configure RefStats. The zero value means defaults.
type RefStatsOptions struct {
	// Tags are added to every stat (the reference's EXTRA_TAGS).
	Tags map[string]string
}

// NewRefStats reads rules, grpc and config (any may be nil) at each
// Flush. It calls grpc.TrackMillis: make it before serving.
func NewRefStats(rules *Rules, grpc *GRPCMetrics, config ReloadStatuser, opts RefStatsOptions) *RefStats {
	if grpc != nil {
		grpc.TrackMillis()
	}
	return &RefStats{rules: rules, grpc: grpc, config: config, tags: serializeTags(opts.Tags),
		last: map[string]uint64{}, byRule: map[*counters]*refRule{}}
}

// Run flushes to sinks every interval until ctx is done, then once more.
// It returns nil; a sink's errors go to report (if not nil), at most one
// a minute.
func (s *RefStats) Run(ctx context.Context, every time.Duration, report func(error), sinks ...Sink) error {
	t := time.NewTicker(every)
	defer t.Stop()
	var lastReport time.Time
	for {
		var done bool
		select {
		case <-ctx.Done():
			done = true
		case <-t.C:
		}
		if err := s.Flush(sinks...); err != nil && report != nil && time.Since(lastReport) >= time.Minute {
			report(err)
			lastReport = time.Now()
		}
		if done {
			return nil
		}
	}
}

// Flush sends what changed since the previous Flush to every sink, and
// tells them to forget the stats of rules that left the config since.
// Counts a rule took between the previous flush and its leaving are not
// sent.
func (s *RefStats) Flush(sinks ...Sink) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushes++
	send := func(name string, delta uint64) {
		if delta == 0 {
			return
		}
		for _, k := range sinks {
			k.Counter(name, delta)
		}
	}
	counter := func(name string, total uint64) {
		send(name, total-s.last[name])
		s.last[name] = total
	}
	if s.rules != nil {
		s.flushRules(send, sinks)
		counter("ratelimit.service.call.should_rate_limit.redis_error"+s.tags, s.rules.failed.Load())
	}
	if s.config != nil {
		st := s.config.Status()
		counter("ratelimit.service.config_load_success"+s.tags, st.Successes)
		counter("ratelimit.service.config_load_error"+s.tags, st.Failures)
	}
	if s.grpc != nil {
		s.flushGRPC(counter, sinks)
	}
	var errs []error
	for _, k := range sinks {
		errs = append(errs, k.Flush())
	}
	return errors.Join(errs...)
}

// flushRules sends the per-rule counters and drops the label sets Rules
// no longer holds, telling sinks to forget their names.
func (s *RefStats) flushRules(send func(string, uint64), sinks []Sink) {
	s.rules.eachCounters(func(c *counters) {
		k := s.rule(c)
		k.seen = s.flushes
		for i, total := range refTotals(c) {
			send(k.names[i], total-k.last[i])
			k.last[i] = total
		}
	})
	var gone []string
	for c, k := range s.byRule {
		if k.seen != s.flushes {
			delete(s.byRule, c)
			gone = append(gone, k.names[:]...)
		}
	}
	if len(gone) == 0 {
		return
	}
	// Another label set may write the same names (sanitizing made them
	// alike): those stay.
	live := make(map[string]bool, len(refRuleStats)*len(s.byRule))
	for _, k := range s.byRule {
		for _, n := range k.names {
			live[n] = true
		}
	}
	gone = slices.DeleteFunc(gone, func(n string) bool { return live[n] })
	slices.Sort(gone)
	gone = slices.Compact(gone)
	for _, k := range sinks {
		k.Forget(gone)
	}
}

// flushGRPC sends the unary methods' calls and durations. Methods of the
// same name in different services add up, as in the reference, which
// names them by method alone.
func (s *RefStats) flushGRPC(counter func(string, uint64), sinks []Sink) {
	calls := map[string]uint64{}
	var invalid uint64
	type timing struct {
		name string
		ms   *millisCounts
	}
	var timings []timing
	s.grpc.eachUnary(func(m *methodSeries) {
		method := m.labels[2]
		calls[method] += counterValue(m.started)
		if m.labels[1] == "envoy.service.ratelimit.v3.RateLimitService" && method == "ShouldRateLimit" {
			if c := m.handled[codes.InvalidArgument].c.Load(); c != nil {
				invalid += counterValue(*c)
			}
		}
		if m.ms != nil {
			timings = append(timings, timing{"ratelimit_server." + method + ".response_time" + s.tags, m.ms})
		}
	})
	counter("ratelimit.service.call.should_rate_limit.service_error"+s.tags, invalid)
	methods := make([]string, 0, len(calls))
	for m := range calls {
		methods = append(methods, m)
	}
	sort.Strings(methods)
	for _, m := range methods {
		counter("ratelimit_server."+m+".total_requests"+s.tags, calls[m])
	}
	for _, t := range timings {
		for ms := range t.ms {
			if n := t.ms[ms].Swap(0); n > 0 {
				for _, k := range sinks {
					k.Timer(t.name, uint64(ms), n)
				}
			}
		}
	}
}

// rule returns the state of c's label set, made at its first flush.
func (s *RefStats) rule(c *counters) *refRule {
	if k := s.byRule[c]; k != nil {
		return k
	}
	domain, rule, value := c.labels[0], c.labels[1], c.labels[2]
	key := domain + "." + rule
	switch value {
	case "":
	case OtherValue:
		key += "." + OtherValue
	default:
		key = domain + "." + value
	}
	k := &refRule{}
	p := "ratelimit.service.rate_limit." + sanitizeStatName(key) + "."
	for i, n := range refRuleStats {
		k.names[i] = p + n + s.tags
	}
	s.byRule[c] = k
	return k
}

// dottedQuad matches an IPv4 address in a stats key.
var dottedQuad = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// sanitizeStatName makes a stats key as the reference does: ':' and '|'
// (statsd's separators) become '_', and so do the dots of IPv4
// addresses, so that an address stays one component of the name. Unlike
// the reference, control characters (a newline would end the statsd line
// and start another, of the request's choosing) become '_' too.
func sanitizeStatName(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == ':' || r == '|' || unicode.IsControl(r) {
			return '_'
		}
		return r
	}, s)
	return dottedQuad.ReplaceAllStringFunc(s, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
}

// serializeTags writes tags as gostats appends them to a stat's name:
// ".__KEY=VALUE" sorted by key, with '.', ':' and '|' in values made '_';
// empty keys and values are left out.
func serializeTags(tags map[string]string) string {
	keys := make([]string, 0, len(tags))
	for k, v := range tags {
		if k != "" && v != "" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(".__")
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(strings.NewReplacer(".", "_", ":", "_", "|", "_").Replace(tags[k]))
	}
	return b.String()
}

// ParseTags reads tags written as the reference's EXTRA_TAGS:
// "key:value,key:value".
func ParseTags(s string) (map[string]string, error) {
	tags := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, ":")
		if !ok || k == "" || strings.ContainsAny(k, ".|=#@ ") || strings.ContainsFunc(kv, unicode.IsControl) {
			return nil, fmt.Errorf("observe: tag %q: want key:value, the key without . | = # @ or spaces, no control characters", kv)
		}
		tags[k] = v
	}
	return tags, nil
}

// counterValue reads a Prometheus counter.
func counterValue(c prometheus.Counter) uint64 {
	var m dto.Metric
	if c.Write(&m) != nil || m.Counter == nil {
		return 0
	}
	return uint64(m.Counter.GetValue())
}
