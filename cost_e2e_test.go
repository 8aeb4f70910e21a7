package tollgate

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// hostileCosts are X-Cost values a client could send to overflow a store:
// above 2^53 (where a Lua double stops being exact), above int64, and the
// largest value inside the domain (which no bucket of these tests holds).
var hostileCosts = []string{"9007199254740993", "9007199254740992", "99999999999999999999999", "9223372036854775807", "9007199254740991"}

// costSite limits tenants by X-Tenant to 5 units an hour, the cost taken
// from the client's X-Cost header, with the given fail mode.
func costSite(redisAddr, fail string) string {
	return metricsSite(fmt.Sprintf(`
			redis {
				address %s
			}
			tenant {http.request.header.X-Tenant}
			policy hostile_cost {
				limit 5
				window 1h
				cost {http.request.header.X-Cost}
				fail %s
			}`, redisAddr, fail))
}

// TestHostileCostNeverBypasses: a client cannot buy its way past a limit
// with a cost the stores cannot compute. On Redis with `fail open`, a cost
// beyond 2^53 - 1 is denied (429) by the store's own answer: it is not a
// store failure, opens no breaker and never reaches the fail mode; the
// tenant's budget is untouched. With Redis down, fail open admits normal
// requests but still denies those.
func TestHostileCostNeverBypasses(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	s := startCaddy(t, "", costSite(srv.Addr, "open"), nil)
	before := scrapeMetrics(t, s.base+"/metrics")
	for _, cost := range hostileCosts {
		for range 3 {
			res := s.get("/", "X-Tenant", "mallory", "X-Cost", cost)
			if res.status != http.StatusTooManyRequests {
				t.Fatalf("X-Cost %s: status %d, want 429", cost, res.status)
			}
			if ra := res.header.Get("Retry-After"); ra != "3600" {
				t.Errorf("X-Cost %s: Retry-After %q, want 3600 (the window: it can never pass)", cost, ra)
			}
		}
	}
	// Nothing was charged, and the limit is still exact.
	if c := s.statuses(7, "/", "X-Tenant", "mallory", "X-Cost", "1"); c[200] != 5 || c[429] != 2 {
		t.Fatalf("after hostile costs: %v, want exactly 5 admitted of 7", c)
	}
	m := scrapeMetrics(t, s.base+"/metrics")
	for _, series := range [][]string{
		{"caddy_rate_limit_redis_calls_total", "script", "decide", "result", "error"},
		{"caddy_rate_limit_requests_total", "policy", "hostile_cost", "decision", "failed_open"},
	} {
		if got := m.delta(before, series[0], series[1:]...); got != 0 {
			t.Errorf("%v: %v, want 0 (a bad input is not a store failure)", series, got)
		}
	}
	if got := m.delta(before, "caddy_rate_limit_requests_total", "policy", "hostile_cost", "decision", "denied"); got != float64(3*len(hostileCosts)+2) {
		t.Errorf("denied: %v, want %d", got, 3*len(hostileCosts)+2)
	}
	if got := m.value("caddy_rate_limit_breaker_open"); got != 0 {
		t.Errorf("breaker_open = %v, want 0", got)
	}

	// Redis gone: fail open admits ordinary requests, never a hostile cost.
	srv.Stop()
	for _, cost := range hostileCosts {
		if res := s.get("/", "X-Tenant", "eve", "X-Cost", cost); res.status != http.StatusTooManyRequests {
			t.Errorf("Redis down, X-Cost %s: status %d, want 429 (fail open must not admit what no store could)", cost, res.status)
		}
	}
	if res := s.get("/", "X-Tenant", "eve", "X-Cost", "1"); res.status != http.StatusOK {
		t.Errorf("Redis down, X-Cost 1: status %d, want 200 (fail open)", res.status)
	}
}

// TestHostileCostEmbedded: the same on the embedded store, where the cost
// must not reach an allocation either (a sliding log logs costs).
func TestHostileCostEmbedded(t *testing.T) {
	s := startCaddy(t, "", `
	rate_limit {
		tenant {http.request.header.X-Tenant}
		policy hostile_log {
			algorithm sliding_log
			limit 9007199254740991
			window 1h
			cost {http.request.header.X-Cost}
		}
	}
	respond "ok"`, nil)
	for _, cost := range hostileCosts[:4] {
		if res := s.get("/", "X-Tenant", "mallory", "X-Cost", cost); res.status != http.StatusTooManyRequests {
			t.Fatalf("X-Cost %s: status %d, want 429", cost, res.status)
		}
	}
	if res := s.get("/", "X-Tenant", "mallory", "X-Cost", "3"); res.status != http.StatusOK || res.header.Get("X-Ratelimit-Remaining") != "9007199254740988" {
		t.Fatalf("X-Cost 3: status %d, remaining %q, want 200 and 9007199254740988", res.status, res.header.Get("X-Ratelimit-Remaining"))
	}
}
