package tollgate

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// leaseAlgorithms are the algorithms that can lease.
var leaseAlgorithms = []string{"token_bucket", "gcra", "sliding_window", "fixed_window"}

// leaseFleetCaddyfile has one route per leasing algorithm (/<algo>): limit
// 1000 per hour per tenant with lease 50, and /light: limit 10,000,000 per
// hour with lease 50, for a tenant far below its limit.
func leaseFleetCaddyfile(redisBlock string) string {
	var routes strings.Builder
	policy := func(path, algo string, limit int) {
		fmt.Fprintf(&routes, `
	route /%s {
		rate_limit {
			%s
			tenant {http.request.header.X-Tenant}
			lease 50
			policy %s {
				algorithm %s
				limit %d
				window 1h
			}
		}
		respond "ok"
	}`, path, redisBlock, path, algo, limit)
	}
	for _, algo := range leaseAlgorithms {
		policy(algo, algo, 1000)
	}
	policy("light", "token_bucket", 10_000_000)
	return fmt.Sprintf(`{
	admin 127.0.0.1:{ADMIN}
	auto_https off
	log {
		output discard
	}
}

http://127.0.0.1:{PORT} {
%s
}
`, routes.String())
}

// scriptCalls is how many scripts Redis ran: EVALSHA, EVAL and FCALL
// calls in INFO commandstats.
func scriptCalls(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\r\n") {
		name, stats, ok := strings.Cut(line, ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval" && name != "cmdstat_fcall") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(stats, "calls="), ",")
		v, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("commandstats %q: %v", line, err)
		}
		n += v
	}
	return n
}

// TestFleetLeaseAccuracy: three Caddy processes on one Redis,
// lease 50, limit 1000 per hour.
//   - Under demand far above the limit, the fleet admits at most 1000
//     (plus what a token bucket or GCRA refills during the test) and at
//     least 990; after the processes stop (giving their leases back) Redis
//     has charged exactly what was admitted.
//   - A tenant far below its limit makes at most one Redis call per 20
//     requests at steady state, counted with INFO commandstats.
func TestFleetLeaseAccuracy(t *testing.T) {
	redistest.RequireBinaries(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	cfg := leaseFleetCaddyfile(fleetRedisBlock(srv.Addr))
	fleet := []*caddyProcess{startCaddyProcess(t, cfg), startCaddyProcess(t, cfg), startCaddyProcess(t, cfg)}

	// Let the heartbeats register all three, so leases are sized for them.
	waitFor(t, func() bool {
		n, err := client.ZCard(context.Background(), "rl:instances").Result()
		return err == nil && n == 3
	})

	// A fixed window is aligned to the hour: do not straddle one.
	if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < time.Minute {
		t.Logf("waiting %v for the next hour", left)
		time.Sleep(left + time.Second)
	}

	for _, algo := range leaseAlgorithms {
		start := time.Now()
		var ok, errs atomic.Int64
		var wg sync.WaitGroup
		// 24 workers, 8 per instance, 4000 requests in all.
		for w := range 24 {
			wg.Go(func() {
				base := fleet[w%3].base
				for range 4000 / 24 {
					status, err := tenantGet(t, base+"/"+algo, "heavy")
					if err != nil {
						errs.Add(1)
					} else if status == 200 {
						ok.Add(1)
					}
				}
			})
		}
		wg.Wait()
		refill := int64(0)
		if algo == "token_bucket" || algo == "gcra" {
			refill = int64(time.Since(start).Seconds()*1000/3600) + 1
		}
		got := ok.Load()
		t.Logf("%s: admitted %d of 4000 in %v (bound %d)", algo, got, time.Since(start).Round(time.Millisecond), 1000+refill)
		if got > 1000+refill || got < 990 || errs.Load() != 0 {
			t.Errorf("%s: admitted %d, %d errors: want 990..%d and no errors", algo, got, errs.Load(), 1000+refill)
		}
	}

	// Every instance now answers "heavy" on /fixed_window from its denial
	// cache, until the end of the hour. A reset on one instance reaches
	// the others' caches through pub/sub.
	if r := fleet[1].get("/fixed_window", "X-Tenant", "heavy"); r.status != 429 {
		t.Fatalf("heavy after the load: %d", r.status)
	}
	res, err := testClient.Post(fmt.Sprintf("http://127.0.0.1:%d/rate_limit/reset?tenant=heavy&policy=fixed_window", fleet[0].admin), "", nil)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("reset: %v %v", res, err)
	}
	res.Body.Close()
	waitFor(t, func() bool {
		return fleet[1].get("/fixed_window", "X-Tenant", "heavy").status == 200
	})

	// Steady state of a light tenant: warm up, then count.
	light := func(d time.Duration) (requests int64) {
		var n atomic.Int64
		var wg sync.WaitGroup
		deadline := time.Now().Add(d)
		for w := range 6 {
			wg.Go(func() {
				base := fleet[w%3].base
				for time.Now().Before(deadline) {
					status, err := tenantGet(t, base+"/light", "light")
					if err != nil {
						t.Error(err)
						return
					}
					if status != 200 {
						t.Errorf("light tenant got %d", status)
						return
					}
					n.Add(1)
				}
			})
		}
		wg.Wait()
		return n.Load()
	}
	light(time.Second)
	before := scriptCalls(t, client)
	requests := light(3 * time.Second)
	calls := scriptCalls(t, client) - before
	perRequest := float64(calls) / float64(requests)
	t.Logf("light tenant: %d requests, %d script calls (heartbeats included): %.4f calls per request", requests, calls, perRequest)
	if requests < 200 || perRequest > 1.0/20 {
		t.Errorf("light tenant: %d requests made %d Redis script calls: want at most 1 per 20", requests, calls)
	}

	// Shutdown gives the leases back: a tenant that holds leased units
	// on one instance has exactly what it was served charged once the
	// fleet stops.
	store := limiter.NewRedisStore(limiter.RedisOptions{Client: client, Timeout: 5 * time.Second})
	inRedis := func(tenant string) int64 {
		t.Helper()
		res := make([]limiter.Result, 1)
		c := limiter.Check{Algorithm: limiter.SlidingWindow, Tenant: tenant, Policy: "sliding_window", Rate: limiter.Rate{Limit: 1000, Window: time.Hour}}
		if err := store.Peek(context.Background(), []limiter.Check{c}, res); err != nil {
			t.Fatal(err)
		}
		return res[0].Remaining
	}
	for range 30 {
		if r := fleet[2].get("/sliding_window", "X-Tenant", "holder"); r.status != 200 {
			t.Fatalf("holder: %d", r.status)
		}
	}
	if got := inRedis("holder"); got >= 970 {
		t.Fatalf("holder: Redis has %d left after 30 requests: nothing leased", got)
	}
	for _, p := range fleet {
		p.stop()
	}
	if got := inRedis("holder"); got != 970 {
		t.Errorf("after shutdown Redis has %d left for holder, want 970: leased units were not given back", got)
	}
}
