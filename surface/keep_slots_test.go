package surface

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/internal/caddyreq"
	"github.com/tollgate/caddy-tollgate/internal/redistest"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// unitsIn is what the concurrency counter key holds: units in flight.
func unitsIn(t *testing.T, client *redis.Client, key string) int64 {
	t.Helper()
	n, err := client.Get(context.Background(), key).Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestServeKeepsSlotsAlive: a request that holds a concurrency slot on
// Redis longer than its counter's idle TTL keeps the counter alive for as
// long as the rest of the chain runs, and gives the slot back when it
// returns. The counter's TTL is cut to 300 ms to stand for its 10 minutes,
// and the keeping runs every 100 ms instead of every 20 seconds.
func TestServeKeepsSlotsAlive(t *testing.T) {
	defer func(every time.Duration) { keepSlotsEvery = every }(keepSlotsEvery)
	keepSlotsEvery = 100 * time.Millisecond
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	h := provisionServer(t, `{"tenant":"{http.request.header.X-Tenant}","rate_limits":{"streams":{"algorithm":"concurrency","max_events":1}}}`)
	rs := limiter.NewRedisStore(limiter.RedisOptions{Client: client, Timeout: time.Second})
	h.gate.Store.(*gate.Memory).Use(rs)

	ctx := context.Background()
	key := string(limiter.AppendKey(nil, limiter.DefaultPrefix, limiter.Concurrency, "acme", "streams", ""))
	inFlight := func() int64 { t.Helper(); return unitsIn(t, client, key) }
	running, finish := make(chan struct{}), make(chan struct{})
	stream := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		close(running)
		<-finish
		return nil
	})
	done := make(chan error, 1)
	go func() {
		w := httptest.NewRecorder()
		done <- h.ServeHTTP(w, caddyreq.New(w, "acme"), stream)
	}()
	<-running
	if !client.PExpire(ctx, key, 300*time.Millisecond).Val() {
		t.Fatalf("no counter %s while the request runs", key)
	}
	time.Sleep(700 * time.Millisecond)
	if got := inFlight(); got != 1 {
		t.Errorf("in flight %d after the counter's TTL passed while the request ran, want 1", got)
	}
	if ttl := client.PTTL(ctx, key).Val(); ttl < limiter.RedisConcurrencyTTL-time.Minute {
		t.Errorf("counter PTTL %v while the request runs, want about %v", ttl, limiter.RedisConcurrencyTTL)
	}
	close(finish)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := inFlight(); got != 0 {
		t.Errorf("in flight %d after the request returned, want 0", got)
	}
}

// TestServeKeepsSlotsWhileWaitingForTurn: a request admitted with a turn
// to wait for (a `delay` policy beside a concurrency one) holds its slot
// from the decision on, so it keeps the slot alive while it waits, not
// only once it runs. (The keeping started after the wait: a wait longer
// than a slot's lease lost the slot to the next acquire, and the bucket
// ran more requests than its limit.) The counter's TTL is cut to 300 ms
// during a wait of about 1.5 s; the keeping runs every 100 ms.
func TestServeKeepsSlotsWhileWaitingForTurn(t *testing.T) {
	defer func(every time.Duration) { keepSlotsEvery = every }(keepSlotsEvery)
	keepSlotsEvery = 100 * time.Millisecond
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	h := provisionServer(t, `{"tenant":"{http.request.header.X-Tenant}","rate_limits":{
		"streams":{"algorithm":"concurrency","max_events":2},
		"paced":{"algorithm":"token_bucket","max_events":1,"window":"1500ms","delay":"10s"}}}`)
	rs := limiter.NewRedisStore(limiter.RedisOptions{Client: client, Timeout: time.Second})
	h.gate.Store.(*gate.Memory).Use(rs)

	ctx := context.Background()
	key := string(limiter.AppendKey(nil, limiter.DefaultPrefix, limiter.Concurrency, "acme", "streams", ""))
	inFlight := func() int64 { t.Helper(); return unitsIn(t, client, key) }
	quick := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	w := httptest.NewRecorder()
	if err := h.ServeHTTP(w, caddyreq.New(w, "acme"), quick); err != nil { // takes the token
		t.Fatal(err)
	}

	running, finish := make(chan struct{}), make(chan struct{})
	paced := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		close(running)
		<-finish
		return nil
	})
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		w := httptest.NewRecorder()
		done <- h.ServeHTTP(w, caddyreq.New(w, "acme"), paced)
	}()
	// Admitted with its turn about 1.5 s away: its slot is taken.
	deadline := time.Now().Add(time.Second)
	for inFlight() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the paced request took no slot")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !client.PExpire(ctx, key, 300*time.Millisecond).Val() {
		t.Fatalf("no counter %s while the request waits", key)
	}
	<-running
	if waited := time.Since(start); waited < time.Second {
		t.Fatalf("the request ran after %v, want it to wait for its turn (about 1.5 s)", waited)
	}
	if got := inFlight(); got != 1 {
		t.Errorf("in flight %d once the request's turn came, want 1: its slot went while it waited", got)
	}
	close(finish)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := inFlight(); got != 0 {
		t.Errorf("in flight %d after the request returned, want 0", got)
	}
}
