package observe_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/storetest"
)

// keyMap is a hand-written KeyRanger over fixed decisions, in key order.
type keyMap struct {
	keys    map[string]store.Decision
	gotNow  int64
	gotPref string
}

func (m *keyMap) RangeKeys(prefix string, now int64, fn func(string, store.Decision) bool) {
	m.gotNow, m.gotPref = now, prefix
	names := make([]string, 0, len(m.keys))
	for k := range m.keys {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if strings.HasPrefix(k, prefix) && !fn(k, m.keys[k]) {
			return
		}
	}
}

func get(t *testing.T, h http.Handler, url string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, url, nil))
	body, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(body)
}

func TestDebug_RLConfig(t *testing.T) {
	tab := loadTable(t, limits)
	d := &observe.Debug{Tables: tables{tab}}
	code, body := get(t, d.Handler(), "/rlconfig")
	if code != http.StatusOK || body != tab.String() {
		t.Errorf("/rlconfig = %d %q, want 200 with the table's text %q", code, body, tab.String())
	}
	if !strings.Contains(body, "web.k: unit=MINUTE requests_per_unit=10") {
		t.Errorf("/rlconfig lacks the k rule:\n%s", body)
	}
	empty := &observe.Debug{Tables: tables{nil}}
	if code, _ := get(t, empty.Handler(), "/rlconfig"); code != http.StatusServiceUnavailable {
		t.Errorf("/rlconfig without a config = %d, want 503", code)
	}
}

func TestDebug_Keys(t *testing.T) {
	m := &keyMap{keys: map[string]store.Decision{
		"web|k=a|fw:60s":        {Limit: 10, Remaining: 7, ResetAfter: 30 * time.Second},
		"web|k=b|fw:60s":        {Limit: 10, Remaining: 10, ResetAfter: 45 * time.Second},
		"web|path=%2F|fw:1s":    {Limit: 3, Remaining: 0, ResetAfter: time.Second},
		"other|k=a|fw:60s":      {Limit: 1, Remaining: 0},
		"w%7Cx|k=a|tb:1/1s:100": {Limit: 100, Remaining: 99, ResetAfter: 10 * time.Millisecond},
	}}
	d := &observe.Debug{Keys: m, Clock: storetest.NewClock(t0), Tables: tables{loadTable(t, limits)}}
	h := d.Handler()
	list := func(url string) observe.KeyList {
		t.Helper()
		code, body := get(t, h, url)
		if code != http.StatusOK {
			t.Fatalf("%s = %d %s", url, code, body)
		}
		var l observe.KeyList
		if err := json.Unmarshal([]byte(body), &l); err != nil {
			t.Fatalf("%s: %v\n%s", url, err, body)
		}
		return l
	}
	l := list("/debug/keys?domain=web&prefix=k%3D")
	if m.gotPref != "web|k=" || m.gotNow != t0 {
		t.Errorf("ranged prefix %q at %d, want %q at the clock's %d", m.gotPref, m.gotNow, "web|k=", t0)
	}
	want := []observe.KeyInfo{{Key: "web|k=a|fw:60s", Limit: 10, Remaining: 7, ResetS: 30}, {Key: "web|k=b|fw:60s", Limit: 10, Remaining: 10, ResetS: 45}}
	if len(l.Keys) != 2 || l.Keys[0] != want[0] || l.Keys[1] != want[1] || l.Truncated || l.Limit != observe.DefaultKeyLimit {
		t.Errorf("keys = %+v, want %+v, not truncated, limit %d", l, want, observe.DefaultKeyLimit)
	}
	if l := list("/debug/keys?domain=web&limit=2"); len(l.Keys) != 2 || !l.Truncated {
		t.Errorf("3 keys with limit 2: %+v, want 2 keys, truncated", l)
	}
	if l := list("/debug/keys?domain=w|x"); len(l.Keys) != 1 || l.Keys[0].Key != "w%7Cx|k=a|tb:1/1s:100" {
		t.Errorf("escaped domain: %+v, want its one key", l)
	}
	if l := list("/debug/keys?domain=none"); len(l.Keys) != 0 || l.Keys == nil {
		t.Errorf("unknown domain: %+v, want an empty list", l)
	}
	noConfig := &observe.Debug{Keys: m, Tables: tables{nil}}
	if code, body := get(t, noConfig.Handler(), "/debug/keys?domain=web"); code != http.StatusOK || !strings.Contains(body, `"keys": []`) {
		t.Errorf("/debug/keys before a config = %d %s, want 200 with no keys", code, body)
	}
	for _, url := range []string{"/debug/keys", "/debug/keys?domain=web&limit=0", "/debug/keys?domain=web&limit=1001", "/debug/keys?domain=web&limit=x"} {
		if code, _ := get(t, h, url); code != http.StatusBadRequest {
			t.Errorf("%s = %d, want 400", url, code)
		}
	}
	none := &observe.Debug{}
	if code, _ := get(t, none.Handler(), "/debug/keys?domain=web"); code != http.StatusNotImplemented {
		t.Errorf("/debug/keys without a KeyRanger = %d, want 501", code)
	}
}

func TestDebug_PprofAndBuild(t *testing.T) {
	d := &observe.Debug{Tables: tables{}, Build: observe.Build{Version: "v1.2.3", Commit: "abc123"}}
	h := d.Handler()
	if code, body := get(t, h, "/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("/debug/pprof/ = %d, want 200 listing profiles:\n%s", code, body)
	}
	if code, body := get(t, h, "/debug/pprof/goroutine?debug=1"); code != http.StatusOK || !strings.Contains(body, "goroutine profile") {
		t.Errorf("/debug/pprof/goroutine = %d:\n%.200s", code, body)
	}
	if code, body := get(t, h, "/debug/build"); code != http.StatusOK || !strings.HasPrefix(body, "sluice v1.2.3 (commit abc123, go") {
		t.Errorf("/debug/build = %d %q", code, body)
	}
	// pprof's cmdline shows os.Args as they are; the Debug shows Cmdline,
	// which its caller has redacted.
	if code, body := get(t, h, "/debug/pprof/cmdline"); code != http.StatusOK || body != "" {
		t.Errorf("/debug/pprof/cmdline without a Cmdline = %d %q, want nothing", code, body)
	}
	d.Cmdline = []string{"/bin/sluice", "serve", "--redis-password", "xxxxx"}
	if code, body := get(t, d.Handler(), "/debug/pprof/cmdline"); code != http.StatusOK || body != "/bin/sluice\x00serve\x00--redis-password\x00xxxxx" {
		t.Errorf("/debug/pprof/cmdline = %d %q", code, body)
	}
}
