package limiter_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/storetest"
)

func ExampleLimiter_Check() {
	dir, _ := os.MkdirTemp("", "limits")
	defer os.RemoveAll(dir)
	os.WriteFile(filepath.Join(dir, "limits.yaml"), []byte(`
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, name: per_user}
`), 0o644)
	table, err := config.Load(dir, config.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	// A fixed clock keeps the example's window from ending mid-way;
	// production leaves Clock nil (the system clock).
	clock := storetest.NewClock(time.Date(2026, 1, 1, 12, 0, 30, 0, time.UTC).UnixNano())
	lim := limiter.New(tables{table}, memory.New(memory.Options{}), limiter.Options{Clock: clock})

	req := &limiter.Request{Domain: "api", Descriptors: []limiter.Descriptor{
		{Entries: []config.Entry{{Key: "user", Value: "alice"}}},
	}}
	var resp limiter.Response
	for range 3 {
		if err := lim.Check(context.Background(), req, &resp); err != nil {
			fmt.Println(err)
			return
		}
		st := &resp.Statuses[0]
		fmt.Println(resp.Overall, st.Name, st.RequestsPerUnit, st.Unit, st.Remaining(), st.ResetAfter())
	}
	// Output:
	// OK per_user 2 minute 1 30s
	// OK per_user 2 minute 0 30s
	// OVER_LIMIT per_user 2 minute 0 30s
}
