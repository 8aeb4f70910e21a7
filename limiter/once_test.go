package limiter

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// onceTargets are the topologies the id tests run on: a standalone server
// and a 3-master cluster, where a call's checks of two tenants are two
// script calls, each with the id's key in its own slot.
func onceTargets(t *testing.T) map[string]func(t *testing.T) (*RedisStore, redis.UniversalClient) {
	return map[string]func(t *testing.T) (*RedisStore, redis.UniversalClient){
		"standalone": func(t *testing.T) (*RedisStore, redis.UniversalClient) {
			c := redistest.StartStandalone(t, redistest.Options{}).Client(t)
			return NewRedisStore(RedisOptions{Client: c, Timeout: testTimeout}), c
		},
		"cluster": func(t *testing.T) (*RedisStore, redis.UniversalClient) {
			c := redistest.StartCluster(t, 3, 0).Client(t)
			return NewRedisStore(RedisOptions{Client: c, Timeout: testTimeout}), c
		},
	}
}

// onceRate holds far more than the tests take, and refills less than one
// unit over a test: Remaining is the capacity less exactly what was taken.
var onceRate = Rate{Limit: 1_000_000, Window: 8000 * time.Hour}

// TestRedisChargeOnce: a Charge with an id is applied once, however often
// it is sent, and every attempt is answered the same; the id is kept in
// each tenant's slot for IdempotencyTTL; another id is another charge.
// Give-backs (negative costs) are applied once too.
func TestRedisChargeOnce(t *testing.T) {
	for name, target := range onceTargets(t) {
		t.Run(name, func(t *testing.T) {
			s, client := target(t)
			if keySlot([]byte("{once-a}")) == keySlot([]byte("{once-b}")) {
				t.Fatal("pick tenants in different slots")
			}
			checks := []Check{
				{Algorithm: TokenBucket, Tenant: "once-a", Policy: "tb", Rate: onceRate, Cost: 50_000},
				{Algorithm: GCRA, Tenant: "once-a", Policy: "gcra", Rate: onceRate, Cost: 3},
				{Algorithm: FixedWindow, Tenant: "once-b", Policy: "fw", Rate: onceRate, Cost: 7},
				{Algorithm: SlidingLog, Tenant: "once-b", Policy: "log", Rate: Rate{Limit: 100, Window: time.Hour}, Cost: 2},
			}
			peek := func() []int64 {
				var rem []int64
				for _, c := range checks {
					rem = append(rem, mustPeek(t, s, withCost(c, 0))[0].Remaining)
				}
				return rem
			}
			id := NewChargeID()
			first := make([]int64, len(checks))
			for attempt := range 3 {
				charged := make([]int64, len(checks))
				if err := s.Charge(bgCtx, id, checks, charged); err != nil {
					t.Fatal(err)
				}
				if attempt == 0 {
					copy(first, charged)
				}
				if fmt.Sprint(charged) != "[50000 3 7 2]" {
					t.Fatalf("attempt %d answered %v, want the first attempt's [50000 3 7 2]", attempt, charged)
				}
			}
			want := fmt.Sprint([]int64{1_000_000 - 50_000, 1_000_000 - 3, 1_000_000 - 7, 98})
			if got := fmt.Sprint(peek()); got != want {
				t.Fatalf("after 3 attempts with one id: remaining %s, want %s (charged once)", got, want)
			}
			// One call per slot, each with the id in its first tenant's
			// slot: standalone, one call for both tenants.
			tenants := []string{"once-a", "once-b"}
			if name == "standalone" {
				tenants = tenants[:1]
			}
			for _, tenant := range tenants {
				key := string(appendOnceKey(nil, DefaultPrefix, tenant, id))
				ttl, err := client.PTTL(bgCtx, key).Result()
				if err != nil || ttl <= IdempotencyTTL-5*time.Second || ttl > IdempotencyTTL {
					t.Errorf("id key %s: PTTL %v (%v), want about %v", key, ttl, err, IdempotencyTTL)
				}
				if !strings.HasPrefix(key, "rl:once:{"+tenant+"}:") {
					t.Errorf("id key %s is not in the tenant's hash slot", key)
				}
			}
			// Another id is another charge.
			if err := s.Charge(bgCtx, NewChargeID(), checks[:1], make([]int64, 1)); err != nil {
				t.Fatal(err)
			}
			if got := peek()[0]; got != 1_000_000-100_000 {
				t.Fatalf("a second id: remaining %d, want %d", got, 1_000_000-100_000)
			}

			// Give-backs: token bucket and GCRA units go back once;
			// window and log units stay; a bucket that is not there has
			// nothing to take them.
			back := []Check{withCost(checks[0], -30_000), withCost(checks[1], -3), withCost(checks[2], -7),
				{Algorithm: TokenBucket, Tenant: "once-a", Policy: "none", Rate: onceRate, Cost: -5}}
			bid := NewChargeID()
			for range 2 {
				charged := make([]int64, len(back))
				if err := s.Charge(bgCtx, bid, back, charged); err != nil {
					t.Fatal(err)
				}
				if fmt.Sprint(charged) != "[-30000 -3 0 0]" {
					t.Fatalf("give-back answered %v, want [-30000 -3 0 0]", charged)
				}
			}
			want = fmt.Sprint([]int64{1_000_000 - 70_000, 1_000_000, 1_000_000 - 7, 98})
			if got := fmt.Sprint(peek()); got != want {
				t.Fatalf("after a give-back sent twice: remaining %s, want %s", got, want)
			}
			if n, _ := client.Exists(bgCtx, string(AppendKey(nil, DefaultPrefix, TokenBucket, "once-a", "none", ""))).Result(); n != 0 {
				t.Error("a give-back to a missing bucket created it")
			}
		})
	}
}

