package ui_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/observe/ui"
)

// Mount the page behind a path prefix: every URL in it is relative.
func Example() {
	table, err := config.Parse("limits.yaml", []byte(`
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: path
    value: /v1/uploads/*
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: token_bucket, burst: 20}
`), config.Options{})
	if err != nil {
		panic(err)
	}
	page, err := ui.New(ui.Options{Tables: fixed{table}})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/sluice/", http.StripPrefix("/sluice", page.Handler()))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	res, err := http.Get(srv.URL + "/sluice/ui/api/limits")
	if err != nil {
		panic(err)
	}
	defer res.Body.Close()
	var v ui.LimitsView
	json.NewDecoder(res.Body).Decode(&v)
	for _, r := range v.Rules {
		fmt.Printf("%s %s: %s\n", r.Domain, r.Path, r.Limit)
	}
	// Output:
	// edge remote_address: 100 per second
	// edge path_/v1/uploads/*: 10 per minute, burst 20
}

type fixed struct{ t *config.Table }

func (f fixed) Current() *config.Table { return f.t }
