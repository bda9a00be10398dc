package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/observe/ui"
	"github.com/sluicehq/sluice/store/memcache"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/split"
)

// The status page on the HTTP port (observe/ui). It registers after the
// observability extension (files initialise in name order), whose per-rule
// counters it shows.
func init() {
	registerExtension("ui", func(fs *flag.FlagSet) extensionSetup {
		f := &uiFlags{}
		f.register(fs)
		return f.setup
	})
}

type uiFlags struct {
	on     bool
	prefix string
	fs     *flag.FlagSet
}

func (f *uiFlags) register(fs *flag.FlagSet) {
	f.fs = fs
	fs.BoolVar(&f.on, "ui", true, "serve the read-only status page and its demo on the HTTP port")
	fs.StringVar(&f.prefix, "ui-prefix", "", "serve the status page under this path `prefix` (e.g. /sluice) instead of at /, for a reverse proxy that does not strip it")
}

func (f *uiFlags) setup(_ context.Context, x *serveContext) error {
	if !f.on {
		return nil
	}
	prefix := strings.TrimSuffix(f.prefix, "/")
	if prefix != "" && (!strings.HasPrefix(prefix, "/") || strings.ContainsAny(prefix, "{}? #")) {
		return fmt.Errorf("--ui-prefix %q: want a path such as /sluice", f.prefix)
	}
	rules := perRule(x)
	if rules == nil {
		return errors.New("the status page needs the per-rule counters")
	}
	traffic := ui.NewTraffic(rules, time.Second, ui.DefaultWindow)
	if err := ui.RegisterMetrics(x.Registry, traffic); err != nil {
		return err
	}
	x.Run = append(x.Run, traffic.Run)
	src := ui.Source{Kind: "file", Location: flagValue(f.fs, "config")}
	if flagValue(f.fs, "config-source") == "xds" {
		src = ui.Source{Kind: "xds", Location: shownValue("xds-server", flagValue(f.fs, "xds-server"))}
	}
	var counters http.Handler
	if x.Counters != nil { // registered before the page (file name order)
		counters = x.Counters
	}
	var q observe.QuotaStatser
	if x.Quota != nil { // RLQS registers before the page (file name order)
		q = x.Quota
	}
	opts := ui.Options{
		Quota:  q,
		Tables: x.Config,
		Reload: x.Config,
		Source: func() ui.Source {
			s := src
			s.Version = x.Config.Status().Version
			return s
		},
		Traffic:  traffic,
		Store:    storeStatus(x, f.fs),
		Serving:  x.Health.Serving,
		Build:    observe.Build{Version: buildVersion(), Commit: buildCommit()},
		Started:  time.Now(),
		Counters: counters,
		Resets:   x.Counters != nil && x.Counters.Resets(),
	}
	if x.Config.HasOverlay() {
		opts.Overlay = x.Config.OverlayStatus
	}
	page, err := ui.New(opts)
	if err != nil {
		return err
	}
	h := x.HTTPBounds.browser(page.Handler())
	if prefix == "" {
		x.HTTP.Handle("/", h)
		return nil
	}
	x.HTTP.Handle(prefix+"/", http.StripPrefix(prefix, h))
	x.HTTP.Handle(prefix, http.RedirectHandler(prefix+"/", http.StatusMovedPermanently))
	return nil
}

