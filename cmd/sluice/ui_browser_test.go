package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/config/xds/xdstest"
)

// chromium finds a Chromium or Chrome binary: $SLUICE_CHROMIUM, else the
// usual names on PATH. "" when there is none.
func chromium() string {
	if p := os.Getenv("SLUICE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// consoleErrors collects what the page logs as an error or a warning,
// and what it throws.
type consoleErrors struct {
	mu   sync.Mutex
	list []string
}

func (c *consoleErrors) collect(ctx context.Context) {
	for m, err := range chromedp.Console(ctx) {
		if err != nil {
			return
		}
		// The browser logs every 4xx answer to a fetch; the demo's 429s
		// are answers the page expects and shows.
		if m.Source == "network" && strings.HasSuffix(m.URL, "/ui/demo/v1/check") && strings.Contains(m.Text, "429") {
			continue
		}
		// Nor a reset refused for a missing or wrong token, which the
		// lookup step tries on purpose.
		if m.Source == "network" && strings.HasSuffix(m.URL, "/ui/counters/v1/counters/reset") && strings.Contains(m.Text, "401") {
			continue
		}
		switch m.Type {
		case chromedp.ConsoleError, chromedp.ConsoleWarning, chromedp.ConsoleException:
			c.mu.Lock()
			c.list = append(c.list, fmt.Sprintf("%s (%s:%d)", m, m.URL, m.Line+1))
			c.mu.Unlock()
		}
	}
}

func (c *consoleErrors) get() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.list...)
}

