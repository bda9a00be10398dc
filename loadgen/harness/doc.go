// Package harness runs and watches the processes of the long load runs
// (`make soak`, `make soak-churn`): a redis-server that can be killed and
// started again on its port, `sluice serve` processes started on port 0
// whose addresses are read from their logs, what /proc and a Prometheus
// endpoint tell about a process, and the intervals while Redis was down.
//
// It is for programs, not tests: errors are returned, children are
// killed with the program (Pdeathsig on Linux), and nothing here takes
// a testing.TB.
package harness
