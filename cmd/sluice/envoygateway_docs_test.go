package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/config"
)

// TestEnvoyGatewayDocs_OverlayExamples compiles each worked example of
// docs/ENVOY-GATEWAY.md's "Sluice's algorithms for pushed limits": the
// limits Envoy Gateway pushes (the second YAML block) with the overlay
// (the third), which must apply whole, giving a rule the algorithm the
// example's heading names.
func TestEnvoyGatewayDocs_OverlayExamples(t *testing.T) {
	b, err := os.ReadFile("../../docs/ENVOY-GATEWAY.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "## Sluice's algorithms for pushed limits\n")
	if !ok {
		t.Fatal("no section \"Sluice's algorithms for pushed limits\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	block := regexp.MustCompile("(?s)```yaml\n(.*?)```")
	examples := 0
	for _, ex := range strings.Split(section, "\n### ")[1:] {
		heading, _, _ := strings.Cut(ex, "\n")
		alg, _, _ := strings.Cut(heading, ":")
		blocks := block.FindAllStringSubmatch(ex, -1)
		if len(blocks) == 0 {
			continue
		}
		examples++
		if len(blocks) != 3 {
			t.Errorf("%s: %d YAML blocks, want the policy, the push and the overlay", heading, len(blocks))
			continue
		}
		o, err := config.ParseOverlay("overlay.yaml", []byte(blocks[2][1]))
		if err != nil {
			t.Errorf("%s: the overlay: %v", heading, err)
			continue
		}
		tbl, err := config.Parse("pushed.yaml", []byte(blocks[1][1]), config.Options{Overlay: o})
		if err != nil {
			t.Errorf("%s: the push: %v", heading, err)
			continue
		}
		if rep := tbl.Overlay(); len(rep.Unmatched) > 0 || len(rep.Problems) > 0 {
			t.Errorf("%s: entries not applied: %v %v", heading, rep.Unmatched, rep.Problems)
		}
		want := map[string]string{"Token bucket": "token_bucket", "Sliding window": "sliding_window", "Fixed window": "fixed_window"}[alg]
		r := tbl.Rules()[0]
		if r.Algorithm.String() != want || r.Overlay == nil {
			t.Errorf("%s: the rule is %v (overlay %+v), want a %s set by the overlay", heading, r, r.Overlay, want)
		}
	}
	if examples != 3 {
		t.Errorf("%d worked examples, want one per algorithm", examples)
	}
}