// TestRedisChargeOnceInDebt: a settlement's forced charge against a rate
// with room for debt (debtRate) goes below empty, once per id.
func TestRedisChargeOnceInDebt(t *testing.T) {
	s, _ := onceTargets(t)["standalone"](t)
	r := Rate{Limit: 100, Window: time.Hour}
	c := Check{Algorithm: TokenBucket, Tenant: "debt", Policy: "tokens", Rate: debtRate(TokenBucket, r), Cost: 250}
	id := NewChargeID()
	for range 2 {
		charged := make([]int64, 1)
		if err := s.Charge(bgCtx, id, []Check{c}, charged); err != nil || charged[0] != 250 {
			t.Fatalf("charged %d (%v), want 250", charged[0], err)
		}
	}
	// 250 taken from 100: 150 owed, so the next unit is 151 units of
	// refill (151 x 36s) away.
	res := mustPeek(t, s, Check{Algorithm: TokenBucket, Tenant: "debt", Policy: "tokens", Rate: r, Cost: 1})
	if res[0].Remaining != 0 || res[0].Allowed || res[0].RetryAfter < 150*36*time.Second || res[0].RetryAfter > 151*36*time.Second {
		t.Fatalf("after a 250-unit settlement sent twice: %+v, want a debt of 150 (retry after about %v)", res[0], 151*36*time.Second)
	}
}

