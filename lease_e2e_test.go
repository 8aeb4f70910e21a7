package tollgate

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// leaseSite: policy "hold" (limit 1000/h, lease 50 for an hour) on /hold,
// policy "small" (limit 3/h) on /small, both leasing, with metrics on
// /metrics.
func leaseSite(redisAddr string) string {
	return metricsSite(fmt.Sprintf(`
			redis {
				address %s
				timeout 5s
			}
			tenant {http.request.header.X-Tenant}
			lease 50 1h
			policy hold {
				match {
					path /hold*
				}
				algorithm fixed_window
				limit 1000
				window 1h
			}
			policy small {
				match {
					path /small*
				}
				algorithm fixed_window
				limit 3
				window 1h
			}`, redisAddr))
}

// TestLeaseEndToEnd: through Caddy on Redis, leases are visible in the
// status route and the metrics, denials are answered from the cache, a
// reset drops the local lease, and a config reload gives every leased
// unit back.
func TestLeaseEndToEnd(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	s := startCaddyAdmin(t, "", leaseSite(srv.Addr), nil)
	store := limiter.NewRedisStore(limiter.RedisOptions{Client: srv.Client(t), Timeout: 5 * time.Second})
	inRedis := func(tenant string) int64 {
		t.Helper()
		res := make([]limiter.Result, 1)
		c := limiter.Check{Algorithm: limiter.FixedWindow, Tenant: tenant, Policy: "hold", Rate: limiter.Rate{Limit: 1000, Window: time.Hour}}
		if err := store.Peek(context.Background(), []limiter.Check{c}, res); err != nil {
			t.Fatal(err)
		}
		return res[0].Remaining
	}
	// No hour boundary in the middle of the test (fixed windows).
	if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < 30*time.Second {
		time.Sleep(left + time.Second)
	}
	before := scrapeMetrics(t, s.base+"/metrics")

	// 30 requests: Remaining counts down exactly; Redis has charged more
	// (the units leased here).
	for i := 1; i <= 30; i++ {
		r := s.get("/hold", "X-Tenant", "acme")
		if r.status != http.StatusOK || r.header.Get("X-RateLimit-Remaining") != fmt.Sprint(1000-i) {
			t.Fatalf("request %d: %d, remaining %q", i, r.status, r.header.Get("X-RateLimit-Remaining"))
		}
	}
	held := 1000 - 30 - inRedis("acme")
	if held <= 0 {
		t.Fatalf("Redis has %d left after 30 requests: nothing leased", inRedis("acme"))
	}

	st := s.adminOK("GET", "/rate_limit/status", "")
	var lease map[string]any
	for _, p := range st["handlers"].([]any)[0].(map[string]any)["policies"].([]any) {
		if pm := p.(map[string]any); pm["name"] == "hold" {
			lease, _ = pm["lease"].(map[string]any)
		}
	}
	// The first request is decided, not leased (a lease of one request's
	// worth is a decision); the 29 after it are served from leases.
	if lease == nil || lease["max_tokens"] != 50.0 || lease["ttl"] != "1h0m0s" || lease["spent"] != 29.0 ||
		lease["units"] != float64(held) || lease["acquired"] != float64(29+held) {
		t.Fatalf("status lease of hold: %v (held %d)", lease, held)
	}

	// Denials: the first asks Redis, the next ones are answered locally.
	if c := s.statuses(10, "/small", "X-Tenant", "acme"); c[200] != 3 || c[429] != 7 {
		t.Fatalf("small: %v", c)
	}
	m := scrapeMetrics(t, s.base+"/metrics")
	const dur, units = "caddy_rate_limit_decision_duration_seconds", "caddy_rate_limit_lease_units_total"
	if got := m.delta(before, dur, "policy", "small", "source", "cache"); got != 6 {
		t.Errorf("small: %v decisions from the denial cache, want 6", got)
	}
	// The event label takes exactly the four documented values (a lost
	// grant counts as acquired and expired).
	for _, policy := range []string{"hold", "small"} {
		if got, want := m.labelValues(units, "event", "policy", policy), []string{"acquired", "expired", "returned", "spent"}; !slices.Equal(got, want) {
			t.Errorf("%s: lease event values %v, want %v", policy, got, want)
		}
	}
	if got := m.delta(before, units, "policy", "hold", "event", "spent"); got != 29 {
		t.Errorf("hold: %v units spent, want 29", got)
	}
	if got := m.delta(before, units, "policy", "hold", "event", "acquired"); got != float64(29+held) {
		t.Errorf("hold: %v units acquired, want %d", got, 29+held)
	}
	if got := m.delta(before, dur, "policy", "hold", "source", "lease"); got < 20 {
		t.Errorf("hold: %v decisions served from the lease", got)
	}

	// A runtime override that raises the limit takes effect at once: the
	// cached denial belongs to the old limit.
	s.adminOK("PUT", "/rate_limit/overrides", `{"tenant":"beta","policy":"small","max_events":3,"window":"1h"}`)
	if c := s.statuses(4, "/small", "X-Tenant", "beta"); c[200] != 3 || c[429] != 1 {
		t.Fatalf("small for beta: %v", c)
	}
	s.adminOK("PUT", "/rate_limit/overrides", `{"tenant":"beta","policy":"small","max_events":5,"window":"1h"}`)
	if c := s.statuses(3, "/small", "X-Tenant", "beta"); c[200] != 2 || c[429] != 1 {
		t.Fatalf("small for beta after raising its limit to 5: %v, want 2 more admitted", c)
	}

	// Reset: the local lease of the tenant goes with the Redis bucket.
	s.adminOK("POST", "/rate_limit/reset?tenant=acme", "")
	if r := s.get("/hold", "X-Tenant", "acme"); r.header.Get("X-RateLimit-Remaining") != "999" {
		t.Fatalf("after reset: remaining %q", r.header.Get("X-RateLimit-Remaining"))
	}
	if r := s.get("/small", "X-Tenant", "acme"); r.status != http.StatusOK {
		t.Fatalf("after reset, the cached denial was kept: %d", r.status)
	}

	// Reload: the old handler gives every leased unit back.
	for range 29 {
		s.get("/hold", "X-Tenant", "acme")
	}
	if inRedis("acme") >= 1000-30 {
		t.Fatal("nothing leased before the reload")
	}
	s.load("", leaseSite(srv.Addr), nil)
	if got := inRedis("acme"); got != 1000-30 {
		t.Fatalf("after reload Redis has %d left, want %d", got, 1000-30)
	}
	after := scrapeMetrics(t, s.base+"/metrics")
	if got := after.delta(before, units, "policy", "hold", "event", "returned"); got < 1 {
		t.Errorf("hold: %v units returned", got)
	}

	// Each handler's lease cache (and its sweeper) goes with the handler:
	// 20 reloads with traffic leave no goroutine behind.
	testClient.CloseIdleConnections()
	goroutines := stableGoroutines()
	for i := range 20 {
		s.load("", leaseSite(srv.Addr), nil)
		s.get("/hold", "X-Tenant", fmt.Sprintf("t%d", i))
	}
	testClient.CloseIdleConnections()
	if n := stableGoroutines(); n > goroutines+5 {
		t.Errorf("goroutines grew from %d to %d over 20 reloads", goroutines, n)
	}
}

