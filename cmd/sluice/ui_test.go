package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/observe/ui"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// uiGet answers GET url without following redirects.
func uiGet(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(b)
}

// TestServe_UI: the status page at / by default, under --ui-prefix, or
// not at all with --ui=false; the other endpoints stay where they are.
func TestServe_UI(t *testing.T) {
	// One serve at a time: the flags' variables are shared.
	examples, err := config.Load("../../examples/config", config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, addr, stop := startServe(t, nil, "--config", "../../examples/config")
	base := "http://" + addr
	if res, body := uiGet(t, base+"/"); res.StatusCode != 200 || !strings.Contains(body, "<title>Sluice status</title>") {
		t.Fatalf("GET /: %s", res.Status)
	}
	var o ui.Overview
	res, body := uiGet(t, base+"/ui/api/overview")
	if err := json.Unmarshal([]byte(body), &o); err != nil || res.StatusCode != 200 {
		t.Fatalf("overview: %s %v", res.Status, err)
	}
	if o.Config.Source == nil || o.Config.Source.Location != "../../examples/config" || o.Store.Kind != "memory" || !o.Serving || o.Config.Rules != len(examples.Rules()) {
		t.Errorf("overview %+v", o)
	}
	if o.RLQS == nil || o.RLQS.Shared {
		t.Errorf("overview's rlqs %+v, want the quota service's, divided per replica (the memory store)", o.RLQS)
	}
	for _, p := range []string{"/healthcheck", "/metrics", "/v1/check?domain=edge&key=remote_address&value=1&cost=0"} {
		if res, _ := uiGet(t, base+p); res.StatusCode != 200 {
			t.Errorf("GET %s: %s", p, res.Status)
		}
	}
	if res, _ := uiGet(t, base+"/nothing-here"); res.StatusCode != 404 {
		t.Errorf("GET /nothing-here: %s", res.Status)
	}

	stop()
	_, addr, stop = startServe(t, nil, "--config", "../../examples/config", "--ui-prefix", "/ops/sluice/")
	base = "http://" + addr
	if res, _ := uiGet(t, base+"/ops/sluice"); res.StatusCode != http.StatusMovedPermanently || res.Header.Get("Location") != "/ops/sluice/" {
		t.Errorf("GET /ops/sluice: %s to %q, want a redirect to /ops/sluice/", res.Status, res.Header.Get("Location"))
	}
	for _, p := range []string{"/ops/sluice/", "/ops/sluice/ui/api/limits", "/ops/sluice/ui/assets/app.js"} {
		if res, _ := uiGet(t, base+p); res.StatusCode != 200 {
			t.Errorf("GET %s: %s", p, res.Status)
		}
	}
	if res, _ := uiGet(t, base+"/"); res.StatusCode != 404 {
		t.Errorf("GET / with --ui-prefix: %s, want 404", res.Status)
	}

	stop()
	_, addr, _ = startServe(t, serveEnv{"SLUICE_UI": "false"}, "--config", "../../examples/config")
	for _, p := range []string{"/", "/ui/api/overview"} {
		if res, _ := uiGet(t, "http://"+addr+p); res.StatusCode != 404 {
			t.Errorf("GET %s with SLUICE_UI=false: %s, want 404", p, res.Status)
		}
	}
}

func TestServe_UIBadPrefix(t *testing.T) {
	for _, p := range []string{"ops", "/a b", "/{x}"} {
		err := serve(t.Context(), []string{"--config", "../../examples/config", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--ui-prefix", p},
			serveEnv{}.get, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), "--ui-prefix") {
			t.Errorf("--ui-prefix %q: %v, want an error naming the flag", p, err)
		}
	}
}

// overview fetches the status page's overview, with its store's stats by
// name, and the body as served.
func overview(t *testing.T, addr string) (ui.Overview, map[string]string, string) {
	t.Helper()
	res, body := uiGet(t, "http://"+addr+"/ui/api/overview")
	var o ui.Overview
	if err := json.Unmarshal([]byte(body), &o); err != nil || res.StatusCode != 200 {
		t.Fatalf("overview: %s %v", res.Status, err)
	}
	stats := map[string]string{}
	for _, s := range o.Store.Stats {
		stats[s.Name] = s.Value
	}
	return o, stats, body
}

// TestServe_UIRedis: the overview describes the Redis store without its
// password.
func TestServe_UIRedis(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "hunter2")
	_, addr, stop := startServe(t, nil, "--config", "../../examples/config", "--store", "redis",
		"--redis-url", "redis://:hunter2@"+srv.Addr+"/0", "--redis-timeout", storeTimeout)
	defer stop()
	o, stats, body := overview(t, addr)
	if o.Store.Kind != "redis" || !o.Store.Healthy || stats["deployment"] != "single" ||
		stats["address"] != "redis://"+srv.Addr+"/0" || stats["breaker"] != "closed" || stats["state"] != "up" || stats["latency"] == "" {
		t.Errorf("store %+v", o.Store)
	}
	if o.RLQS == nil || !o.RLQS.Shared {
		t.Errorf("overview's rlqs %+v, want demand shared through Redis", o.RLQS)
	}
	if strings.Contains(body, "hunter2") {
		t.Error("the overview shows the Redis password")
	}

	// Redis stops answering: the breaker opens on the failed probe and
	// the overview says so.
	srv.Pause()
	defer srv.Resume()
	deadline := time.Now().Add(mustWithin)
	for {
		_, body = uiGet(t, "http://"+addr+"/ui/api/overview")
		o = ui.Overview{}
		if err := json.Unmarshal([]byte(body), &o); err != nil {
			t.Fatal(err)
		}
		stats = map[string]string{}
		for _, s := range o.Store.Stats {
			stats[s.Name] = s.Value
		}
		if !o.Store.Healthy && stats["state"] == "down" && stats["breaker"] != "closed" && stats["down since"] != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("store %+v with Redis paused, want down with the breaker open", o.Store)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