// TestRedisLeaseGiveBackOnce: a lease call with an id gives back once and,
// sent again, answers its grant without taking another; a retry of a call
// whose reply was lost gives back what that call granted when it ran, and
// makes its give-back when it did not, once either way.
func TestRedisLeaseGiveBackOnce(t *testing.T) {
	for name, target := range onceTargets(t) {
		t.Run(name, func(t *testing.T) {
			s, _ := target(t)
			c := Check{Algorithm: TokenBucket, Tenant: "lease-once", Policy: "p", Rate: onceRate, Cost: 2,
				Lease: Lease{Max: 10, TTL: time.Second}}
			remaining := func() int64 { return mustPeek(t, s, withCost(c, 0))[0].Remaining }
			lease := func(req LeaseRequest) LeaseGrant {
				t.Helper()
				req.Checks, req.Instances, req.TTL = []Check{c}, 1, time.Second
				g, err := s.Lease(bgCtx, &req, make([]Result, 1))
				if err != nil {
					t.Fatal(err)
				}
				return g
			}
			g := lease(LeaseRequest{Want: 10})
			if g.Requests != 10 || remaining() != 1_000_000-20 {
				t.Fatalf("first lease %+v, remaining %d", g, remaining())
			}
			// A refill that gives 4 requests' worth back, sent twice.
			id := NewChargeID()
			g1 := lease(LeaseRequest{Want: 5, GiveBack: 4, GiveBackAt: g.At, ID: id})
			g2 := lease(LeaseRequest{Want: 5, GiveBack: 4, GiveBackAt: g.At, ID: id})
			if g1.Requests != 5 || g2 != g1 {
				t.Fatalf("the same call twice: %+v then %+v, want the same grant of 5", g1, g2)
			}
			// 20 taken, 8 back, 10 taken: 22.
			if got := remaining(); got != 1_000_000-22 {
				t.Fatalf("remaining %d, want %d: the call was applied once", got, 1_000_000-22)
			}
			// Its reply was lost: the retry gives back the 5 requests' worth
			// it granted (nobody serves them), twice sent, once applied.
			for range 2 {
				lease(LeaseRequest{GiveBack: 4, GiveBackAt: g.At, ID: id, Retry: true})
			}
			if got := remaining(); got != 1_000_000-12 {
				t.Fatalf("after the retry: remaining %d, want %d (the lost grant back, once)", got, 1_000_000-12)
			}
			// A call that never ran: its retry makes its give-back, once.
			lost := NewChargeID()
			for range 2 {
				lease(LeaseRequest{GiveBack: 3, GiveBackAt: g1.At, ID: lost, Retry: true})
			}
			if got := remaining(); got != 1_000_000-6 {
				t.Fatalf("retry of a call that never ran: remaining %d, want %d", got, 1_000_000-6)
			}
			// A retry needs its id and takes nothing.
			req := LeaseRequest{Checks: []Check{c}, Want: 1, ID: lost, Retry: true}
			if _, err := s.Lease(bgCtx, &req, make([]Result, 1)); err == nil {
				t.Error("a retry that takes units was accepted")
			}
		})
	}
}

