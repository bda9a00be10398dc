package memcache

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzKey: whatever a counter key holds (descriptor values come from
// requests), its memcached key is one memcached accepts, and a key that
// fits is kept as it is.
func FuzzKey(f *testing.F) {
	for _, k := range []string{"d|path=/login|fixed_window|60", "with space", "#abc", "", strings.Repeat("é", 200), "tab\there", "\x7f"} {
		f.Add(k, uint64(1_700_000_000))
	}
	s := &Store{opt: Options{KeyPrefix: "rl_"}}
	f.Fuzz(func(t *testing.T, k string, end uint64) {
		mk := s.key(k, end)
		if len(mk) > maxKeyLen {
			t.Fatalf("key %q: %d bytes", mk, len(mk))
		}
		for i := 0; i < len(mk); i++ {
			if c := mk[i]; c <= ' ' || c == 0x7f {
				t.Fatalf("key %q: byte %d is %#x", mk, i, c)
			}
		}
		suffix := ""
		if end > 0 {
			suffix = "@" + strconv.FormatUint(end, 10)
		}
		if !strings.HasPrefix(mk, "rl_") || !strings.HasSuffix(mk, suffix) {
			t.Fatalf("key %q lacks the prefix or the suffix %q", mk, suffix)
		}
		hashed := strings.HasPrefix(mk, "rl_#")
		if kept := mk == "rl_"+k+suffix; kept == hashed {
			t.Fatalf("key %q of %q: kept %v, hashed %v", mk, k, kept, hashed)
		}
	})
}
