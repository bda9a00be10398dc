package ui

import (
	"maps"
	"slices"

	"github.com/sluicehq/sluice/quota"
)

// maxBucketValueBytes bounds each key and value of a bucket id the rlqs
// JSON lists.
const maxBucketValueBytes = 256

// QuotaSummary is the overview's line about the Rate Limit Quota
// Service: its open streams (one per proxy) and their buckets.
type QuotaSummary struct {
	Streams int `json:"streams"`
	Buckets int `json:"buckets"`
	// Shared reports that demand is shared with the other replicas
	// through Redis, so that shares divide the fleet's limit; else each
	// replica divides the limit among its own proxies.
	Shared   bool   `json:"shared"`
	Reports  uint64 `json:"reports"`
	Rejected uint64 `json:"rejected"`
}

// QuotaView is the rlqs JSON: the overview's figures and, per rule, its
// RLQS buckets as of the quota service's last interval.
type QuotaView struct {
	// Enabled is false when the server does not serve RLQS.
	Enabled bool `json:"enabled"`
	QuotaSummary
	Rules []RuleQuota `json:"rules"`
	// Total counts the rules with buckets; Truncated reports that Rules
	// stops at MaxRules.
	Total     int  `json:"total"`
	Truncated bool `json:"truncated"`
}

// RuleQuota is one rule's RLQS buckets. Demand, Assigned and Limit are
// requests per the rule's period (Per).
type RuleQuota struct {
	Domain string `json:"domain"`
	// Rule is the rule's path, as in the limits and traffic JSON.
	Rule string `json:"rule"`
	// Streams counts the proxies reporting buckets under the rule,
	// Buckets their buckets, Groups the limits divided (one per counter
	// key: a rule whose bucket ids carry a client's address divides one
	// limit per address). A rule that divides nothing (unlimited, shadow
	// mode, a limit of 0) has buckets and no groups.
	Streams int `json:"streams"`
	Buckets int `json:"buckets"`
	Groups  int `json:"groups"`
	// Demand is what this replica's proxies reported (allowed + denied),
	// Assigned the sum of the shares this replica gave them.
	Demand   float64 `json:"demand"`
	Assigned float64 `json:"assigned"`
	// Unmeasured counts the buckets reported once only: their demand is
	// not known yet, so Demand leaves them out.
	Unmeasured int `json:"unmeasured"`
	// Limit is the limit L of each group.
	Limit uint64 `json:"limit"`
	Per   string `json:"per"`
	// BucketIDs are some of the bucket ids (at most quota.MaxStatBuckets,
	// keys and values cut at 256 bytes), only for a rule with
	// detailed_metric: like descriptor values, they may be addresses or
	// API keys.
	BucketIDs []map[string]string `json:"bucket_ids,omitempty"`
}

// quotaSummary is the overview's RLQS line; nil without RLQS.
func (u *UI) quotaSummary() *QuotaSummary {
	if u.opts.Quota == nil {
		return nil
	}
	s := u.opts.Quota.Stats()
	return &QuotaSummary{Streams: s.Streams, Buckets: s.Buckets, Shared: s.Shared, Reports: s.Reports, Rejected: s.Rejected}
}

// Quota lists the RLQS buckets per rule, at most MaxRules rules.
func (u *UI) Quota() QuotaView {
	v := QuotaView{Rules: []RuleQuota{}}
	if u.opts.Quota == nil {
		return v
	}
	v.Enabled, v.QuotaSummary = true, *u.quotaSummary()
	rs := u.opts.Quota.Rules()
	v.Total = len(rs)
	if len(rs) > MaxRules {
		rs, v.Truncated = rs[:MaxRules], true
	}
	for _, r := range rs {
		q := RuleQuota{Domain: r.Rule.Domain, Rule: r.Rule.Path, Streams: r.Streams, Buckets: r.Buckets, Groups: r.Groups,
			Demand: r.Demand, Assigned: r.Share, Unmeasured: r.Unmeasured, Per: r.Rule.Per()}
		if r.Rule.Limit != nil {
			q.Limit = r.Rule.Limit.Limit()
		}
		if r.Rule.DetailedMetric {
			q.BucketIDs = bucketIDs(r.BucketIDs)
		}
		v.Rules = append(v.Rules, q)
	}
	return v
}

// bucketIDs bounds ids for the page, sorted so that the list does not
// shuffle between refreshes.
func bucketIDs(ids []map[string]string) []map[string]string {
	out := make([]map[string]string, 0, min(len(ids), quota.MaxStatBuckets))
	for _, id := range ids[:min(len(ids), quota.MaxStatBuckets)] {
		m := make(map[string]string, len(id))
		for k, v := range id {
			m[truncate(k, maxBucketValueBytes)] = truncate(v, maxBucketValueBytes)
		}
		out = append(out, m)
	}
	slices.SortFunc(out, compareIDs)
	return out
}

// compareIDs orders bucket ids by their sorted keys, then values.
func compareIDs(a, b map[string]string) int {
	flat := func(m map[string]string) []string {
		ks := slices.Sorted(maps.Keys(m))
		out := make([]string, 0, 2*len(ks))
		for _, k := range ks {
			out = append(out, k, m[k])
		}
		return out
	}
	return slices.Compare(flat(a), flat(b))
}