// storeStatus describes the serving store for the page.
func storeStatus(x *serveContext, fs *flag.FlagSet) func() ui.StoreStatus {
	switch st := x.Store.(type) {
	case *memory.Store:
		return ui.MemoryStatus(st)
	case *redis.Store:
		return redisStatus(st, redisDeployment(fs, "redis"), "")
	case *split.Store:
		// The per-second Redis's rows follow the main one's, named so.
		m, o := st.Stores()
		main := redisStatus(m.(*redis.Store), redisDeployment(fs, "redis"), "")
		other := redisStatus(o.(*redis.Store), redisDeployment(fs, "redis-persecond"), "per-second ")
		return func() ui.StoreStatus {
			s, p := main(), other()
			s.Healthy = s.Healthy && p.Healthy
			s.Stats = append(s.Stats, p.Stats...)
			s.Stats = append(s.Stats, ui.Stat{Name: "per-second refund failures", Value: fmt.Sprint(st.Stats().RefundFailures)})
			return s
		}
	case *memcache.Store:
		return func() ui.StoreStatus {
			s := st.Stats()
			return ui.StoreStatus{Kind: "memcache", Healthy: s.Healthy, Stats: []ui.Stat{
				{Name: "servers", Value: strings.Join(s.Servers, ", ")},
				{Name: "cas retries", Value: fmt.Sprint(s.CASRetries)},
				{Name: "cas exhausted", Value: fmt.Sprint(s.CASExhausted)},
				{Name: "rollback failures", Value: fmt.Sprint(s.RollbackFailures)},
			}}
		}
	}
	return nil
}

// redisStatus describes st, deployed where, for the page, each row's name
// after prefix.
func redisStatus(st *redis.Store, where []ui.Stat, prefix string) func() ui.StoreStatus {
	for i := range where {
		where[i].Name = prefix + where[i].Name
	}
	return func() ui.StoreStatus {
		s, now := st.Stats(), st.Status()
		stats := append(where[:len(where):len(where)],
			ui.Stat{Name: prefix + "state", Value: string(now.State)},
			ui.Stat{Name: prefix + "breaker", Value: now.Breaker},
			ui.Stat{Name: prefix + "latency", Value: now.LastLatency.Round(time.Microsecond).String()})
		if !now.OutageStart.IsZero() {
			stats = append(stats, ui.Stat{Name: prefix + "down since", Value: now.OutageStart.UTC().Format(time.RFC3339)})
		}
		if now.LastError != "" {
			stats = append(stats, ui.Stat{Name: prefix + "last error", Value: now.LastError})
		}
		stats = append(stats,
			ui.Stat{Name: prefix + "failed takes", Value: fmt.Sprint(s.Failed)},
			ui.Stat{Name: prefix + "local cache keys", Value: fmt.Sprint(s.LocalKeys)},
			ui.Stat{Name: prefix + "local answers", Value: fmt.Sprint(s.LocalAnswers)},
			ui.Stat{Name: prefix + "refund failures", Value: fmt.Sprint(s.RefundFailures)})
		return ui.StoreStatus{Kind: "redis", Healthy: s.Healthy, Stats: stats}
	}
}

// redisDeployment describes the Redis flags in force without credentials,
// those of the Redis whose flags begin with prefix ("redis",
// "redis-persecond"): the deployment and its addresses.
func redisDeployment(fs *flag.FlagSet, prefix string) []ui.Stat {
	get := func(name string) string { return shownValue(prefix+name, flagValue(fs, prefix+name)) }
	switch {
	case get("-cluster") != "":
		return []ui.Stat{{Name: "deployment", Value: "cluster"}, {Name: "seeds", Value: get("-cluster")}}
	case get("-sentinel") != "":
		return []ui.Stat{{Name: "deployment", Value: "sentinel"}, {Name: "master", Value: get("-sentinel-master")},
			{Name: "sentinels", Value: get("-sentinel")}}
	}
	addr := "?"
	if u, err := url.Parse(flagValue(fs, prefix+"-url")); err == nil {
		addr = u.Scheme + "://" + u.Host + u.Path // no user or password
	}
	return []ui.Stat{{Name: "deployment", Value: "single"}, {Name: "address", Value: addr}}
}

// flagValue is the value of serve's flag name, "" when it has none.
func flagValue(fs *flag.FlagSet, name string) string {
	if fl := fs.Lookup(name); fl != nil {
		return fl.Value.String()
	}
	return ""
}
