package client_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice/client"
)

// clock is a clock for the examples: it stands still until moved.
type clock struct{ ns atomic.Int64 }

func (c *clock) Now() int64 { return c.ns.Load() }

func ExampleBucket() {
	var c clock
	b, err := client.NewBucket(8, time.Second, 40, &c) // 8 a second, burst 40, starts full
	if err != nil {
		log.Fatal(err)
	}
	admitted := 0
	for range 45 {
		if b.Allow() {
			admitted++
		}
	}
	fmt.Println("admitted at once:", admitted)
	d := b.Take(c.Now(), 1)
	fmt.Println("next token in:", d.RetryAfter)
	c.ns.Add(int64(125 * time.Millisecond))
	fmt.Println("after 125ms:", b.Allow())
	// Output:
	// admitted at once: 40
	// next token in: 125ms
	// after 125ms: true
}

func ExampleBackoff() {
	b := client.Backoff{
		Base: 100 * time.Millisecond,
		Cap:  2 * time.Second,
		Rand: rand.New(rand.NewPCG(1, 2)).Int64N, // seeded for the example
	}
	for range 5 {
		fmt.Println(b.Next(0).Round(time.Millisecond))
	}
	// A server's retry-after is a floor, even above the cap.
	fmt.Println(b.Next(5 * time.Second))
	// Output:
	// 254ms
	// 508ms
	// 1.217s
	// 1.614s
	// 545ms
	// 5s
}

func ExampleRetryBudget() {
	budget, err := client.NewRetryBudget(client.BudgetConfig{Initial: 1})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(budget.Withdraw()) // the initial balance pays for one retry
	fmt.Println(budget.Withdraw()) // refused at once
	for range 10 {
		budget.Deposit() // ten successful first tries
	}
	fmt.Println(budget.Withdraw())
	// Output:
	// true
	// false
	// true
}

func ExampleRetrier_RoundTripper() {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if hits.Add(1) == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "hello")
	}))
	defer srv.Close()

	r := client.NewRetrier(client.RetryConfig{Backoff: client.Backoff{Base: time.Millisecond, Cap: 10 * time.Millisecond}})
	hc := &http.Client{Transport: r.RoundTripper(nil)}
	resp, err := hc.Get(srv.URL)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body), "after", hits.Load(), "attempts")
	// Output: 200 hello after 2 attempts
}

func ExampleRetrier_UnaryClientInterceptor() {
	budget, err := client.NewRetryBudget(client.BudgetConfig{MinPerSecond: 1})
	if err != nil {
		log.Fatal(err)
	}
	pace, err := client.NewBucket(100, time.Second, 20, nil)
	if err != nil {
		log.Fatal(err)
	}
	r := client.NewRetrier(client.RetryConfig{Bucket: pace, Budget: budget})
	conn, err := grpc.NewClient("dns:///api.example.com:443",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(r.UnaryClientInterceptor()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	// Calls on conn now wait for the pace, back off with jitter and stop
	// retrying when the budget runs dry.
}

func ExampleClient_ShouldRateLimit() {
	c, err := client.Dial("localhost:8081")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	r, err := c.ShouldRateLimit(context.Background(), "api",
		[]client.Descriptor{{{Key: "user", Value: "alice"}}}, 1)
	if err != nil {
		log.Printf("sluice did not answer (allowed: %v): %v", r.Allowed, err)
	}
	if !r.Allowed {
		fmt.Printf("over the limit of %d; retry in %v\n", r.Limit, r.RetryAfter)
	}
}

func ExampleClient_UnaryServerInterceptor() {
	c, err := client.Dial("sluice.internal:8081", client.WithFailureMode(client.FailAllow))
	if err != nil {
		log.Fatal(err)
	}
	byCaller := func(method string, md metadata.MD) []client.Descriptor {
		caller := md.Get("x-caller")
		if len(caller) == 0 {
			return nil // not limited
		}
		return []client.Descriptor{{{Key: "method", Value: method}, {Key: "caller", Value: caller[0]}}}
	}
	srv := grpc.NewServer(
		grpc.UnaryInterceptor(c.UnaryServerInterceptor("api", byCaller)),
		grpc.StreamInterceptor(c.StreamServerInterceptor("api", byCaller)),
	)
	_ = srv // register services and Serve
}

func ExampleClient_HTTPMiddleware() {
	c, err := client.Dial("sluice.internal:8081")
	if err != nil {
		log.Fatal(err)
	}
	byPath := func(r *http.Request) []client.Descriptor {
		return []client.Descriptor{{{Key: "path", Value: r.URL.Path}}}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	log.Fatal(http.ListenAndServe(":8080", c.HTTPMiddleware("web", byPath)(mux)))
}

func ExampleClient_Limiter() {
	c, err := client.Dial("sluice.internal:8081")
	if err != nil {
		log.Fatal(err)
	}
	perMethod := func(method string, _ metadata.MD) []client.Descriptor {
		return []client.Descriptor{{{Key: "method", Value: method}}}
	}
	// For users of go-grpc-middleware's ratelimit package. Its errors
	// lose the RetryInfo detail; UnaryServerInterceptor keeps it.
	srv := grpc.NewServer(grpc.UnaryInterceptor(ratelimit.UnaryServerInterceptor(c.Limiter("api", perMethod))))
	_ = srv
}
