package memory

import (
	"testing"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/storetest"
)

func TestStore(t *testing.T) {
	storetest.Run(t, func(*testing.T) store.Store { return New(Options{}) })
}
