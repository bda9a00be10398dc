package observe

import "github.com/prometheus/client_golang/prometheus"

// LabelSets returns how many label sets (domain, rule, value) r holds:
// one per plain rule of the table in force, one per value of a detailed
// rule and its "_other", one per domain with override hits. Each is one
// series of every sluice_rule_* family, and RefStats keeps one entry per
// label set.
func (r *Rules) LabelSets() int {
	r.labelsMu.Lock()
	defer r.labelsMu.Unlock()
	return len(r.byLabels)
}

var labelSetsDesc = prometheus.NewDesc("sluice_rule_label_sets",
	"Label sets (domain, rule, value) the per-rule counters hold, each one series of every sluice_rule_* family: bounded by the config in force.", nil, nil)

// labelSetsCollector exports Rules.LabelSets at scrape time.
type labelSetsCollector struct{ r *Rules }

func (c labelSetsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- labelSetsDesc }

func (c labelSetsCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(labelSetsDesc, prometheus.GaugeValue, float64(c.r.LabelSets()))
}