// TestLeaseRedisOutage: when Redis dies, a Caddy keeps serving the units it
// had leased (they are charged already), then its fail mode decides (here
// closed: 429); once Redis is back, leases resume.
func TestLeaseRedisOutage(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	s := startCaddyAdmin(t, "", fmt.Sprintf(`
	rate_limit {
		redis {
			address %s
			timeout 100ms
			breaker_cooldown 200ms
		}
		tenant {http.request.header.X-Tenant}
		lease 50 1h
		fail closed
		policy api {
			limit 1000
			window 1h
		}
	}
	respond "ok"`, srv.Addr), nil)
	for i := range 40 {
		if r := s.get("/", "X-Tenant", "acme"); r.status != http.StatusOK {
			t.Fatalf("warm-up %d: %d", i, r.status)
		}
	}
	st := s.adminOK("GET", "/rate_limit/status", "")
	lease := st["handlers"].([]any)[0].(map[string]any)["policies"].([]any)[0].(map[string]any)["lease"].(map[string]any)
	held := int(lease["units"].(float64))
	if held <= 0 {
		t.Fatalf("nothing leased after 40 requests: %v", lease)
	}

	srv.Kill()
	for i := range held {
		if r := s.get("/", "X-Tenant", "acme"); r.status != http.StatusOK {
			t.Fatalf("leased unit %d of %d with Redis down: %d", i+1, held, r.status)
		}
	}
	if r := s.get("/", "X-Tenant", "acme"); r.status != http.StatusTooManyRequests {
		t.Fatalf("after the lease ran out with Redis down (fail closed): %d", r.status)
	}

	srv.Restart(t)
	waitFor(t, func() bool { return s.get("/", "X-Tenant", "acme").status == http.StatusOK })
}
