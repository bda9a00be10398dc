package ui

import (
	_ "embed"
	"fmt"
	"net/http"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

//go:embed demo.yaml
var demoYAML []byte

// Bounds of the demo limiter: every tab counts under its own visitor id,
// so the demo store's keys are capped (past the cap the oldest states are
// dropped, which only restarts someone's demo).
const (
	demoMaxKeys     = 10000
	demoMaxEntries  = 2
	demoMaxValueLen = 64
)

// fixedTable is a limiter.Tables that never changes.
type fixedTable struct{ t *config.Table }

func (f fixedTable) Current() *config.Table { return f.t }

// demo is the private limiter behind the page's demo.
type demo struct {
	table *config.Table
	check http.Handler // server.HTTP's /v1/check, nothing else
}

func newDemo(clock store.Clock) (*demo, error) {
	t, err := config.Parse("demo.yaml", demoYAML, config.Options{MaxValueBytes: demoMaxValueLen})
	if err != nil {
		return nil, fmt.Errorf("ui: the built-in demo config: %w", err)
	}
	st := memory.New(memory.Options{MaxKeys: demoMaxKeys, Clock: clock})
	lim := limiter.New(fixedTable{t}, st, limiter.Options{MaxDescriptors: 1, MaxEntries: demoMaxEntries, Clock: clock})
	health := server.NewHealth()
	health.SetServing(true)
	h := server.NewHTTP(lim, health, server.Options{})
	mux := http.NewServeMux()
	// Only /v1/check of the demo's server.HTTP is reachable, under
	// ui/demo/.
	mux.Handle("GET /ui/demo/v1/check", http.StripPrefix("/ui/demo", h))
	mux.Handle("POST /ui/demo/v1/check", http.StripPrefix("/ui/demo", h))
	return &demo{table: t, check: mux}, nil
}
