package xds

import (
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sluicehq/sluice/config/xds/xdstest"
	"github.com/sluicehq/sluice/internal/logbuf"
)

// TestClient_IgnoredFields: a field of a newer control plane's proto,
// which the client cannot use, is named in a WARN and counted once per
// config version: when the config is compiled, and when the same config
// comes again under a new version; a config without one reports nothing.
func TestClient_IgnoredFields(t *testing.T) {
	s := xdstest.Start(t, "127.0.0.1:0", nil)
	var mu sync.Mutex
	var got []string
	logs := &logbuf.Buffer{}
	r, updates := run(t, Options{Server: s.Addr, Logger: slog.New(slog.NewTextHandler(logs, nil)), OnIgnoredField: func(f string) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, f)
	}})
	calls := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
	newer := limits("eg/http", "http", 10)
	m := newer.Descriptors[0].ProtoReflect()
	m.SetUnknown(protoreflect.RawFields(protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 1)))
	const field = "ratelimit.config.ratelimit.v3.RateLimitDescriptor.9"

	s.Push(t, nodeID, "1", newer)
	if err := update(t, updates); err != nil {
		t.Fatal(err)
	}
	if limitOf(r, "http") != 10 {
		t.Fatalf("limit %d, want 10: the config applies without the field", limitOf(r, "http"))
	}
	if ack := s.Reply(t); ack.GetVersionInfo() != "1" || ack.GetErrorDetail() != nil {
		t.Fatalf("ACK %v, want version 1", ack)
	}
	if c := calls(); !slices.Equal(c, []string{field}) {
		t.Fatalf("OnIgnoredField got %q, want %q once", c, field)
	}
	if l := logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "fields=["+field+"]") || !strings.Contains(l, "version=1") {
		t.Fatalf("no WARN naming the field for version 1:\n%s", l)
	}

	// The same config under a new version: reported again.
	s.Push(t, nodeID, "2", newer)
	if ack := s.Reply(t); ack.GetVersionInfo() != "2" || ack.GetErrorDetail() != nil {
		t.Fatalf("ACK %v, want version 2", ack)
	}
	if c := calls(); !slices.Equal(c, []string{field, field}) {
		t.Fatalf("OnIgnoredField got %q, want %q twice", c, field)
	}
	if !strings.Contains(logs.String(), "version=2 fields=["+field+"]") {
		t.Fatalf("no WARN for version 2:\n%s", logs)
	}

	// A config without one: nothing more.
	s.Push(t, nodeID, "3", limits("eg/http", "http", 11))
	if err := update(t, updates); err != nil {
		t.Fatal(err)
	}
	if ack := s.Reply(t); ack.GetVersionInfo() != "3" {
		t.Fatalf("ACK %v, want version 3", ack)
	}
	if c := calls(); len(c) != 2 || strings.Contains(logs.String(), "version=3 fields") {
		t.Fatalf("OnIgnoredField got %q after a config without unknown fields:\n%s", c, logs)
	}
}
