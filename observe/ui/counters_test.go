package ui_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/observe/ui"
	"github.com/sluicehq/sluice/server"
)

// TestCounters: the overview says whether the lookup form may look up
// and reset; the page forwards ui/counters/v1/... to the server's
// counter endpoints (so the form works behind a path prefix too), with
// its security headers; without Options.Counters there is no form.
func TestCounters(t *testing.T) {
	r := newRig(t)
	var o ui.Overview
	getJSON(t, r.url+"/ui/api/overview", &o)
	if o.Counters.Lookup || o.Counters.Resets {
		t.Errorf("no Counters: overview counters %+v, want both off", o.Counters)
	}
	if res, _ := get(t, r.url+"/ui/counters/v1/counters?domain=web&key=api_key&value=k"); res.StatusCode != http.StatusNotFound {
		t.Errorf("no Counters: GET ui/counters/v1/counters = %s, want 404", res.Status)
	}

	for _, resets := range []bool{false, true} {
		page, err := ui.New(ui.Options{Tables: r.reload, Counters: server.NewCounters(r.lim, server.CountersOptions{}), Resets: resets})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(http.StripPrefix("/sluice", page.Handler()))
		defer srv.Close()
		getJSON(t, srv.URL+"/sluice/ui/api/overview", &o)
		if !o.Counters.Lookup || o.Counters.Resets != resets {
			t.Errorf("Resets %v: overview counters %+v", resets, o.Counters)
		}
		r.send(t, "api_key", "k1")
		res, err := http.Post(srv.URL+"/sluice/ui/counters/v1/counters", "application/json",
			strings.NewReader(`{"domain":"web","key":"api_key","value":"k1"}`))
		if err != nil {
			t.Fatal(err)
		}
		var out server.CountersResponse
		err = json.NewDecoder(res.Body).Decode(&out)
		res.Body.Close()
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("lookup through the page: %s %v", res.Status, err)
		}
		if len(out.Descriptors) != 1 || len(out.Descriptors[0].Limits) != 1 || out.Descriptors[0].Limits[0].Used == 0 {
			t.Errorf("lookup through the page: %+v", out)
		}
		if res.Header.Get("Content-Security-Policy") == "" {
			t.Error("the page's forward lacks its security headers")
		}
	}
}
