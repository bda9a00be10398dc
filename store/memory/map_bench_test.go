package memory

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/puzpuzpuz/xsync/v4"
)

// These benchmarks chose the map: sync.Map against xsync.Map for the two
// operations the store does, a lookup of an existing key and the insertion
// of a new one. See docs/STORE.md for the figures.

var mapKeys = func() []string {
	k := make([]string, 1<<16)
	for i := range k {
		k[i] = "domain|path|key_" + strconv.Itoa(i) + "|minute"
	}
	return k
}()

func BenchmarkMapLoad(b *testing.B) {
	b.Run("sync.Map", func(b *testing.B) {
		var m sync.Map
		for _, k := range mapKeys {
			m.Store(k, new(cell))
		}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				v, _ := m.Load(mapKeys[i&(len(mapKeys)-1)])
				v.(*cell).state.Load()
				i++
			}
		})
	})
	b.Run("xsync.Map", func(b *testing.B) {
		m := xsync.NewMap[string, *cell]()
		for _, k := range mapKeys {
			m.Store(k, new(cell))
		}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				v, _ := m.Load(mapKeys[i&(len(mapKeys)-1)])
				v.state.Load()
				i++
			}
		})
	})
}

func BenchmarkMapInsert(b *testing.B) {
	var n atomic.Int64
	b.Run("sync.Map", func(b *testing.B) {
		var m sync.Map
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				m.LoadOrStore(strconv.FormatInt(n.Add(1), 10), new(cell))
			}
		})
	})
	b.Run("xsync.Map", func(b *testing.B) {
		m := xsync.NewMap[string, *cell]()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				m.LoadOrStore(strconv.FormatInt(n.Add(1), 10), new(cell))
			}
		})
	})
}
