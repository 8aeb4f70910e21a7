package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// scriptCounter counts a RedisStore's script calls by script name.
type scriptCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *scriptCounter) observe(script, result string, _ time.Duration) {
	if result == "noscript" {
		return // retried at once with EVAL, which is counted
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[script]++
}

func (c *scriptCounter) get(script string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[script]
}

// leaseFixture is a LeaseStore on a real Redis. With clk set, the store
// and the scripts share the manual clock.
type leaseFixture struct {
	redis *RedisStore
	lease *LeaseStore
	calls *scriptCounter
	clk   *manualClock
}

func newLeaseFixture(t *testing.T, srv *redistest.Server, manual bool, instances int) *leaseFixture {
	t.Helper()
	f := &leaseFixture{calls: &scriptCounter{}}
	f.redis = NewRedisStore(RedisOptions{Client: srv.Client(t), Timeout: testTimeout, Observe: f.calls.observe})
	opts := LeaseOptions{Store: f.redis, Taker: f.redis, Instances: func() int { return instances }}
	if manual {
		f.clk = newManualClock(baseTime)
		opts.Clock = f.clk
		opts.SweepInterval = -1
		f.redis.now = func() int64 { return f.clk.Now().UnixMicro() }
	}
	f.lease = NewLeaseStore(opts)
	t.Cleanup(func() { f.lease.Close() })
	return f
}

func leaseCheck(algo Algorithm, tenant string, limit int64, window time.Duration, lease Lease) Check {
	return Check{Algorithm: algo, Tenant: tenant, Policy: "p", Rate: Rate{Limit: limit, Window: window}, Cost: 1, Lease: lease}
}

var leaseAlgorithms = []Algorithm{TokenBucket, GCRA, SlidingWindow, FixedWindow}

// TestLeaseServesLocally: one instance, limit 100: exactly 100 admitted,
// Remaining counts down exactly, most requests cost no Redis call, then a
// denial is cached until Retry-After and the store is asked again after.
func TestLeaseServesLocally(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	for _, algo := range leaseAlgorithms {
		t.Run(algo.String(), func(t *testing.T) {
			f := newLeaseFixture(t, srv, true, 1)
			c := leaseCheck(algo, "served-"+algo.String(), 100, time.Hour, Lease{Max: 20, TTL: time.Hour})
			res := make([]Result, 1)
			for i := int64(1); i <= 100; i++ {
				ok, err := f.lease.Decide(bgCtx, []Check{c}, res)
				if err != nil || !ok {
					t.Fatalf("request %d: admitted %v, err %v", i, ok, err)
				}
				if res[0].Remaining != 100-i {
					t.Fatalf("request %d: remaining %d, want %d", i, res[0].Remaining, 100-i)
				}
			}
			// Demand doubles each refill up to 20 (1+2+4+8+16), then
			// leases of 20 until remaining/2 caps them (34, 20, 14, 7, 4,
			// 2, 1, 1): about 13 calls.
			if n := f.calls.get("lease"); n > 15 {
				t.Fatalf("%d lease calls for 100 requests", n)
			}
			ok, _ := f.lease.Decide(bgCtx, []Check{c}, res)
			if ok || res[0].From != OriginStore || res[0].RetryAfter <= 0 {
				t.Fatalf("request 101: admitted %v, %+v", ok, res[0])
			}
			calls := f.calls.get("lease")
			retry := res[0].RetryAfter
			f.clk.Advance(retry / 2)
			for i := 0; i < 50; i++ {
				ok, _ := f.lease.Decide(bgCtx, []Check{c}, res)
				if ok || res[0].From != OriginDenialCache {
					t.Fatalf("cached denial %d: admitted %v, %+v", i, ok, res[0])
				}
			}
			if got := res[0].RetryAfter; got > retry-retry/2 || got <= 0 {
				t.Fatalf("cached Retry-After %v, want it counting down from %v", got, retry)
			}
			if n := f.calls.get("lease"); n != calls {
				t.Fatalf("cached denials made %d Redis calls", n-calls)
			}
			f.clk.Advance(retry - retry/2)
			ok, err := f.lease.Decide(bgCtx, []Check{c}, res)
			if err != nil || !ok || f.calls.get("lease") != calls+1 {
				t.Fatalf("after Retry-After: admitted %v err %v, %d new calls", ok, err, f.calls.get("lease")-calls)
			}
		})
	}
}

// TestLeaseThinTail: an entry seen about once a ttl (the thin tail of a
// large tenant population) is decided by the decide script, not leased
// one unit at a time: its lease would be one request's worth, which is a
// decision, and the lease script costs Redis more. Counting stays exact,
// and a denial is still cached until Retry-After.
func TestLeaseThinTail(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	for _, algo := range leaseAlgorithms {
		t.Run(algo.String(), func(t *testing.T) {
			f := newLeaseFixture(t, srv, true, 1)
			lease := Lease{Max: 50, TTL: time.Second}
			res := make([]Result, 1)
			const tenants, rounds = 20, 5
			for round := int64(1); round <= rounds; round++ {
				for i := range tenants {
					c := leaseCheck(algo, fmt.Sprintf("thin-%s-%d", algo, i), 1000, 1000*time.Hour, lease)
					ok, err := f.lease.Decide(bgCtx, []Check{c}, res)
					if err != nil || !ok || res[0].From != OriginStore {
						t.Fatalf("round %d tenant %d: admitted %v, err %v, %+v", round, i, ok, err, res[0])
					}
					if res[0].Remaining != 1000-round {
						t.Fatalf("round %d tenant %d: remaining %d, want %d", round, i, res[0].Remaining, 1000-round)
					}
				}
				f.clk.Advance(2 * time.Second)
			}
			if l, d := f.calls.get("lease"), f.calls.get("decide"); l != 0 || d != tenants*rounds {
				t.Fatalf("%d lease and %d decide calls for %d requests, want 0 and %d", l, d, tenants*rounds, tenants*rounds)
			}

			// A thin tenant at its limit: denied by the store, then from
			// the denial cache until Retry-After.
			c := leaseCheck(algo, "thin-full-"+algo.String(), 1, time.Hour, lease)
			if ok, err := f.lease.Decide(bgCtx, []Check{c}, res); !ok || err != nil {
				t.Fatalf("first request: admitted %v, err %v", ok, err)
			}
			f.clk.Advance(2 * time.Second)
			calls := f.calls.get("decide")
			if ok, _ := f.lease.Decide(bgCtx, []Check{c}, res); ok || res[0].From != OriginStore || res[0].RetryAfter <= 0 {
				t.Fatalf("second request: admitted %v, %+v", ok, res[0])
			}
			if ok, _ := f.lease.Decide(bgCtx, []Check{c}, res); ok || res[0].From != OriginDenialCache {
				t.Fatalf("third request: admitted %v, %+v, want the cached denial", ok, res[0])
			}
			if n := f.calls.get("decide") - calls; n != 1 {
				t.Fatalf("%d decide calls for a denial and a cached denial, want 1", n)
			}
		})
	}
}

// TestLeaseSteadyThinTenant: a tenant seen every 0.65 ttl (the thin tail
// of bench/run.sh's 10 000 tenants) gets leases of two that are spent
// before they expire: after its first request (decided), one lease call
// per two requests and no give-back at all. Counting the demand from
// period totals instead asked for leases of three after a period with two
// requests, and every such lease expired with a unit to give back.
func TestLeaseSteadyThinTenant(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	for _, algo := range leaseAlgorithms {
		t.Run(algo.String(), func(t *testing.T) {
			f := newLeaseFixture(t, srv, true, 1)
			c := leaseCheck(algo, "steady-"+algo.String(), 1000, 1000*time.Hour, Lease{Max: 50, TTL: time.Second})
			checks := []Check{c}
			res := make([]Result, 1)
			const requests = 41
			for i := 1; i <= requests; i++ {
				if ok, err := f.lease.Decide(bgCtx, checks, res); !ok || err != nil {
					t.Fatalf("request %d: admitted %v, err %v", i, ok, err)
				}
				f.clk.Advance(650 * time.Millisecond)
				f.lease.Sweep(bgCtx) // as the sweeper would, meanwhile
			}
			decides, leases, backs := f.calls.get("decide"), f.calls.get("lease"), f.calls.get("lease_return")
			if decides != 1 || leases != (requests-1)/2 || backs != 0 {
				t.Fatalf("%d decide, %d lease and %d give-back calls for %d requests, want 1, %d and 0",
					decides, leases, backs, requests, (requests-1)/2)
			}
			st := f.lease.Stats()["p"]
			if st.Returned != 0 || st.Expired != 0 || st.Units != 0 || st.Spent != st.Acquired {
				t.Fatalf("lease stats %+v: every leased unit should be spent", st)
			}
			if err := f.redis.Peek(bgCtx, checks, res); err != nil || res[0].Remaining != 1000-requests {
				t.Fatalf("Redis remaining %d (err %v), want %d", res[0].Remaining, err, 1000-requests)
			}
		})
	}
}

// TestLeaseTTLFor: an unset ttl is a sixth of the window, from 1s to 10s;
// a set one is kept whatever the window.
func TestLeaseTTLFor(t *testing.T) {
	for _, tc := range []struct {
		lease  Lease
		window time.Duration
		want   time.Duration
	}{
		{Lease{Max: 50}, 100 * time.Millisecond, time.Second},
		{Lease{Max: 50}, time.Second, time.Second},
		{Lease{Max: 50}, 6 * time.Second, time.Second},
		{Lease{Max: 50}, 9 * time.Second, 1500 * time.Millisecond},
		{Lease{Max: 50}, time.Minute, 10 * time.Second},
		{Lease{Max: 50}, time.Hour, 10 * time.Second},
		{Lease{Max: 50}, 31 * 24 * time.Hour, 10 * time.Second},
		{Lease{Max: 50}, 0, time.Second},
		{Lease{Max: 50, TTL: 300 * time.Millisecond}, time.Hour, 300 * time.Millisecond},
		{Lease{Max: 50, TTL: time.Minute}, time.Second, time.Minute},
	} {
		if got := tc.lease.TTLFor(tc.window); got != tc.want {
			t.Errorf("%+v.TTLFor(%v) = %v, want %v", tc.lease, tc.window, got, tc.want)
		}
	}
}

// TestLeaseDefaultTTLServesThinTenant: a tenant seen every 2s on an
// hourly limit, with `lease 50` and no ttl. Under a 1s ttl each of its
// requests would be a store call (a lease would always have expired);
// under the default for an hour (10s) its leases cover the requests of
// the last 10s, so after the ramp most requests are served from them. The
// counting stays exact: Redis holds what was served plus what is still
// leased here.
func TestLeaseDefaultTTLServesThinTenant(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	for _, algo := range leaseAlgorithms {
		t.Run(algo.String(), func(t *testing.T) {
			f := newLeaseFixture(t, srv, true, 1)
			// A window of 1000h: an hourly limit's ttl (10s) with no
			// refill to speak of, so Redis's count is exact to the unit.
			c := leaseCheck(algo, "default-ttl-"+algo.String(), 1000, 1000*time.Hour, Lease{Max: 50})
			checks := []Check{c}
			res := make([]Result, 1)
			const requests = 60
			fromLease := 0
			for i := 1; i <= requests; i++ {
				if ok, err := f.lease.Decide(bgCtx, checks, res); !ok || err != nil {
					t.Fatalf("request %d: admitted %v, err %v", i, ok, err)
				}
				if res[0].From == OriginLease {
					fromLease++
				}
				f.clk.Advance(2 * time.Second)
				f.lease.Sweep(bgCtx)
			}
			calls := f.calls.get("decide") + f.calls.get("lease") + f.calls.get("lease_return")
			// Demand over the last 10s is five requests: once the ramp
			// (1, 2, 4) is over, a token bucket's lease is topped up by
			// four when one is left, a window's refilled with five (the
			// request that refills it counts as decided by the store).
			if calls > requests/3 || fromLease < requests*2/3 {
				t.Fatalf("%d store calls and %d requests served from leases, of %d requests; want at most %d and at least %d",
					calls, fromLease, requests, requests/3, requests*2/3)
			}
			st := f.lease.Stats()["p"]
			if err := f.redis.Peek(bgCtx, checks, res); err != nil || res[0].Remaining != 1000-requests-st.Units {
				t.Fatalf("Redis remaining %d (err %v), want %d: %d served and %d still leased",
					res[0].Remaining, err, 1000-requests-st.Units, requests, st.Units)
			}
		})
	}
}

// TestLeaseShare: a lease never takes more than remaining / (2 x
// instances), at least one request's worth; nothing once empty.
func TestLeaseShare(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	s := NewRedisStore(RedisOptions{Client: srv.Client(t), Timeout: testTimeout})
	for _, algo := range leaseAlgorithms {
		t.Run(algo.String(), func(t *testing.T) {
			c := leaseCheck(algo, "share-"+algo.String(), 80, time.Hour, Lease{Max: 50})
			res := make([]Result, 1)
			remaining := int64(80)
			var grants []int64
			for remaining > 0 {
				g, err := s.Lease(bgCtx, &LeaseRequest{Checks: []Check{c}, Want: 50, Instances: 4, TTL: time.Minute}, res)
				if err != nil {
					t.Fatal(err)
				}
				want := max(remaining/8, 1)
				if g.Requests != want || res[0].Remaining != remaining-want {
					t.Fatalf("remaining %d: granted %d (remaining %d), want %d", remaining, g.Requests, res[0].Remaining, want)
				}
				if g.Expires <= 0 || g.Expires > time.Minute {
					t.Fatalf("expires %v", g.Expires)
				}
				grants = append(grants, g.Requests)
				remaining -= want
			}
			g, err := s.Lease(bgCtx, &LeaseRequest{Checks: []Check{c}, Want: 50, Instances: 4}, res)
			if err != nil || g.Requests != 0 || res[0].Allowed || res[0].RetryAfter <= 0 {
				t.Fatalf("empty bucket: granted %d, %+v, err %v", g.Requests, res[0], err)
			}
			t.Logf("grants %v", grants)
		})
	}
	bad := Check{Algorithm: SlidingLog, Tenant: "x", Policy: "p", Rate: Rate{Limit: 5, Window: time.Second}, Cost: 1}
	if _, err := s.Lease(bgCtx, &LeaseRequest{Checks: []Check{bad}, Want: 1}, make([]Result, 1)); !errors.Is(err, ErrLeaseUnsupported) {
		t.Fatalf("sliding_log lease: %v", err)
	}
}

// TestLeaseWindowExpiry: a window algorithm's lease ends with its window.
func TestLeaseWindowExpiry(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	s := NewRedisStore(RedisOptions{Client: srv.Client(t), Timeout: testTimeout})
	at := baseTime.Add(50 * time.Second) // 10s before the end of a minute
	s.now = func() int64 { return at.UnixMicro() }
	for _, algo := range leaseAlgorithms {
		c := leaseCheck(algo, "win-"+algo.String(), 100, time.Minute, Lease{Max: 10})
		g, err := s.Lease(bgCtx, &LeaseRequest{Checks: []Check{c}, Want: 10, TTL: time.Hour}, make([]Result, 1))
		if err != nil {
			t.Fatal(err)
		}
		want := time.Hour
		if algo == SlidingWindow || algo == FixedWindow {
			want = 10 * time.Second
		}
		if g.Expires != want || g.Requests != 10 {
			t.Fatalf("%s: granted %d expiring in %v, want 10 in %v", algo, g.Requests, g.Expires, want)
		}
	}
}

// TestLeaseGiveBack: unused units go back on expiry (sweeper), in the
// refill that follows an expired lease, and on Close.
func TestLeaseGiveBack(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	for _, algo := range leaseAlgorithms {
		t.Run(algo.String(), func(t *testing.T) {
			f := newLeaseFixture(t, srv, true, 1)
			c := leaseCheck(algo, "back-"+algo.String(), 1000, time.Hour, Lease{Max: 10, TTL: time.Second})
			checks := []Check{c}
			res := make([]Result, 1)
			peek := func() int64 {
				t.Helper()
				if err := f.redis.Peek(bgCtx, checks, res); err != nil {
					t.Fatal(err)
				}
				return res[0].Remaining
			}
			decide := func(n int) {
				t.Helper()
				for i := 0; i < n; i++ {
					if ok, err := f.lease.Decide(bgCtx, checks, res); !ok || err != nil {
						t.Fatalf("denied: %v", err)
					}
				}
			}
			// Ramp the demand so the next lease is 10, spend 3 of it.
			decide(16)
			served := int64(16)
			calls := f.calls.get("lease")
			decide(3)
			served += 3
			if f.calls.get("lease") == calls {
				// The ramp ended exactly on a lease boundary: one more.
				decide(1)
				served++
			}
			held := f.lease.Stats()["p"].Units
			if held <= 0 || peek() != 1000-served-held {
				t.Fatalf("held %d, Redis remaining %d, served %d", held, peek(), served)
			}
			// Expiry: the sweeper gives the held units back.
			f.clk.Advance(1100 * time.Millisecond)
			f.lease.Sweep(bgCtx)
			if got := peek(); got != 1000-served {
				t.Fatalf("after expiry: Redis remaining %d, want %d", got, 1000-served)
			}
			st := f.lease.Stats()["p"]
			if st.Returned != held || st.Units != 0 || st.Acquired != st.Spent+st.Returned+st.Expired {
				t.Fatalf("stats %+v, held %d", st, held)
			}
			// Refill after an expired lease: one call gives back and takes.
			decide(5)
			served += 5
			held = f.lease.Stats()["p"].Units
			f.clk.Advance(1100 * time.Millisecond)
			calls = f.calls.get("lease") + f.calls.get("lease_return")
			decide(1)
			served++
			if n := f.calls.get("lease") + f.calls.get("lease_return") - calls; n != 1 {
				t.Fatalf("refill after expiry made %d calls", n)
			}
			if held == 0 {
				t.Fatal("nothing held before the expiry")
			}
			held = f.lease.Stats()["p"].Units
			if got := peek(); got != 1000-served-held {
				t.Fatalf("after a merged give back: Redis remaining %d, want %d", got, 1000-served-held)
			}
			// Close gives everything back.
			f.lease.Close()
			if got := peek(); got != 1000-served {
				t.Fatalf("after Close: Redis remaining %d, want %d", got, 1000-served)
			}
			// A closed store decides directly.
			if ok, _ := f.lease.Decide(bgCtx, checks, res); !ok || res[0].From != OriginStore || peek() != 1000-served-1 {
				t.Fatalf("after Close: %+v", res[0])
			}
		})
	}
}

// TestLeaseNoStampede: concurrent first requests of one entry share one
// Redis call at a time instead of each making one.
func TestLeaseNoStampede(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	f := newLeaseFixture(t, srv, false, 1)
	c := leaseCheck(TokenBucket, "herd", 10000, time.Hour, Lease{Max: 100, TTL: time.Minute})
	const n = 64
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := make([]Result, 1)
			<-start
			if ok, err := f.lease.Decide(bgCtx, []Check{c}, res); ok && err == nil {
				admitted.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	if admitted.Load() != n {
		t.Fatalf("admitted %d of %d", admitted.Load(), n)
	}
	// One call for the first request (demand 1), then one sized to the
	// waiting herd. If a loaded scheduler trickles the goroutines in, each
	// refill is sized to the demand seen so far, which at least doubles:
	// at most about log2(64) + 2 calls. Without the shared refill every
	// request that finds the lease empty makes its own call.
	if calls := f.calls.get("lease"); calls > 8 {
		t.Fatalf("%d Redis calls for %d concurrent requests", calls, n)
	} else {
		t.Logf("%d Redis calls for %d concurrent requests", calls, n)
	}
}

// TestLeasePrefetch: a token bucket or GCRA lease is topped up when a
// quarter of its last grant is left, up to the demand and max_tokens
// (never past them), so a busy tenant's requests are
// served from the lease without waiting for a refill once it runs out:
// of 300 requests in a row only 3 go to the store (the grants of 1 and 2
// that start the demand ramp are too small to top up), Remaining still
// counts down exactly, and a window lease is refilled as before.
func TestLeasePrefetch(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	for _, algo := range leaseAlgorithms {
		t.Run(algo.String(), func(t *testing.T) {
			f := newLeaseFixture(t, srv, true, 1)
			c := leaseCheck(algo, "prefetch-"+algo.String(), 10000, time.Hour, Lease{Max: 20, TTL: time.Hour})
			res := make([]Result, 1)
			fromStore := 0
			for i := int64(1); i <= 300; i++ {
				ok, err := f.lease.Decide(bgCtx, []Check{c}, res)
				if err != nil || !ok {
					t.Fatalf("request %d: admitted %v, err %v", i, ok, err)
				}
				if res[0].Remaining != 10000-i {
					t.Fatalf("request %d: remaining %d, want %d", i, res[0].Remaining, 10000-i)
				}
				if res[0].From == OriginStore {
					fromStore++
				}
				// A top-up brings the lease up to the demand (here
				// max_tokens), never past it: what a crash can strand.
				if held := f.lease.Stats()["p"].Units; held > 20 {
					t.Fatalf("request %d: %d units held, more than max_tokens (20)", i, held)
				}
			}
			// The first request (demand 1) is decided by the decide
			// script: a lease of one request's worth would be a decision.
			if n := f.calls.get("decide"); n != 1 {
				t.Fatalf("%d decide calls, want 1 (the first request)", n)
			}
			calls := f.calls.get("lease") + f.calls.get("decide")
			if prefetchable([]Check{c}) {
				if fromStore != 3 {
					t.Fatalf("%d of 300 requests waited for a refill, want 3", fromStore)
				}
			} else if fromStore != calls || fromStore < 15 {
				t.Fatalf("window lease: %d requests from the store, %d calls", fromStore, calls)
			}
			// Leases of 20 after the ramp (1, 2, 4, 8, 16), then top-ups of
			// about 16 (to 20, from the quarter left): about 20 calls either
			// way; a prefetch is not an extra call per request.
			if calls > 25 {
				t.Fatalf("%d lease calls for 300 requests", calls)
			}
			t.Logf("%d lease calls, %d requests from the store", calls, fromStore)
		})
	}
}

// blockingTaker holds the lease calls made while hold is set until
// release is closed.
type blockingTaker struct {
	LeaseTaker
	hold    atomic.Bool
	held    chan struct{}
	release chan struct{}
}

func (b *blockingTaker) Lease(ctx context.Context, req *LeaseRequest, results []Result) (LeaseGrant, error) {
	if b.hold.Load() {
		b.held <- struct{}{}
		<-b.release
	}
	return b.LeaseTaker.Lease(ctx, req, results)
}

// TestLeasePrefetchInFlight: while a prefetch is on the wire, the units
// left keep serving other requests; one that finds the lease empty waits
// for the prefetch and is served from what it brought.
func TestLeasePrefetchInFlight(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	rs := NewRedisStore(RedisOptions{Client: srv.Client(t), Timeout: testTimeout})
	taker := &blockingTaker{LeaseTaker: rs, held: make(chan struct{}), release: make(chan struct{})}
	clk := newManualClock(baseTime)
	rs.now = func() int64 { return clk.Now().UnixMicro() }
	ls := NewLeaseStore(LeaseOptions{Store: rs, Taker: taker, Clock: clk, SweepInterval: -1})
	t.Cleanup(func() { ls.Close() })
	t.Cleanup(func() { taker.hold.Store(false) }) // before Close gives back
	c := leaseCheck(TokenBucket, "inflight", 10000, time.Hour, Lease{Max: 12, TTL: time.Hour})
	res := make([]Result, 1)
	decide := func(want Origin) {
		t.Helper()
		if ok, err := ls.Decide(bgCtx, []Check{c}, res); !ok || err != nil || res[0].From != want {
			t.Fatalf("admitted %v, err %v, from %v, want from %v", ok, err, res[0].From, want)
		}
	}
	// Ramp the demand until a grant of at least 8: top-ups bring the
	// lease up to 12 from what is left at the quarter mark.
	for i := 0; ls.entry([]Check{c}).lastGrant < 8; i++ {
		if i == 100 {
			t.Fatalf("no grant of 8 or more after %d requests", i)
		}
		if ok, err := ls.Decide(bgCtx, []Check{c}, res); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	e := ls.entry([]Check{c})
	e.mu.Lock()
	units := e.units
	e.mu.Unlock()
	// Spend down to 3 left: the next request leaves 2 (a quarter of a
	// grant of 8 to 11) and prefetches.
	for ; units > 3; units-- {
		decide(OriginLease)
	}
	taker.hold.Store(true)
	prefetching := make(chan struct{})
	go func() {
		defer close(prefetching)
		decide(OriginLease) // 2 left: its prefetch is held
	}()
	select {
	case <-taker.held:
	case <-prefetching:
		t.Fatal("the request that left 2 units made no prefetch")
	case <-time.After(5 * time.Second):
		t.Fatal("no prefetch")
	}
	decide(OriginLease) // 1 left
	decide(OriginLease) // 0 left
	waited := make(chan Result, 1)
	go func() {
		r := make([]Result, 1)
		if ok, err := ls.Decide(bgCtx, []Check{c}, r); !ok || err != nil {
			t.Errorf("request after the lease ran out: admitted %v, err %v", ok, err)
		}
		waited <- r[0]
	}()
	select {
	case r := <-waited:
		t.Fatalf("served before the prefetch returned: %+v", r)
	case <-time.After(100 * time.Millisecond):
	}
	taker.hold.Store(false)
	close(taker.release)
	<-prefetching
	if r := <-waited; r.From != OriginLease {
		t.Fatalf("the waiting request was served from %v, want the prefetched lease", r.From)
	}
}

// TestLeaseFleetExact: three instances leasing from one Redis, with
// demand far above the limit, admit at most the limit, and what they
// admitted plus what they held when they stopped is exactly the limit.
func TestLeaseFleetExact(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	// Token bucket and GCRA leases are topped up before they run out
	// (prefetch); window leases only once empty.
	for _, algo := range leaseAlgorithms {
		t.Run(algo.String(), func(t *testing.T) {
			c := leaseCheck(algo, "fleet-"+algo.String(), 1000, MaxWindow, Lease{Max: 50, TTL: time.Minute})
			var stores []Store
			for i := 0; i < 3; i++ {
				stores = append(stores, newLeaseFixture(t, srv, false, 3).lease)
			}
			admitted := hammerStores(t, stores, 4, 400, []Check{c})
			var held int64
			for _, s := range stores {
				held += s.(*LeaseStore).Stats()["p"].Units
			}
			if admitted > 1000 || admitted+held != 1000 {
				t.Fatalf("admitted %d, held %d: want at most 1000 and exactly 1000 together", admitted, held)
			}
			t.Logf("admitted %d, %d still leased", admitted, held)
		})
	}
}

// TestLeaseNotLeasable: shadow checks, checks without a lease and stores
// that cannot lease are decided by the inner store, exactly.
func TestLeaseNotLeasable(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	f := newLeaseFixture(t, srv, false, 1)
	lease := Lease{Max: 10}
	shadow := leaseCheck(TokenBucket, "nl-shadow", 5, time.Hour, lease)
	shadow.Shadow = true
	mixed := []Check{leaseCheck(TokenBucket, "nl", 5, time.Hour, lease), {Algorithm: SlidingLog, Tenant: "nl", Policy: "log", Rate: Rate{Limit: 5, Window: time.Hour}, Cost: 1}}
	for name, checks := range map[string][]Check{"shadow": {shadow}, "mixed": mixed} {
		res := make([]Result, len(checks))
		for i := 0; i < 5; i++ {
			if ok, err := f.lease.Decide(bgCtx, checks, res); !ok || err != nil || res[0].From != OriginStore {
				t.Fatalf("%s %d: %v %v %+v", name, i, ok, err, res[0])
			}
		}
	}
	if f.calls.get("lease") != 0 || f.calls.get("decide") != 10 {
		t.Fatalf("calls: %v", f.calls.n)
	}

	// A taker without leases: every request goes to the store.
	mem := NewMemoryStore(MemoryOptions{SweepInterval: -1})
	defer mem.Close()
	b := NewBreakerStore(mem, BreakerOptions{})
	ls := NewLeaseStore(LeaseOptions{Store: b, Taker: b})
	defer ls.Close()
	c := leaseCheck(FixedWindow, "mem", 3, time.Hour, lease)
	res := make([]Result, 1)
	n := 0
	for i := 0; i < 10; i++ {
		ok, err := ls.Decide(bgCtx, []Check{c}, res)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			n++
		}
	}
	if n != 3 || b.Open() {
		t.Fatalf("memory behind a lease store admitted %d of limit 3 (breaker open %v)", n, b.Open())
	}
}

// TestLeaseReset: Reset drops this instance's leases and cached denials
// of the tenant, and the tenant starts afresh at once.
func TestLeaseReset(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	f := newLeaseFixture(t, srv, true, 1)
	c := leaseCheck(FixedWindow, "reset-me", 10, time.Hour, Lease{Max: 5, TTL: time.Hour})
	other := leaseCheck(FixedWindow, "other", 10, time.Hour, Lease{Max: 5, TTL: time.Hour})
	res := make([]Result, 1)
	for i := 0; i < 12; i++ {
		f.lease.Decide(bgCtx, []Check{c}, res)
		f.lease.Decide(bgCtx, []Check{other}, res)
	}
	if ok, _ := f.lease.Decide(bgCtx, []Check{c}, res); ok || res[0].From != OriginDenialCache {
		t.Fatalf("before reset: %+v", res[0])
	}
	if err := f.lease.Reset(bgCtx, "reset-me", []string{c.Policy}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := f.lease.Decide(bgCtx, []Check{c}, res); !ok || res[0].Remaining != 9 {
		t.Fatalf("after reset: %+v", res[0])
	}
	if ok, _ := f.lease.Decide(bgCtx, []Check{other}, res); ok {
		t.Fatalf("reset of one tenant admitted another")
	}
}

// TestLeaseRedisDown: with Redis paused, a cold entry's first call (its
// decision: demand 1) fails at the deadline and the requests waiting for
// it share the error, one call for all; units already leased are still
// served.
func TestLeaseRedisDown(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	f := &leaseFixture{calls: &scriptCounter{}}
	opts := srv.ClientOptions()
	opts.ContextTimeoutEnabled = true
	client := redis.NewClient(opts)
	defer client.Close()
	f.redis = NewRedisStore(RedisOptions{Client: client, Timeout: 100 * time.Millisecond, Observe: f.calls.observe})
	f.lease = NewLeaseStore(LeaseOptions{Store: f.redis, Taker: f.redis})
	defer f.lease.Close()
	warm := leaseCheck(TokenBucket, "warm", 1000, time.Hour, Lease{Max: 50, TTL: time.Minute})
	cold := leaseCheck(TokenBucket, "cold", 1000, time.Hour, Lease{Max: 50, TTL: time.Minute})
	res := make([]Result, 1)
	for i := 0; i < 100; i++ {
		if ok, err := f.lease.Decide(bgCtx, []Check{warm}, res); !ok || err != nil {
			t.Fatalf("warm-up: %v", err)
		}
	}
	if f.lease.Stats()["p"].Units == 0 {
		t.Fatal("nothing leased after warm-up")
	}
	srv.Pause()
	defer srv.Resume()
	if ok, err := f.lease.Decide(bgCtx, []Check{warm}, res); !ok || err != nil || res[0].From != OriginLease {
		t.Fatalf("leased unit with Redis paused: %v %v %+v", ok, err, res[0])
	}
	var wg sync.WaitGroup
	var failed atomic.Int64
	calls := f.calls.get("decide") + f.calls.get("lease")
	start := time.Now()
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := f.lease.Decide(context.Background(), []Check{cold}, make([]Result, 1)); err != nil {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	if failed.Load() != 8 {
		t.Fatalf("%d of 8 failed", failed.Load())
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("8 concurrent refills against a paused Redis took %v", d)
	}
	if n := f.calls.get("decide") + f.calls.get("lease") - calls; n != 1 {
		t.Fatalf("8 concurrent requests of a cold entry made %d calls to a paused Redis, want 1", n)
	}
}

// TestLeaseTimeoutCountsLost: a refill that times out may still run once
// Redis wakes up (here it does: the command was on the socket). The units
// it took are never served nor given back; they are counted as lost (what
// the call asked for), so acquired - returned + lost always covers what
// Redis charged. A refill refused by the open breaker sent nothing and
// loses nothing.
func TestLeaseTimeoutCountsLost(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	opts := srv.ClientOptions()
	opts.ContextTimeoutEnabled = true
	client := redis.NewClient(opts)
	defer client.Close()
	rs := NewRedisStore(RedisOptions{Client: client, Timeout: 100 * time.Millisecond})
	br := NewBreakerStore(rs, BreakerOptions{Failures: 3, Cooldown: time.Hour})
	lease := NewLeaseStore(LeaseOptions{Store: br, Taker: br, SweepInterval: -1})
	defer lease.Close()
	c := leaseCheck(TokenBucket, "lost", 1000, time.Hour, Lease{Max: 50, TTL: time.Hour})
	res := make([]Result, 1)
	// Demand of 20 requests: the next refill asks for 20.
	for range 20 {
		if ok, err := lease.Decide(bgCtx, []Check{c}, res); !ok || err != nil {
			t.Fatalf("warm-up: %v %v", ok, err)
		}
	}
	st := lease.Stats()["p"]
	if st.Acquired == 0 || st.Lost != 0 {
		t.Fatalf("after warm-up: %+v", st)
	}
	// Use up the lease, then make every refill time out.
	for lease.Stats()["p"].Units > 0 {
		if ok, err := lease.Decide(bgCtx, []Check{c}, res); !ok || err != nil {
			t.Fatalf("spending the lease: %v %v", ok, err)
		}
	}
	srv.Pause()
	timeouts := 0
	for range 3 {
		if _, err := lease.Decide(bgCtx, []Check{c}, res); err == nil || !IsTimeout(err) {
			t.Fatalf("refill with Redis paused: %v, want a timeout", err)
		}
		timeouts++
	}
	if !br.Open() {
		t.Fatal("3 timeouts did not open the breaker")
	}
	if _, err := lease.Decide(bgCtx, []Check{c}, res); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("refill with the breaker open: %v", err)
	}
	srv.Resume()
	st = lease.Stats()["p"]
	if st.Lost == 0 || st.Lost > int64(timeouts)*50 {
		t.Fatalf("lost %d after %d timed-out refills, want 1..%d", st.Lost, timeouts, timeouts*50)
	}
	// Redis ran (at least one of) the timed-out calls when it woke up:
	// it charged more than this instance acquired, and never more than
	// acquired + lost: the lost count bounds the stranded units.
	held := st.Acquired - st.Returned
	var charged int64
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if charged = 1000 - mustPeek(t, rs, c)[0].Remaining; charged > held {
			break
		}
	}
	if charged <= held || charged > held+st.Lost {
		t.Errorf("Redis charged %d, want more than acquired %d - returned %d, at most that + lost %d", charged, st.Acquired, st.Returned, st.Lost)
	}
	t.Logf("acquired %d, returned %d, lost (bound) %d, Redis charged %d", st.Acquired, st.Returned, st.Lost, charged)
}

// gatedClock is a manual clock whose next reading, once armed, waits:
// entered is signalled, and the reading returns when release is closed.
type gatedClock struct {
	*manualClock
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (c *gatedClock) Now() time.Time {
	if c.armed.CompareAndSwap(true, false) {
		c.entered <- struct{}{}
		<-c.release
	}
	return c.manualClock.Now()
}

// TestLeaseDecideRacingClose: a request that passed Decide's closed check
// just before Close, and looks its checks up after Close emptied their
// shard, is decided without leaving a lease in the closed store: what
// Redis holds is what the requests used. (It once made an entry there and
// leased two units for its one request; nothing gave the other back.)
func TestLeaseDecideRacingClose(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	rs := NewRedisStore(RedisOptions{Client: srv.Client(t), Timeout: testTimeout})
	clk := &gatedClock{manualClock: newManualClock(baseTime), entered: make(chan struct{}), release: make(chan struct{})}
	rs.now = func() int64 { return clk.manualClock.Now().UnixMicro() }
	ls := NewLeaseStore(LeaseOptions{Store: rs, Taker: rs, Clock: clk, SweepInterval: -1})
	c := []Check{leaseCheck(TokenBucket, "racing-close", 100, time.Hour, Lease{Max: 50, TTL: time.Hour})}
	res := make([]Result, 1)
	// A first sight: the second request would make the entry and lease.
	if ok, err := ls.Decide(bgCtx, c, res); !ok || err != nil {
		t.Fatalf("first request: admitted %v, err %v", ok, err)
	}
	clk.armed.Store(true)
	type outcome struct {
		ok  bool
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res := make([]Result, 1)
		ok, err := ls.Decide(bgCtx, c, res)
		done <- outcome{ok, err}
	}()
	<-clk.entered // past the closed check, before the lookup
	ls.Close()
	close(clk.release)
	if o := <-done; !o.ok || o.err != nil {
		t.Fatalf("second request: admitted %v, err %v", o.ok, o.err)
	}
	if err := rs.Peek(bgCtx, c, res); err != nil {
		t.Fatal(err)
	}
	if res[0].Remaining != 98 {
		t.Fatalf("Redis holds %d remaining after 2 requests of 100, want 98", res[0].Remaining)
	}
	if n := entryCount(ls); n != 0 {
		t.Fatalf("%d entries in the closed store", n)
	}
}

// afterGate, once armed, holds the next call it wraps after the call ran:
// entered is signalled, and the call returns when release is closed.
type afterGate struct {
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func newAfterGate() *afterGate {
	return &afterGate{entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *afterGate) pass() {
	if g.armed.CompareAndSwap(true, false) {
		g.entered <- struct{}{}
		<-g.release
	}
}

// afterGateTaker is a LeaseTaker whose calls pass its gate after they ran.
type afterGateTaker struct {
	LeaseTaker
	*afterGate
}

func (t afterGateTaker) Lease(ctx context.Context, req *LeaseRequest, results []Result) (LeaseGrant, error) {
	g, err := t.LeaseTaker.Lease(ctx, req, results)
	t.pass()
	return g, err
}

// afterGateStore is a Store whose decisions pass its gate after they ran.
type afterGateStore struct {
	Store
	*afterGate
}

func (s afterGateStore) Decide(ctx context.Context, checks []Check, results []Result) (bool, error) {
	ok, err := s.Store.Decide(ctx, checks, results)
	s.pass()
	return ok, err
}

// TestLeaseResetDuringCall: Redis answers a lease call or a decision made
// before a reset of its tenant, and the answer arrives after the reset.
// Afterwards the tenant gets exactly its limit: a denial answered before
// the reset is not cached, and units leased before it are not served
// (the reset emptied the bucket they were charged in). Before this was
// fixed, a late denial was served until its Retry-After and a late
// grant's units were served on top of the fresh limit.
func TestLeaseResetDuringCall(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	for _, tc := range []struct {
		name string
		// drain: empty the bucket in Redis before the gated call, so
		// that Redis denies it.
		drain bool
		// first: the gated call is a first sight's decision (no entry
		// yet); otherwise it is an entry's refill.
		first bool
		// delay: the check waits up to this long for a turn, so a
		// denied refill asks Redis for a turn: the gated call then. (A
		// turn's call holds no flight: the reset drops the entry, and
		// the denial cached in it goes with it.)
		delay time.Duration
	}{
		{name: "refill-granted"},
		{name: "refill-denied", drain: true},
		{name: "first-sight-denied", drain: true, first: true},
		{name: "turn-denied", drain: true, delay: time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := NewRedisStore(RedisOptions{Client: srv.Client(t), Timeout: testTimeout})
			clk := newManualClock(baseTime)
			rs.now = func() int64 { return clk.Now().UnixMicro() }
			// The gated call: a decision (a first sight's, or a turn's)
			// or a lease.
			decideGate, leaseGate := newAfterGate(), newAfterGate()
			gate := leaseGate
			if tc.first || tc.delay > 0 {
				gate = decideGate
			}
			ls := NewLeaseStore(LeaseOptions{Store: afterGateStore{rs, decideGate}, Taker: afterGateTaker{rs, leaseGate}, Clock: clk, SweepInterval: -1})
			t.Cleanup(func() { ls.Close() })
			c := []Check{leaseCheck(TokenBucket, "reset-during-"+tc.name, 10, time.Hour, Lease{Max: 4, TTL: time.Hour})}
			c[0].Rate.Delay = tc.delay
			res := make([]Result, 1)
			decide := func() bool {
				t.Helper()
				ok, err := ls.Decide(bgCtx, c, res)
				if err != nil {
					t.Fatal(err)
				}
				return ok
			}
			if !tc.first {
				// A first sight, a lease of 2, a request served from it.
				for i := range 3 {
					if !decide() {
						t.Fatalf("request %d denied", i+1)
					}
				}
			}
			if tc.drain {
				for {
					if ok, err := rs.Decide(bgCtx, c, res); err != nil {
						t.Fatal(err)
					} else if !ok {
						break
					}
				}
			}
			gate.armed.Store(true)
			done := make(chan bool, 1)
			go func() {
				res := make([]Result, 1)
				ok, _ := ls.Decide(bgCtx, c, res)
				done <- ok
			}()
			<-gate.entered // Redis has answered; the answer is held
			if err := ls.Reset(bgCtx, c[0].Tenant, []string{c[0].Policy}); err != nil {
				t.Fatal(err)
			}
			close(gate.release)
			if ok := <-done; ok == tc.drain {
				t.Fatalf("the gated request: admitted %v, want %v", ok, !tc.drain)
			}
			admitted := 0
			for range 20 {
				if decide() {
					admitted++
				}
			}
			if admitted != 10 {
				t.Fatalf("%d of 20 requests admitted after the reset, want the limit, 10", admitted)
			}
			if err := rs.Peek(bgCtx, c, res); err != nil {
				t.Fatal(err)
			}
			if res[0].Remaining != 0 {
				t.Fatalf("Redis holds %d remaining, want 0", res[0].Remaining)
			}
		})
	}
}
