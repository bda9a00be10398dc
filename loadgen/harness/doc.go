// Package harness runs and watches the processes of the load runs
// (`make soak`, `make soak-churn`, `make bench-load`): a redis-server that
// can be killed and started again on its port, `sluice serve` (and
// `sluice bench --noop-listen`) processes started on port 0 whose
// addresses are read from their logs, what /proc and a Prometheus
// endpoint tell about a process (`sluice bench --rlqs` reads the
// replicas' /metrics with it too), and the intervals while Redis was
// down.
//
// It is for programs, not tests: errors are returned, children are
// killed with the program (Pdeathsig on Linux), and nothing here takes
// a testing.TB.
package harness
