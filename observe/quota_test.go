package observe_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/quota"
)

func TestRegisterQuota(t *testing.T) {
	q := quota.New(tables{loadTable(t, limits)}, quota.Options{Reserve: -1, MaxStreams: 3})
	reg := prometheus.NewRegistry()
	if err := observe.RegisterQuota(reg, q); err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_800_000_000, 0)
	usage := func(k, v string, n uint64) quota.Usage {
		return quota.Usage{Bucket: map[string]string{k: v}, Elapsed: time.Minute, Allowed: n}
	}
	var sts []*quota.Stream
	for range 2 {
		st, err := q.Open()
		if err != nil {
			t.Fatal(err)
		}
		sts = append(sts, st)
		for i := range 2 {
			if err := st.Report(t0.Add(time.Duration(i)*time.Second), "web", []quota.Usage{usage("k", "a", 30), usage("free", "x", 1)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	bad, err := q.Open()
	if err != nil {
		t.Fatal(err)
	}
	if err := bad.Report(t0, "", nil); err == nil {
		t.Fatal("no error for a stream without a domain")
	}
	if _, err := q.Open(); err == nil {
		t.Fatal("no error for a fourth stream, over the cap of 3")
	}
	bad.Close()
	if err := q.Tick(context.Background(), t0.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, reg)
	check(t, fams, "sluice_rlqs_streams", nil, 2)
	check(t, fams, "sluice_rlqs_buckets", nil, 4)
	check(t, fams, "sluice_rlqs_reports_total", nil, 5)
	check(t, fams, "sluice_rlqs_bucket_reports_total", nil, 8)
	check(t, fams, "sluice_rlqs_rejected_total", nil, 2)
	check(t, fams, "sluice_rlqs_over_cap_total", map[string]string{"cap": "streams"}, 1)
	check(t, fams, "sluice_rlqs_over_cap_total", map[string]string{"cap": "bucket_keys"}, 0)
	check(t, fams, "sluice_rlqs_panics_total", nil, 0)
	check(t, fams, "sluice_rlqs_fleet_claims_deferred_total", nil, 0)
	check(t, fams, "sluice_rlqs_assignments_total", map[string]string{"strategy": "allow_all"}, 2)
	// k: 10 per minute, both proxies want 30: 5 each.
	check(t, fams, "sluice_rlqs_rule_buckets", map[string]string{"domain": "web", "rule": "k"}, 2)
	check(t, fams, "sluice_rlqs_rule_demand", map[string]string{"domain": "web", "rule": "k"}, 60)
	check(t, fams, "sluice_rlqs_rule_assigned", map[string]string{"domain": "web", "rule": "k"}, 10)
	for _, st := range sts {
		st.Close()
	}
}

// TestRegisterQuota_SharedPath: two rules whose stats paths are the same
// (key a_b value c, key a value b_c) make one series each, summed, and the
// scrape does not fail.
func TestRegisterQuota_SharedPath(t *testing.T) {
	q := quota.New(tables{loadTable(t, "domain: web\ndescriptors:\n"+
		"  - {key: a_b, value: c, rate_limit: {unit: minute, requests_per_unit: 10}}\n"+
		"  - {key: a, value: b_c, rate_limit: {unit: minute, requests_per_unit: 20}}\n")}, quota.Options{Reserve: -1})
	reg := prometheus.NewRegistry()
	if err := observe.RegisterQuota(reg, q); err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_800_000_000, 0)
	st, err := q.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, b := range []map[string]string{{"a_b": "c"}, {"a": "b_c"}} {
		if err := st.Report(t0, "web", []quota.Usage{{Bucket: b, Elapsed: time.Minute, Allowed: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Tick(context.Background(), t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, reg)
	check(t, fams, "sluice_rlqs_rule_buckets", map[string]string{"domain": "web", "rule": "a_b_c"}, 2)
}
