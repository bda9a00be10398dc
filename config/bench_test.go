package config

import (
	"fmt"
	"strings"
	"testing"
)

// bigTable has 1,000 rules: 500 routes, each with a per-user rule and a
// per-route rule.
func bigTable(b *testing.B) *Table {
	var sb strings.Builder
	sb.WriteString("domain: big\ndescriptors:\n")
	for i := range 500 {
		fmt.Fprintf(&sb, "  - key: route\n    value: /api/v1/r%d\n    rate_limit: {unit: second, requests_per_unit: %d}\n", i, 100+i)
		fmt.Fprintf(&sb, "    descriptors:\n      - key: user\n        rate_limit: {unit: minute, requests_per_unit: 10}\n")
	}
	return mustCompile(b, sb.String())
}

// wildTable has 50 wildcard values on one key; the benchmark's value
// matches only the last.
func wildTable(b *testing.B) *Table {
	var sb strings.Builder
	sb.WriteString("domain: wild\ndescriptors:\n")
	for i := range 50 {
		fmt.Fprintf(&sb, "  - key: path\n    value: /svc%d/*/items/*\n    rate_limit: {unit: second, requests_per_unit: 10}\n", i)
	}
	return mustCompile(b, sb.String())
}

func benchMatch(b *testing.B, tbl *Table, domain string, es []Entry) {
	if r, _ := tbl.Match(domain, es, nil); r == nil {
		b.Fatal("no match")
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 0, 256)
		for pb.Next() {
			_, buf = tbl.Match(domain, es, buf[:0])
		}
	})
}

func BenchmarkMatch_1000Rules(b *testing.B) {
	benchMatch(b, bigTable(b), "big", []Entry{{"route", "/api/v1/r250"}, {"user", "user-12345"}})
}

func BenchmarkMatch_1000RulesMiss(b *testing.B) {
	tbl := bigTable(b)
	es := []Entry{{"route", "/api/v2/none"}, {"user", "user-12345"}}
	b.ReportAllocs()
	for b.Loop() {
		tbl.Match("big", es, nil)
	}
}

func BenchmarkMatch_50Wildcards(b *testing.B) {
	benchMatch(b, wildTable(b), "wild", []Entry{{"path", "/svc49/tenant-7/items/12345"}})
}

func BenchmarkMatch_50WildcardsSerial(b *testing.B) {
	tbl := wildTable(b)
	es := []Entry{{"path", "/svc49/tenant-7/items/12345"}}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		_, buf = tbl.Match("wild", es, buf[:0])
	}
}
