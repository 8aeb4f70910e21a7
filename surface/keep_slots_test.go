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
	inFlight := func() int64 {
		t.Helper()
		n, err := client.Get(ctx, key).Int64()
		if errors.Is(err, redis.Nil) {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
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
