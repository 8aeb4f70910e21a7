package tollgate

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// TestSlotsOfKilledInstance: two Caddy processes share a concurrency
// limit of 3 on Redis. B holds one long request, A two; A is killed
// (SIGKILL) with its two in flight. While B's traffic keeps acquiring in
// the bucket, A's slots stay taken for their lease (RedisSlotLease, one
// minute from their acquire), then the next acquire gives them back; B's
// long request, which renews its lease, keeps its slot throughout. In
// the end Redis counts exactly what is in flight: B's long request, then
// nothing. Before the leases, the counter kept A's slots for as long as
// B's acquires kept setting its TTL again. The test waits the real
// minute.
func TestSlotsOfKilledInstance(t *testing.T) {
	redistest.RequireBinaries(t)
	if testing.Short() {
		t.Skip("waits a slot lease (one minute); skipped with -short")
	}
	t.Parallel()
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)

	var holding atomic.Int64
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hold") != "" {
			holding.Add(1)
			select {
			case <-release:
			case <-r.Context().Done():
			}
			holding.Add(-1)
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer upstream.Close()
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock()

	cfg := fmt.Sprintf(`{
	admin 127.0.0.1:{ADMIN}
	auto_https off
	log {
		output discard
	}
}

http://127.0.0.1:{PORT} {
	rate_limit {
		redis {
			address %s
			timeout 5s
		}
		tenant {http.request.header.X-Tenant}
		policy inflight {
			algorithm concurrency
			limit 3
		}
	}
	reverse_proxy %s
}
`, srv.Addr, strings.TrimPrefix(upstream.URL, "http://"))
	a, b := startCaddyProcess(t, cfg), startCaddyProcess(t, cfg)
	counter := string(limiter.AppendKey(nil, limiter.DefaultPrefix, limiter.Concurrency, "acme", "inflight", ""))
	inFlight := func() int64 {
		t.Helper()
		n, err := client.Get(context.Background(), counter).Int64()
		if errors.Is(err, redis.Nil) {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Held requests outlive testClient's timeout.
	long := &http.Client{}
	hold := func(p *caddyProcess) chan int {
		done := make(chan int, 1)
		go func() {
			req := newGet(t, p.base, "acme")
			req.Header.Set("X-Hold", "1")
			res, err := long.Do(req)
			if err != nil {
				done <- 0
				return
			}
			res.Body.Close()
			done <- res.StatusCode
		}()
		return done
	}
	waitHolding := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for holding.Load() != n {
			if time.Now().After(deadline) {
				t.Fatalf("upstream holds %d requests, want %d", holding.Load(), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	longB := hold(b)
	waitHolding(1)
	hold(a)
	hold(a)
	waitHolding(3)
	acquired := time.Now() // A's slots were taken before this
	if got := inFlight(); got != 3 {
		t.Fatalf("in flight %d, want 3", got)
	}
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.waitExit(10 * time.Second); !ok {
		t.Fatal("A did not exit after SIGKILL")
	}
	waitHolding(1) // A's upstream connections closed with it

	// B's traffic: one short request every 500 ms.
	var firstAdmitted time.Duration
	for firstAdmitted == 0 {
		status, err := tenantGet(t, b.base, "acme")
		since := time.Since(acquired)
		switch {
		case err != nil:
			t.Fatal(err)
		case status == http.StatusOK:
			firstAdmitted = since
		case status != http.StatusTooManyRequests:
			t.Fatalf("B answered %d, want 200 or 429", status)
		case since > limiter.RedisSlotLease+15*time.Second:
			t.Fatalf("still denied %v after A's acquires, want its slots back after %v", since, limiter.RedisSlotLease)
		}
		time.Sleep(500 * time.Millisecond)
	}
	// A's acquires ran a little before acquired was read (the time the
	// upstream took to see them): a few seconds' margin.
	if firstAdmitted < limiter.RedisSlotLease-5*time.Second {
		t.Fatalf("B admitted %v after A's acquires, before their lease (%v) ended", firstAdmitted, limiter.RedisSlotLease)
	}
	t.Logf("A's slots given back %v after its acquires", firstAdmitted)
	// B's long request kept its slot: Redis counts it, and only it (once
	// the admitted probe's release, which may follow its response, ran),
	// and two more fit.
	waitInFlight := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for inFlight() != want {
			if time.Now().After(deadline) {
				t.Fatalf("in flight %d, want %d", inFlight(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitInFlight(1)
	for range 2 {
		hold(b)
	}
	waitHolding(3)
	if status, err := tenantGet(t, b.base, "acme"); err != nil || status != http.StatusTooManyRequests {
		t.Fatalf("a fourth request: %d %v, want 429", status, err)
	}
	unblock()
	if status := <-longB; status != http.StatusOK {
		t.Fatalf("B's long request answered %d, want 200", status)
	}
	waitHolding(0)
	waitInFlight(0)
	index := "rl:held:{acme}:inflight"
	if n := client.ZCard(context.Background(), index).Val(); n != 0 {
		t.Fatalf("%s lists %d holds after every request ended, want 0", index, n)
	}
}