// TestUI_Browser drives the status page in a real headless Chromium (one
// browser for every step) against serve on loopback listeners, with the
// limits of examples/config. With SLUICE_SCREENSHOTS=DIR it also writes
// ui-overview.png and ui-demo.png into DIR (make screenshots).
func TestUI_Browser(t *testing.T) {
	exe := chromium()
	if exe == "" {
		t.Skip("no Chromium found (install Debian's chromium: make deps; or set SLUICE_CHROMIUM): skipping the browser tests")
	}
	shots := os.Getenv("SLUICE_SCREENSHOTS")

	// A copy of examples/config, which the reload step edits.
	dir := t.TempDir()
	files, err := filepath.Glob("../../examples/config/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("examples/config: %v files, %v", len(files), err)
	}
	for _, f := range files {
		name := filepath.Base(f)
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	token := filepath.Join(t.TempDir(), "admin-token")
	if err := os.WriteFile(token, []byte(uiAdminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	grpcAddr, httpAddr, _ := startServe(t, nil, "--config", dir, "--admin-token-file", token)
	rls, _ := dialRLS(t, grpcAddr)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox,
		chromedp.WindowSize(1400, 1100), chromedp.Flag("disable-dev-shm-usage", true), chromedp.Flag("hide-scrollbars", true))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	var errs consoleErrors
	var wg sync.WaitGroup
	defer func() { bcancel(); wg.Wait() }()
	if err := chromedp.Do(bctx); err != nil { // starts the browser
		t.Fatalf("starting %s: %v", exe, err)
	}
	wg.Go(func() { errs.collect(bctx) })

	// do runs steps with a time limit.
	do := func(t *testing.T, what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, scancel := context.WithTimeout(bctx, 30*time.Second)
		defer scancel()
		if err := chromedp.Do(sctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eval := func(t *testing.T, expr string) string {
		t.Helper()
		sctx, scancel := context.WithTimeout(bctx, 30*time.Second)
		defer scancel()
		v, err := chromedp.Run(sctx, chromedp.Evaluate[string](`String(`+expr+`)`))
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		return v
	}
	poll := func(expr string) chromedp.Action[chromedp.Void] {
		return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(25*time.Second))
	}
	noErrors := func(t *testing.T) {
		t.Helper()
		if e := errs.get(); len(e) > 0 {
			t.Errorf("the page logged errors:\n%s", strings.Join(e, "\n"))
		}
	}
	row := func(domain, path, expr string) string {
		return fmt.Sprintf(`(() => { const tr = document.querySelector('tr[data-rule=%q]'); return tr ? %s : null; })()`, domain+"/"+path, expr)
	}

	t.Run("loads without console errors", func(t *testing.T) {
		do(t, "load", chromedp.Navigate("http://"+httpAddr+"/"),
			chromedp.WaitVisible(chromedp.CSS(`#limits-table tbody tr`)),
			poll(`document.querySelector('#health').textContent === 'SERVING'`))
		if v := eval(t, `document.querySelector('#version').textContent`); v == "…" || v == "" {
			t.Errorf("version %q", v)
		}
		if v := eval(t, `document.querySelector('#config-source').textContent`); !strings.Contains(v, dir) {
			t.Errorf("config source %q, want %s", v, dir)
		}
		noErrors(t)
	})

	t.Run("limits table lists examples/config", func(t *testing.T) {
		tab, err := config.Load("../../examples/config", config.Options{})
		if err != nil {
			t.Fatal(err)
		}
		rows := strings.Split(eval(t, `Array.from(document.querySelectorAll('#limits-table tbody tr')).map(tr => tr.dataset.rule).join('\n')`), "\n")
		if len(rows) != len(tab.Rules()) {
			t.Errorf("%d rows, want the %d rules of examples/config", len(rows), len(tab.Rules()))
		}
		have := map[string]bool{}
		for _, r := range rows {
			have[r] = true
		}
		for _, r := range tab.Rules() {
			if !have[r.Domain+"/"+r.Path] {
				t.Errorf("no row for %s/%s", r.Domain, r.Path)
			}
		}
		// The search narrows the table, and clearing it shows every row.
		do(t, "search", chromedp.SendKeys(chromedp.CSS(`#search`), "uploads"))
		if n := eval(t, `document.querySelectorAll('#limits-table tbody tr:not([hidden])').length`); n != "1" {
			t.Errorf("searching %q shows %s rows, want 1", "uploads", n)
		}
		eval(t, `(() => { const s = document.querySelector('#search'); s.value = ''; s.dispatchEvent(new Event('input')); })()`)
		if n := eval(t, `document.querySelectorAll('#limits-table tbody tr:not([hidden])').length`); n != fmt.Sprint(len(tab.Rules())) {
			t.Errorf("after clearing the search %s rows show", n)
		}
	})

	t.Run("live traffic after ShouldRateLimit calls", func(t *testing.T) {
		// Calls keep coming, as in production, until the page shows
		// them (and, for the screenshot, a little longer).
		sctx, stop := context.WithCancel(ctx)
		var senders sync.WaitGroup
		defer func() { stop(); senders.Wait() }()
		senders.Go(func() {
			for i := 0; sctx.Err() == nil; i++ {
				rls.ShouldRateLimit(sctx, rlsRequest("edge", "remote_address", fmt.Sprintf("198.51.100.%d", i%200)))
				rls.ShouldRateLimit(sctx, rlsRequest("edge", "remote_address", "203.0.113.7"))
				if i%3 == 0 {
					rls.ShouldRateLimit(sctx, rlsRequest("edge", "api_key", "k1", "path", "/v1/search?q=x"))
					rls.ShouldRateLimit(sctx, rlsRequest("edge", "user_agent", "crawlerbot/2"))
				}
				select {
				case <-sctx.Done():
				case <-time.After(40 * time.Millisecond):
				}
			}
		})
		do(t, "traffic", poll(row("edge", "remote_address", `tr.querySelector('td.allowed').textContent !== '0'`)),
			poll(row("edge", "remote_address_203.0.113.7", `tr.querySelector('td.denied').textContent !== '0'`)))
		if v := eval(t, row("edge", "remote_address", `tr.querySelector('td.allowed').textContent`)); v == "0" {
			t.Errorf("allowed/s of edge/remote_address %q, want non-zero", v)
		}
		// No descriptor value of that traffic reaches the page.
		if html := eval(t, `document.documentElement.outerHTML`); strings.Contains(html, "198.51.100.") || strings.Contains(html, "crawlerbot") {
			t.Error("the page shows a descriptor value of real traffic")
		}
		if shots != "" {
			time.Sleep(15 * time.Second) // let the sparklines grow: for the picture only
			screenshot(t, bctx, shots, "ui-overview.png", "")
		}
	})

	t.Run("the limits table fits common widths", func(t *testing.T) {
		// Every column, the last (Shadow) included, lies within the
		// table's box at each width, with live traffic in the rows: no
		// column clipped or hidden behind a scroll.
		defer do(t, "reset the viewport", chromedp.EmulateReset())
		for _, w := range []int64{1920, 1440, 1400, 1366, 1280, 1024} {
			do(t, "resize", chromedp.EmulateViewport(w, 1100))
			got := eval(t, `(() => {
				const wrap = document.querySelector('#limits-table').closest('.table-wrap');
				const box = wrap.getBoundingClientRect();
				const last = document.querySelector('#limits-table thead th:last-child').getBoundingClientRect();
				return [Math.max(0, Math.round(last.right - box.right)), wrap.scrollWidth - wrap.clientWidth].join(' ');
			})()`)
			var past, scroll int
			if _, err := fmt.Sscan(got, &past, &scroll); err != nil || past > 0 || scroll > 0 {
				t.Errorf("at %d px: Shadow's right edge %d px past the table's box, %d px to scroll (%q)", w, past, scroll, got)
			}
		}
	})

	t.Run("RLQS buckets per rule after a stream reports", func(t *testing.T) {
		cc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		sctx, stop := context.WithTimeout(ctx, 30*time.Second)
		defer stop()
		stream, err := rlqspb.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(sctx)
		if err != nil {
			t.Fatal(err)
		}
		// An Envoy proxy's first report of one bucket: a client address.
		if err := stream.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{
			BucketId:    &rlqspb.BucketId{Bucket: map[string]string{"remote_address": "192.0.2.55"}},
			TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 5}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil { // answered at once
			t.Fatal(err)
		}
		do(t, "rlqs", poll(row("edge", "remote_address", `tr.querySelector('.rlqs').textContent.startsWith('RLQS 1 proxy · 1 bucket')`)),
			poll(`document.querySelector('#rlqs').textContent.startsWith('1 stream, 1 bucket')`))
		if v := eval(t, row("edge", "remote_address", `tr.querySelector('.rlqs').textContent`)); !strings.Contains(v, "of 100 per second") {
			t.Errorf("edge/remote_address's RLQS line %q, want the share against its limit of 100 per second", v)
		}
		if v := eval(t, row("edge", "remote_address_203.0.113.7", `tr.querySelector('.rlqs').textContent`)); v != "" {
			t.Errorf("edge/remote_address_203.0.113.7's RLQS line %q, want none (no bucket)", v)
		}
		if html := eval(t, `document.documentElement.outerHTML`); strings.Contains(html, "192.0.2.55") {
			t.Error("the page shows the bucket id of a rule without detailed_metric")
		}
		stream.CloseSend()
		noErrors(t)
	})

	// click clicks a button from the page's script: a mouse click lands at
	// coordinates read a moment before, which the live tables above the
	// demo can move meanwhile on a busy machine.
	click := func(sel string) chromedp.Action[chromedp.Void] {
		return chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.querySelector(%q).click()`, sel))
	}

	t.Run("demo: six requests on a 5-token bucket", func(t *testing.T) {
		do(t, "scroll", chromedp.ScrollIntoView(chromedp.CSS(`#demo`)))
		start := time.Now()
		for i := 1; i <= 6; i++ {
			do(t, fmt.Sprintf("click %d", i), click(`#demo-send`),
				poll(fmt.Sprintf(`document.querySelectorAll('#tb-log li').length === %d && document.querySelectorAll('#fw-log li').length === %d`, i, i)))
		}
		// The demo's bucket refills a token every 10 s of real time (the
		// server's clock): clicks slower than that on a busy machine may
		// all be allowed, and the answers below are not checked then.
		if took := time.Since(start); took >= 10*time.Second {
			t.Logf("six clicks took %v, longer than a token's refill: the bucket's answers are not checked", took)
		} else {
			answer := eval(t, `document.querySelector('#tb-answer').textContent`)
			if !strings.Contains(answer, "429") || !strings.Contains(answer, "Retry-After: ") || strings.Contains(answer, "Retry-After: null") {
				t.Errorf("token bucket after 6 requests: %q, want a 429 with its Retry-After", answer)
			}
			// The log, newest first: the fifth answer emptied the bucket.
			if fifth := eval(t, `document.querySelectorAll('#tb-log li')[1].textContent`); !strings.Contains(fifth, "200 OK · 0 left") {
				t.Errorf("token bucket's fifth answer %q, want 200 with 0 left", fifth)
			}
		}
		// The fixed window is epoch-aligned: unless a minute began during
		// the clicks (a second "4 left"), the sixth request is denied.
		fwLog := eval(t, `Array.from(document.querySelectorAll('#fw-log li')).map(li => li.textContent).join('\n')`)
		if fw := eval(t, `document.querySelector('#fw-answer').textContent`); !strings.Contains(fw, "429") && strings.Count(fwLog, "4 left") < 2 {
			t.Errorf("fixed window of 5 after 6 requests: %q, want 429 (log:\n%s)", fw, fwLog)
		}
		if shots != "" {
			screenshot(t, bctx, shots, "ui-demo.png", "#demo")
		}
		// Send 10 on the empty bucket: ten more answers, denied.
		do(t, "send 10", click(`#demo-send10`),
			poll(`document.querySelectorAll('#tb-log li').length === 16 && document.querySelectorAll('#fw-log li').length === 16`))
		if last := eval(t, `document.querySelector('#tb-log li').textContent`); !strings.Contains(last, "429") {
			t.Errorf("the last of Send 10 on an empty bucket: %q, want 429", last)
		}
		noErrors(t)
	})

	t.Run("look up a client, then reset it with the token", func(t *testing.T) {
		for range 3 {
			if _, err := rls.ShouldRateLimit(ctx, rlsRequest("internal", "to_number", "+15550100")); err != nil {
				t.Fatal(err)
			}
		}
		do(t, "lookup", poll(`!document.querySelector('#lookup').hidden && !document.querySelector('#reset-form').hidden`),
			chromedp.ScrollIntoView(chromedp.CSS(`#lookup`)),
			chromedp.Evaluate[chromedp.Void](`document.querySelector('#lookup-domain').value = 'internal';
				document.querySelector('#lookup-entries').value = 'to_number=+15550100';
				document.querySelector('#lookup-form').requestSubmit()`),
			poll(`document.querySelector('#lookup-table td.used')?.textContent === '3 / 100'`))
		if v := eval(t, `document.querySelector('#lookup-rule').textContent`); !strings.Contains(v, "internal.to_number") {
			t.Errorf("the lookup's rule line %q, want internal.to_number", v)
		}
		if v := eval(t, `document.querySelector('#lookup-table td.remaining').textContent`); v != "97" {
			t.Errorf("remaining %q, want 97", v)
		}
		// Looking up again changes nothing.
		do(t, "lookup again", chromedp.Evaluate[chromedp.Void](`document.querySelector('#lookup-table td.used').textContent = '';
			document.querySelector('#lookup-form').requestSubmit()`),
			poll(`document.querySelector('#lookup-table td.used')?.textContent === '3 / 100'`))
		for _, tok := range []string{"", "not-the-admin-token-0123456789"} {
			do(t, "reset with token "+tok, chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.querySelector('#reset-answer').textContent = '';
				document.querySelector('#reset-token').value = %q; document.querySelector('#reset-form').requestSubmit()`, tok)),
				poll(`document.querySelector('#reset-answer').textContent !== ''`))
			if v := eval(t, `document.querySelector('#reset-answer').textContent`); !strings.Contains(v, "Not reset: HTTP 401") {
				t.Errorf("reset with token %q: %q, want a 401", tok, v)
			}
			if v := eval(t, `document.querySelector('#lookup-table td.used').textContent`); v != "3 / 100" {
				t.Errorf("after a refused reset the table shows %q, want 3 / 100", v)
			}
		}
		do(t, "reset", chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.querySelector('#reset-token').value = %q;
			document.querySelector('#reset-form').requestSubmit()`, uiAdminToken)),
			poll(`document.querySelector('#lookup-table td.used')?.textContent === '0 / 100'`))
		if v := eval(t, `document.querySelector('#reset-token').value + '|' + location.search + '|' + JSON.stringify(sessionStorage) + JSON.stringify(localStorage)`); strings.Contains(v, uiAdminToken) || strings.Contains(v, "15550100") {
			t.Errorf("the page kept the token or the value: %q", v)
		}
		got, err := rls.ShouldRateLimit(ctx, rlsRequest("internal", "to_number", "+15550100"))
		if err != nil || got.Statuses[0].LimitRemaining != 99 {
			t.Errorf("a request after the reset: %v %v, want 99 left", got, err)
		}
		noErrors(t)
	})

	t.Run("renders after config reloads", func(t *testing.T) {
		before, err := config.Load(dir, config.Options{})
		if err != nil {
			t.Fatal(err)
		}
		domains, rules := len(before.Domains())+1, len(before.Rules())+1
		good := "domain: added\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n"
		if err := os.WriteFile(filepath.Join(dir, "added.yaml"), []byte(good), 0o644); err != nil {
			t.Fatal(err)
		}
		do(t, "reload", poll(row("added", "tenant", `true`)),
			poll(fmt.Sprintf(`document.querySelector('#config-size').textContent.includes('%d domain')`, domains)))
		// A bad edit: the page shows where, and keeps the table in force.
		if err := os.WriteFile(filepath.Join(dir, "added.yaml"), []byte(strings.Replace(good, "hour", "fortnight", 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		do(t, "failed reload", chromedp.WaitVisible(chromedp.CSS(`#config-error`)))
		if p := eval(t, `document.querySelector('#config-problems').textContent`); !strings.Contains(p, "added.yaml:4") || !strings.Contains(p, "fortnight") {
			t.Errorf("the failed reload shows %q, want added.yaml:4 and the bad unit", p)
		}
		if n := eval(t, `document.querySelectorAll('#limits-table tbody tr').length`); n != fmt.Sprint(rules) {
			t.Errorf("%s rows after a failed reload, want the %d still in force", n, rules)
		}
		noErrors(t)
	})
}

// uiAdminToken is the admin token of the browser test's server.
const uiAdminToken = "ui-browser-admin-token-0123456789"

// screenshot writes a PNG of the top of the page (sel "") or of one
// element into dir.
func screenshot(t *testing.T, ctx context.Context, dir, name, sel string) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var png []byte
	var err error
	if sel == "" {
		if _, err = chromedp.Run(sctx, chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`)); err == nil {
			png, err = chromedp.Run(sctx, chromedp.CaptureScreenshot())
		}
	} else {
		png, err = chromedp.Run(sctx, chromedp.Screenshot(chromedp.CSS(sel)))
	}
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", filepath.Join(dir, name))
}

// TestUI_BrowserOverlay: with limits pushed over xDS and an overlay, the
// status page tags each rule the overlay changed with the overlay's
// file:line and fields, and its Config card lists the overlay's entries
// that change no rule; all without console errors.
func TestUI_BrowserOverlay(t *testing.T) {
	exe := chromium()
	if exe == "" {
		t.Skip("no Chromium found (install Debian's chromium: make deps; or set SLUICE_CHROMIUM): skipping the browser tests")
	}
	overlayDir := t.TempDir()
	writeFile(t, filepath.Join(overlayDir, "eg.yaml"), egOverlayYAML+"  - key: gone\n    rate_limit: {algorithm: token_bucket}\n")
	xs := xdstest.Start(t, "127.0.0.1:0", nil)
	_, httpAddr, _ := startServe(t, nil, "--config-source", "xds", "--xds-server", xs.Addr, "--xds-node-id", egNode, "--xds-overlay", overlayDir)
	xs.Push(t, egNode, "1", egRulesLimits("backend", 60, 10))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	var errs consoleErrors
	var wg sync.WaitGroup
	defer func() { bcancel(); wg.Wait() }()
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("starting %s: %v", exe, err)
	}
	wg.Go(func() { errs.collect(bctx) })
	sctx, scancel := context.WithTimeout(bctx, 60*time.Second)
	defer scancel()
	if err := chromedp.Do(sctx, chromedp.Navigate("http://"+httpAddr+"/"),
		chromedp.Poll[chromedp.Void](`document.querySelectorAll('#limits-table tbody tr').length === 2 && !document.querySelector('#overlay').hidden`,
			chromedp.WithPollingTimeout(50*time.Second))); err != nil {
		t.Fatalf("load: %v", err)
	}
	pills, err := chromedp.Run(sctx, chromedp.Evaluate[string](`Array.from(document.querySelectorAll('.pill.overlay')).map(p => p.textContent).join('\n')`))
	if err != nil {
		t.Fatal(err)
	}
	want := "overlay eg.yaml:6: algorithm: token_bucket, burst: 3\noverlay eg.yaml:8: algorithm: sliding_window, unit_multiplier: 30"
	if pills != want {
		t.Errorf("overlay tags %q, want %q", pills, want)
	}
	misses, err := chromedp.Run(sctx, chromedp.Evaluate[string](`document.querySelector('#overlay-miss-list').textContent + ' | ' + document.querySelector('#overlay-size').textContent`))
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(overlayDir, "eg.yaml") + ":10 default/eg/* | gone: matches no rate_limit of the pushed config | 1 file(s), 3 entries, 1 changing no rule"; misses != want {
		t.Errorf("overlay card %q, want %q", misses, want)
	}
	if e := errs.get(); len(e) > 0 {
		t.Errorf("the page logged errors:\n%s", strings.Join(e, "\n"))
	}
}
