package protect

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/manualclock"
)

// takeNow is Acquire's fast path without the queue: a slot for tenant
// when Acquire would hand one out at once, else nil (the simulations
// never wait; a queued request would be dispatched by the same rule,
// mayTakeLocked(q, true)).
func takeNow(l *Limiter, tenant string) *Slot {
	l.mu.Lock()
	q := l.tenants[tenant]
	if q == nil {
		q = l.newTenantLocked(tenant, "")
	}
	if q.n == 0 && l.mayTakeLocked(q, l.queued == 0) {
		return l.takeLocked(q, l.o.Now())
	}
	l.forgetLocked(q)
	l.mu.Unlock()
	return nil
}

// reserveSetup: limit 10; tenant A (weight 2) holds 9 long-lived slots and
// has one request queued; tenant B (weight 1) held one slot and has one
// request queued behind A's. Returns A's slots and the queued Acquires'
// results.
func reserveSetup(t *testing.T, bctx context.Context) (l *Limiter, a []*Slot, aQueued, bQueued chan error, aSlot chan *Slot) {
	weights := map[string]int{"gold": 2}
	l = New(Options{Min: 10, Max: 10, Initial: 10, MaxWait: time.Minute, TargetWait: time.Minute, QueueLimit: 100,
		Weight: func(tier string) int { return max(weights[tier], 1) }})
	ctx := context.Background()
	for range 9 {
		s, _, err := l.Acquire(ctx, "A", "gold", Normal, false)
		if err != nil {
			t.Fatal(err)
		}
		a = append(a, s)
	}
	b1, _, err := l.Acquire(ctx, "B", "", Normal, false)
	if err != nil {
		t.Fatal(err)
	}
	aQueued, bQueued, aSlot = make(chan error, 1), make(chan error, 1), make(chan *Slot, 1)
	go func() {
		s, _, err := l.Acquire(ctx, "A", "gold", Normal, false)
		aSlot <- s
		aQueued <- err
	}()
	waitFor(t, func() bool { return l.Stats().Queued == 1 })
	go func() {
		s, _, err := l.Acquire(bctx, "B", "", Normal, false)
		if s != nil {
			s.Release(time.Millisecond, false)
		}
		bQueued <- err
	}()
	waitFor(t, func() bool { return l.Stats().Queued == 2 })
	b1.Release(time.Millisecond, false) // one slot free now
	return l, a, aQueued, bQueued, aSlot
}

// TestBelowShareWaiterPassesReservedHead: B has nothing in flight (below
// its share of 3.3) and a slot is free, while the queue's head, A, is
// above its share and held back by the reserve: B's queued request takes
// the slot at once, instead of waiting until one of A's (perhaps
// long-lived) requests ends.
func TestBelowShareWaiterPassesReservedHead(t *testing.T) {
	l, a, aQueued, bQueued, aSlot := reserveSetup(t, context.Background())
	defer func() {
		for _, s := range a {
			s.Release(time.Millisecond, false)
		}
		<-aQueued
		if s := <-aSlot; s != nil {
			s.Release(time.Millisecond, false)
		}
	}()
	select {
	case err := <-bQueued:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(500 * time.Millisecond):
		t.Fatalf("B (below its share) still queued 500ms after a slot freed: %+v", l.Stats())
	}
}

// TestAbandonRedispatches: B's queued request leaves (client gone) and B
// is forgotten, so the reserve drops to 0 and A is below its share again:
// A's queued request takes the free slot at once, not at the next
// release.
func TestAbandonRedispatches(t *testing.T) {
	bctx, cancel := context.WithCancel(context.Background())
	l, a, aQueued, bQueued, aSlot := reserveSetup(t, bctx)
	defer func() {
		for _, s := range a {
			s.Release(time.Millisecond, false)
		}
	}()
	cancel()
	<-bQueued
	select {
	case err := <-aQueued:
		if err != nil {
			t.Fatal(err)
		}
		(<-aSlot).Release(time.Millisecond, false)
	case <-time.After(500 * time.Millisecond):
		st := l.Stats()
		t.Errorf("A alone, a slot free, its request still queued 500ms after B left: %+v", st)
		a[0].Release(time.Millisecond, false)
		a = a[1:]
		<-aQueued
		(<-aSlot).Release(time.Millisecond, false)
	}
}

// floodSim runs a flat-latency upstream (no capacity limit) for d under
// a load that takes every slot tenant "flood" may take; hold, when set,
// is a tenant with one long-lived request in flight throughout; failEvery,
// when set, makes one flood request fail per failEvery.
func floodSim(d time.Duration, hold bool, failEvery time.Duration) (*Limiter, int) {
	clk := manualclock.New(time.Unix(1_800_000_000, 0))
	l := New(Options{Min: 2, Max: 1000, Initial: 20, Now: clk.Now})
	const latency = 20 * time.Millisecond
	type req struct {
		s   *Slot
		end time.Time
	}
	var inflight []req
	var long *Slot
	if hold {
		long = takeNow(l, "light")
	}
	nextFail := clk.Now().Add(failEvery)
	for end := clk.Now().Add(d); clk.Now().Before(end); clk.Advance(time.Millisecond) {
		now := clk.Now()
		kept := inflight[:0]
		for _, r := range inflight {
			if now.Before(r.end) {
				kept = append(kept, r)
				continue
			}
			fail := failEvery > 0 && !now.Before(nextFail)
			if fail {
				nextFail = nextFail.Add(failEvery)
			}
			r.s.Release(latency, fail)
		}
		inflight = kept
		for s := takeNow(l, "flood"); s != nil; s = takeNow(l, "flood") {
			inflight = append(inflight, req{s, now.Add(latency)})
		}
	}
	lim := l.Stats().Limit
	if long != nil {
		long.Release(d, false)
	}
	return l, lim
}

// TestReserveDoesNotFreezeGrowth: while another tenant is active the
// flood leaves the reserve free, so in flight tops out below the limit;
// the limit still grows as far as without the other tenant (growth asks
// that in flight reached the limit but for the reserve).
func TestReserveDoesNotFreezeGrowth(t *testing.T) {
	_, alone := floodSim(5*time.Second, false, 0)
	_, withLight := floodSim(5*time.Second, true, 0)
	t.Logf("limit after 5s of flood at a flat 20ms upstream: alone %d, with a light tenant's one long request %d", alone, withLight)
	if withLight < alone/2 {
		t.Fatalf("limit %d with one light request in flight, %d without: the reserve keeps in flight below the limit, so it never grows", withLight, alone)
	}
}

// TestSporadicFailuresDoNotRatchet: one failed request every 800ms (a
// broken endpoint, 0.02% of the traffic) at an upstream whose latency
// never moves cuts nothing: failures cut only once they are a fifth of
// the recent answers. (When each failure cut to 0.9 × in flight and
// barred growth for 1s, the limit decayed to Min.)
func TestSporadicFailuresDoNotRatchet(t *testing.T) {
	_, lim := floodSim(30*time.Second, false, 800*time.Millisecond)
	t.Logf("limit after 30s at a flat 20ms upstream with one failure per 800ms: %d", lim)
	if lim < 20 {
		t.Fatalf("limit %d (started at 20; it grows past 150 in 5s without failures, see TestReserveDoesNotFreezeGrowth): a failure every 800ms ratchets it to Min though latency never rose", lim)
	}
}
