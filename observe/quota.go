package observe

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/quota"
)

// QuotaStatser reports the rate limit quota service's state;
// *quota.Service is one.
type QuotaStatser interface {
	Stats() quota.Stats
	Rules() []quota.RuleStat
}

// RegisterQuota registers the RLQS metrics, read from q at each scrape.
// Per-rule series are labelled by domain and rule path only (one series
// per configured rule at most).
func RegisterQuota(reg prometheus.Registerer, q QuotaStatser) error {
	return reg.Register(quotaCollector{q})
}

var (
	rlqsStreamsDesc  = prometheus.NewDesc("sluice_rlqs_streams", "Open RLQS streams (proxies).", nil, nil)
	rlqsBucketsDesc  = prometheus.NewDesc("sluice_rlqs_buckets", "Buckets the open RLQS streams are subscribed to.", nil, nil)
	rlqsReportsDesc  = prometheus.NewDesc("sluice_rlqs_reports_total", "RLQS usage report messages received.", nil, nil)
	rlqsUsagesDesc   = prometheus.NewDesc("sluice_rlqs_bucket_reports_total", "Bucket usage reports received (several per message).", nil, nil)
	rlqsRejectedDesc = prometheus.NewDesc("sluice_rlqs_rejected_total",
		"Malformed RLQS messages, and streams and reports past a cap (each ends its stream).", nil, nil)
	rlqsOverCapDesc = prometheus.NewDesc("sluice_rlqs_over_cap_total",
		"RLQS streams and reports refused with RESOURCE_EXHAUSTED, by cap (streams, buckets, stream_buckets, bucket_keys).", []string{"cap"}, nil)
	rlqsPushedDesc = prometheus.NewDesc("sluice_rlqs_assignments_total",
		"Bucket actions sent to proxies, by strategy (allow_all, deny_all, requests_per_time_unit, token_bucket, abandon).", []string{"strategy"}, nil)
	rlqsFleetDesc = prometheus.NewDesc("sluice_rlqs_fleet_errors_total",
		"Exchanges of demand with the other replicas (Redis) that failed in whole or in part; shares then use the last known demand.", nil, nil)
	rlqsClaimErrorsDesc = prometheus.NewDesc("sluice_rlqs_fleet_claim_errors_total",
		"Claims of one limit's part that failed in an exchange with the other replicas; only those limits use their last claim.", nil, nil)
	rlqsDeferredDesc = prometheus.NewDesc("sluice_rlqs_fleet_claims_deferred_total",
		"Claims of a limit's part left to a later interval because more limits than --rlqs-max-claims were due.", nil, nil)
	rlqsPanicsDesc = prometheus.NewDesc("sluice_rlqs_panics_total",
		"Panics recovered while recomputing the RLQS shares (each loses one interval).", nil, nil)
	rlqsRuleLabels     = []string{"domain", "rule"}
	rlqsRuleBucketDesc = prometheus.NewDesc("sluice_rlqs_rule_buckets",
		"This replica's RLQS buckets under the rule, as of the last interval.", rlqsRuleLabels, nil)
	rlqsDemandDesc = prometheus.NewDesc("sluice_rlqs_rule_demand",
		"Demand (allowed + denied) this replica's proxies reported for the rule, in requests per the rule's unit.", rlqsRuleLabels, nil)
	rlqsShareDesc = prometheus.NewDesc("sluice_rlqs_rule_assigned",
		"Quota this replica assigned its proxies under the rule, in requests per the rule's unit.", rlqsRuleLabels, nil)
)

type quotaCollector struct{ q QuotaStatser }

func (c quotaCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{rlqsStreamsDesc, rlqsBucketsDesc, rlqsReportsDesc, rlqsUsagesDesc, rlqsRejectedDesc,
		rlqsOverCapDesc, rlqsPushedDesc, rlqsFleetDesc, rlqsClaimErrorsDesc, rlqsDeferredDesc, rlqsPanicsDesc,
		rlqsRuleBucketDesc, rlqsDemandDesc, rlqsShareDesc} {
		ch <- d
	}
}

func (c quotaCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.q.Stats()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(rlqsStreamsDesc, float64(s.Streams))
	gauge(rlqsBucketsDesc, float64(s.Buckets))
	counter(rlqsReportsDesc, s.Reports)
	counter(rlqsUsagesDesc, s.Usages)
	counter(rlqsRejectedDesc, s.Rejected)
	counter(rlqsFleetDesc, s.FleetErrors)
	counter(rlqsClaimErrorsDesc, s.ClaimErrors)
	counter(rlqsDeferredDesc, s.ClaimsDeferred)
	counter(rlqsPanicsDesc, s.Panics)
	for c := quota.CapStreams; c <= quota.CapBucketKeys; c++ {
		counter(rlqsOverCapDesc, s.Capped[c], c.String())
	}
	for k := quota.AllowAll; k <= quota.Abandon; k++ {
		counter(rlqsPushedDesc, s.Pushed[k], k.String())
	}
	// Two rules can share a path (key "a_b" value "c" and key "a" value
	// "b_c" are both "a_b_c"): their figures add up in one series, as the
	// per-rule counters do, since a series may appear once per scrape.
	type sum struct {
		domain, path           string
		buckets, demand, share float64
	}
	var sums []sum
	at := map[[2]string]int{}
	for _, r := range c.q.Rules() {
		k := [2]string{r.Rule.Domain, r.Rule.Path}
		i, ok := at[k]
		if !ok {
			i = len(sums)
			at[k] = i
			sums = append(sums, sum{domain: k[0], path: k[1]})
		}
		sums[i].buckets += float64(r.Buckets)
		sums[i].demand += r.Demand
		sums[i].share += r.Share
	}
	for _, r := range sums {
		gauge(rlqsRuleBucketDesc, r.buckets, r.domain, r.path)
		gauge(rlqsDemandDesc, r.demand, r.domain, r.path)
		gauge(rlqsShareDesc, r.share, r.domain, r.path)
	}
}
