package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/loadgen"
)

// noop serves loadgen.Noop on a loopback port until the test ends.
func noop(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- loadgen.ServeNoop(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeNoop: %v", err)
		}
	})
	return lis.Addr().String()
}

func TestBench_JSON(t *testing.T) {
	addr := noop(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := Main(ctx, []string{"bench", "--addr", addr, "--workload", "multi", "--keys", "5", "--concurrency", "3",
		"--connections", "2", "--duration", "1s", "--warmup", "50ms", "--json"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
	}
	var out struct {
		Workload     string             `json:"workload"`
		Keys         int                `json:"keys"`
		Requests     uint64             `json:"requests"`
		RPS          float64            `json:"rps"`
		GRPCCodes    map[string]uint64  `json:"grpc_codes"`
		OverallCodes map[string]uint64  `json:"overall_codes"`
		Mismatches   uint64             `json:"status_mismatches"`
		LatencyUS    map[string]float64 `json:"latency_us"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("output does not parse as JSON: %v\n%s", err, stdout.String())
	}
	if out.Workload != "multi" || out.Keys != 5 {
		t.Errorf("workload %q keys %d, want multi 5", out.Workload, out.Keys)
	}
	if out.Requests == 0 || out.GRPCCodes["OK"] != out.Requests || out.OverallCodes["OK"] != out.Requests || out.Mismatches != 0 {
		t.Errorf("requests %d, grpc codes %v, overall %v, mismatches %d: want every request OK with 4 statuses",
			out.Requests, out.GRPCCodes, out.OverallCodes, out.Mismatches)
	}
	for _, q := range []string{"p50", "p90", "p99", "p99_9", "max", "mean"} {
		if out.LatencyUS[q] <= 0 {
			t.Errorf("latency_us.%s = %v, want > 0", q, out.LatencyUS[q])
		}
	}
}

func TestBench_Text(t *testing.T) {
	addr := noop(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := Main(ctx, []string{"bench", "--addr", addr, "--workload", "hot", "--concurrency", "2",
		"--duration", "500ms", "--warmup", "0s", "--rate", "100"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
	}
	for _, want := range []string{"workload hot", "open loop at 100/s", "grpc codes  OK ", "overall     OK ", "p99.9", "from send mean"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
}

func TestBench_BadFlags(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, args := range [][]string{
		{"--workload", "nope"},
		{"--workload", "file"},
		{"--request-file", "x.json"},
		{"--concurrency", "0"},
		{"--rate", "-1"},
		{"--tls-cert", "c.pem"},
		{"extra"},
	} {
		var stdout, stderr bytes.Buffer
		if code := Main(ctx, append([]string{"bench"}, args...), &stdout, &stderr); code != 2 {
			t.Errorf("bench %v: exit %d, want 2 (stderr %q)", args, code, stderr.String())
		}
	}
}

func TestBench_NoopListen(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srvCtx, stop := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- Main(srvCtx, []string{"bench", "--noop-listen", "127.0.0.1:0"}, io.Discard, pw)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the no-op server's first line: %v", err)
	}
	go io.Copy(io.Discard, pr)
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "no-op RLS server listening on ")
	if !ok {
		t.Fatalf("first line %q does not name the address", line)
	}
	var stdout, stderr bytes.Buffer
	if code := Main(ctx, []string{"bench", "--addr", addr, "--duration", "1s", "--warmup", "0s", "--json"}, &stdout, &stderr); code != 0 {
		t.Fatalf("bench against the no-op server: exit %d, stderr:\n%s", code, stderr.String())
	}
	var out struct{ Requests, Keys uint64 }
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil || out.Requests == 0 || out.Keys != 1000 {
		t.Errorf("bench output %s (err %v): want requests > 0 and the default 1000 keys", stdout.String(), err)
	}
	stop()
	if code := <-done; code != 0 {
		t.Errorf("no-op server exit %d after cancel, want 0", code)
	}
}
