package limiter

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// TestDelayClusterSlots: checks of two tenants (two cluster slots) are
// decided slot by slot; a turn taken in the first slot is given back when
// the second denies, and Refund gives back in both slots.
func TestDelayClusterSlots(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	clk := newManualClock(baseTime)
	s := NewRedisStore(RedisOptions{Client: cl.Client(t), Timeout: testTimeout})
	s.now = func() int64 { return clk.Now().UnixMicro() }
	if keySlot([]byte("{dx}")) == keySlot([]byte("{dy}")) {
		t.Fatal("pick tenants in different slots")
	}
	x := Check{Algorithm: TokenBucket, Tenant: "dx", Policy: "p", Rate: delayRate, Cost: 1}
	y := Check{Algorithm: GCRA, Tenant: "dy", Policy: "p", Rate: Rate{Limit: 10, Window: time.Second, Burst: 1, Delay: 300 * time.Millisecond}, Cost: 1}
	for k := range 4 {
		ok, res := mustDecide(t, s, x, y)
		w := time.Duration(k) * 100 * time.Millisecond
		if !ok || res[0].Wait != w || res[1].Wait != w {
			t.Fatalf("request %d: admitted %v, waits %s and %s, want %s", k, ok, res[0].Wait, res[1].Wait, w)
		}
	}
	// x would wait 400ms, y may not: nothing is kept.
	ok, res := mustDecide(t, s, x, y)
	if ok || !res[0].Allowed || res[0].Wait != 0 || res[1].Allowed || res[1].RetryAfter != 400*time.Millisecond {
		t.Fatalf("fifth request: admitted %v, %+v", ok, res)
	}
	peek := mustPeek(t, s, withCost(x, 0), withCost(y, 0))
	if peek[0].Reset != 400*time.Millisecond || peek[1].Reset != 400*time.Millisecond {
		t.Fatalf("after a denial across slots: %+v, want both buckets 4 turns deep", peek)
	}
	if err := giveBack(s, []Check{x, y, withCost(x, 0)}); err != nil {
		t.Fatal(err)
	}
	peek = mustPeek(t, s, withCost(x, 0), withCost(y, 0))
	if peek[0].Reset != 300*time.Millisecond || peek[1].Reset != 300*time.Millisecond {
		t.Fatalf("after a refund across slots: %+v, want both buckets 3 turns deep", peek)
	}
}

// TestDelayNotForced: recovery charging (Charge) never drives a bucket of
// a policy with a delay into debt: what the fallback admitted is charged
// only as far as the bucket holds, and turns stay where they were.
func TestDelayNotForced(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	clk := newManualClock(baseTime)
	s := NewRedisStore(RedisOptions{Client: srv.Client(t), Timeout: testTimeout})
	s.now = func() int64 { return clk.Now().UnixMicro() }
	for _, algo := range []Algorithm{TokenBucket, GCRA} {
		c := Check{Algorithm: algo, Tenant: "forced", Policy: algo.String(), Rate: delayRate, Cost: 1}
		mustDecide(t, s, c)
		charged := make([]int64, 1)
		if err := s.Charge(bgCtx, "", []Check{withCost(c, 5)}, charged); err != nil || charged[0] != 0 {
			t.Fatalf("%s: Charge = %v, charged %d, want 0 (the bucket is empty)", algo, err, charged[0])
		}
		if _, res := mustDecide(t, s, c); res[0].Wait != 100*time.Millisecond {
			t.Errorf("%s: next turn %s away, want 100ms", algo, res[0].Wait)
		}
	}
}

// TestDelayLease: a leased policy with a delay serves its undelayed
// requests from leases; once the bucket is empty, turns come from the
// store, one call each; a turn too far away is cached as a denial until
// it could come within the delay.
func TestDelayLease(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	f := newLeaseFixture(t, srv, true, 1)
	c := leaseCheck(TokenBucket, "lease-delay", 10, time.Second, Lease{Max: 5, TTL: time.Hour})
	c.Rate.Delay = time.Second
	res := make([]Result, 1)
	decide := func() (bool, Result) {
		t.Helper()
		ok, err := f.lease.Decide(bgCtx, []Check{c}, res)
		if err != nil {
			t.Fatal(err)
		}
		return ok, res[0]
	}
	for i := range 10 {
		if ok, r := decide(); !ok || r.Wait != 0 {
			t.Fatalf("request %d: admitted %v %+v, want served at once", i, ok, r)
		}
	}
	if d := f.calls.get("decide"); d != 0 {
		t.Errorf("%d decide calls for the burst, want every unit from leases", d)
	}
	for k := 1; k <= 10; k++ {
		if ok, r := decide(); !ok || r.Wait != time.Duration(k)*100*time.Millisecond || r.From != OriginStore {
			t.Fatalf("turn %d: admitted %v %+v, want a wait of %dms from the store", k, ok, r, k*100)
		}
	}
	if ok, r := decide(); ok || r.RetryAfter != 1100*time.Millisecond {
		t.Fatalf("beyond the delay: admitted %v %+v, want Retry-After 1.1s", ok, r)
	}
	if ok, r := decide(); ok || r.From != OriginDenialCache {
		t.Fatalf("right after: admitted %v %+v, want the denial cache", ok, r)
	}
	if d := f.calls.get("decide"); d != 11 {
		t.Errorf("%d decide calls, want 11: one per turn and one denial", d)
	}
	// 100ms later a unit came back: the next turn is 1s away again.
	f.clk.Advance(100 * time.Millisecond)
	if ok, r := decide(); !ok || r.Wait != time.Second {
		t.Fatalf("100ms later: admitted %v %+v, want a wait of 1s", ok, r)
	}
	if st := f.lease.Stats()["p"]; st.Spent != 10 {
		t.Errorf("lease stats %+v, want 10 units spent", st)
	}
}

// failingDecider is a store whose decisions fail and whose charges are
// counted.
type failingDecider struct {
	brokenStore
	charges int
}

func (r *failingDecider) Charge(context.Context, string, []Check, []int64) error {
	r.charges++
	return nil
}

// TestDelayBreakerRefund: a give-back goes through a closed breaker and is
// refused by an open one.
func TestDelayBreakerRefund(t *testing.T) {
	inner := &failingDecider{}
	b := NewBreakerStore(inner, BreakerOptions{Failures: 1, Cooldown: time.Hour})
	c := []Check{tbCheck("t", "p", 1, time.Second)}
	if err := giveBack(b, c); err != nil || inner.charges != 1 {
		t.Fatalf("closed: %v, %d give-backs", err, inner.charges)
	}
	if _, err := b.Decide(bgCtx, c, make([]Result, 1)); !errors.Is(err, errUnreachable) {
		t.Fatal(err)
	}
	if err := giveBack(b, c); !errors.Is(err, ErrBreakerOpen) || inner.charges != 1 {
		t.Fatalf("open: %v, %d give-backs", err, inner.charges)
	}
}
