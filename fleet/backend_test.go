package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// TestAnyBreakerOpen: the process-wide breaker state is that of the
// backends in use: a backend released while its breaker is open no
// longer counts (caddy_rate_limit_breaker_open stayed at 1 for good after
// a reload during an outage).
func TestAnyBreakerOpen(t *testing.T) {
	if AnyBreakerOpen() {
		t.Fatal("a breaker is open before any backend exists")
	}
	down, err := Acquire(BackendOptions{Connection: Connection{Addresses: []string{"127.0.0.1:1"}, Timeout: 100 * time.Millisecond},
		Prefix: "brk", BreakerFailures: 1, BreakerCooldown: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c := limiter.Check{Algorithm: limiter.TokenBucket, Tenant: "t", Policy: "p", Rate: limiter.Rate{Limit: 1, Window: time.Second}, Cost: 1}
	_, _ = down.Store().Decide(context.Background(), []limiter.Check{c}, make([]limiter.Result, 1))
	if !down.Store().Open() || !AnyBreakerOpen() {
		t.Fatalf("breaker open %v, any open %v after a failed call", down.Store().Open(), AnyBreakerOpen())
	}
	if err := down.Release(); err != nil {
		t.Log(err)
	}
	if AnyBreakerOpen() {
		t.Fatal("a released backend's open breaker still counts")
	}
}
