package ui

import (
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/observe"
)

// Sizes of what Traffic holds, for Held.
const (
	countsSize = int(unsafe.Sizeof(observe.Counts{}))
	frameSize  = int(unsafe.Sizeof(frame{}))
	ruleIDSize = int(unsafe.Sizeof(ruleID{}))
	bufSize    = int(unsafe.Sizeof(observe.RuleCounts{}))
	// idEntrySize is a slot of Traffic.ids (key, value and a control
	// byte) at the map's fullest, 7 slots of 8 used.
	idEntrySize = (ruleIDSize + int(unsafe.Sizeof(int(0))) + 1) * 8 / 7
)

// Held returns how many rules t's samples hold (those its source listed
// at the last sample) and the bytes its samples, rule index and scratch
// take: the capacities of its arrays, and the index map at its fullest
// (so at most twice that once it grew). The rules' names are the
// source's, not counted. It does not read the source.
func (t *Traffic) Held() (rules int, bytes int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	bytes = cap(t.frames)*frameSize + cap(t.rules)*ruleIDSize + len(t.ids)*idEntrySize +
		cap(t.buf)*bufSize + cap(t.slots)*int(unsafe.Sizeof(int(0))) + cap(t.listed)
	for i := range t.frames {
		bytes += cap(t.frames[i].counts) * countsSize
	}
	return len(t.rules), bytes
}

var (
	trafficRulesDesc = prometheus.NewDesc("sluice_ui_traffic_rules",
		"Rules the status page's traffic samples hold: those of the config in force at the last sample.", nil, nil)
	trafficBytesDesc = prometheus.NewDesc("sluice_ui_traffic_bytes",
		"Bytes the status page's traffic samples, rule index and scratch take (the index estimated).", nil, nil)
)

// RegisterMetrics registers gauges of what t holds on reg, read at each
// scrape: sluice_ui_traffic_rules and sluice_ui_traffic_bytes.
func RegisterMetrics(reg prometheus.Registerer, t *Traffic) error {
	return reg.Register(trafficCollector{t})
}

type trafficCollector struct{ t *Traffic }

func (c trafficCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- trafficRulesDesc
	ch <- trafficBytesDesc
}

func (c trafficCollector) Collect(ch chan<- prometheus.Metric) {
	rules, bytes := c.t.Held()
	ch <- prometheus.MustNewConstMetric(trafficRulesDesc, prometheus.GaugeValue, float64(rules))
	ch <- prometheus.MustNewConstMetric(trafficBytesDesc, prometheus.GaugeValue, float64(bytes))
}