// TestLeaseGiveBackRetried: a lease's give-back that times out (Redis
// paused, so it runs when Redis resumes) is kept by the recorder and sent
// again under its id: the unused units go back once, not lost and not
// twice.
func TestLeaseGiveBackRetried(t *testing.T) {
	checkLeaks(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	defer client.Close()
	rs := NewRedisStore(RedisOptions{Client: client, Timeout: faultTimeout})
	rec := NewRecorder(RecorderOptions{})
	clk := newManualClock(time.Now())
	ls := NewLeaseStore(LeaseOptions{Store: rs, Taker: rs, Recorder: rec, Clock: clk, SweepInterval: -1})
	defer ls.Close()
	c := Check{Algorithm: TokenBucket, Tenant: "giveback", Policy: "p", Rate: onceRate, Cost: 1, Lease: Lease{Max: 10, TTL: time.Second}}
	remaining := func() int64 { return mustPeek(t, rs, withCost(c, 0))[0].Remaining }
	// Demand for 10: the second refill takes a lease of 10.
	for range 12 {
		mustDecide(t, ls, c)
	}
	before := remaining()
	served := int64(12)
	if before >= 1_000_000-served {
		t.Fatalf("remaining %d after %d requests: nothing leased ahead", before, served)
	}
	srv.Pause()
	clk.Advance(2 * time.Second)
	ls.Sweep(bgCtx) // the give-back times out
	srv.Resume()
	if rec.Pending() != 1 {
		t.Fatalf("recorder holds %d calls after a failed give-back, want 1", rec.Pending())
	}
	// Redis ran the give-back when it resumed; the retry changes nothing.
	for range 2 {
		if _, err := rec.Flush(bgCtx, rs); err != nil {
			t.Fatal(err)
		}
	}
	if got := remaining(); got != 1_000_000-served {
		t.Fatalf("remaining %d after the give-back was retried, want %d (only the %d served)", got, 1_000_000-served, served)
	}
}

// TestRecorderRetrySameChecks: a recovery call retried after some of its
// units stopped counting is sent with the same checks (those with cost 0),
// so its id keeps its slot and its record: Redis answers the retry from
// the record and charges nothing twice, whether the check that stopped
// counting came first (the id's key is in its tenant's slot) or last (the
// record holds a result for it).
func TestRecorderRetrySameChecks(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	s := NewRedisStore(RedisOptions{Client: srv.Client(t), Timeout: testTimeout})
	clk := newManualClock(baseTime.Add(time.Second))
	s.now = func() int64 { return clk.Now().UnixMicro() }
	second := Rate{Limit: 10, Window: time.Second} // its units stop counting within 2s
	day := Rate{Limit: 1000, Window: 24 * time.Hour}
	for _, c := range []struct {
		name         string
		short, daily Check // recorded in the order the recorder sorts them
	}{
		{"first, two tenants",
			Check{Algorithm: TokenBucket, Tenant: "retry-a", Policy: "second"},
			Check{Algorithm: FixedWindow, Tenant: "retry-b", Policy: "day"}},
		{"last, one tenant",
			Check{Algorithm: TokenBucket, Tenant: "retry-t", Policy: "second"},
			Check{Algorithm: FixedWindow, Tenant: "retry-t", Policy: "day"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := NewRecorder(RecorderOptions{Clock: clk})
			rec.Record(&c.short, second, 5)
			rec.Record(&c.daily, day, 100)
			// The first attempt runs, and its reply is lost.
			lost := chargeFunc(func(id string, cs []Check, charged []int64) error {
				if err := s.Charge(bgCtx, id, cs, charged); err != nil {
					t.Fatal(err)
				}
				return fmt.Errorf("limiter: redis force: %w", context.DeadlineExceeded)
			})
			if _, err := rec.Flush(bgCtx, lost); err == nil {
				t.Fatal("the lost reply was not reported")
			}
			clk.Advance(5 * time.Second)
			if _, err := rec.Flush(bgCtx, s); err != nil || rec.Pending() != 0 {
				t.Fatalf("retry: %v, Pending %d", err, rec.Pending())
			}
			d := c.daily
			d.Rate = day
			if got := mustPeek(t, s, d)[0].Remaining; got != 900 {
				t.Fatalf("day bucket: %d left, want 900 (its 100 units charged once)", got)
			}
		})
	}
}

// TestLeaseCloseGivesBackLater: leases that Close cannot give back before
// its deadline (Redis paused) are handed to the recorder, which gives them
// back once Redis answers: none is lost.
func TestLeaseCloseGivesBackLater(t *testing.T) {
	checkLeaks(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	defer client.Close()
	rs := NewRedisStore(RedisOptions{Client: client, Timeout: faultTimeout})
	rec := NewRecorder(RecorderOptions{})
	ls := NewLeaseStore(LeaseOptions{Store: rs, Taker: rs, Recorder: rec, SweepInterval: -1, GiveBackTimeout: 50 * time.Millisecond})
	var checks []Check
	for _, tenant := range []string{"close-a", "close-b", "close-c"} {
		c := Check{Algorithm: TokenBucket, Tenant: tenant, Policy: "p", Rate: onceRate, Cost: 1, Lease: Lease{Max: 10, TTL: time.Hour}}
		checks = append(checks, c)
		for range 12 { // the second refill leases 10 ahead
			mustDecide(t, ls, c)
		}
	}
	srv.Pause()
	_ = ls.Close()
	srv.Resume()
	if rec.Pending() != len(checks) {
		t.Fatalf("recorder holds %d give-backs, want %d", rec.Pending(), len(checks))
	}
	for range 2 {
		if _, err := rec.Flush(bgCtx, rs); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range checks {
		if got := mustPeek(t, rs, withCost(c, 0))[0].Remaining; got != 1_000_000-12 {
			t.Errorf("%s: remaining %d, want %d (only the 12 served)", c.Tenant, got, 1_000_000-12)
		}
	}
}
