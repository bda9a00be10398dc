package config_test

import (
	"errors"
	"testing"

	"github.com/sluicehq/sluice/config"
)

func TestParse(t *testing.T) {
	tb, err := config.Parse("demo.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3}\n"), config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rs := tb.Rules(); len(rs) != 1 || rs[0].RequestsPerUnit != 3 || rs[0].File != "demo.yaml" || tb.Files() != 1 {
		t.Fatalf("rules %v, files %d", rs, tb.Files())
	}
	_, err = config.Parse("bad.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 3}\n"), config.Options{})
	var es *config.Errors
	if !errors.As(err, &es) || es.List[0].File != "bad.yaml" || es.List[0].Line != 4 {
		t.Fatalf("bad unit: %v, want an error at bad.yaml:4", err)
	}
}
