package limiter

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// TestLeaseExpiriesOrder: popDue hands out the entries whose leases ended,
// earliest first, and keeps the others, whatever order they came in.
func TestLeaseExpiriesOrder(t *testing.T) {
	var q leaseExpiries
	entries := make([]*leaseEntry, 100)
	for i := range entries {
		entries[i] = &leaseEntry{key: fmt.Sprint(i)}
	}
	// Pushed in a scrambled order: entry i ends at i.
	for i := range entries {
		j := (i * 37) % len(entries)
		q.push(int64(j), entries[j])
	}
	due := q.popDue(49, nil)
	if len(due) != 50 || q.len() != 50 {
		t.Fatalf("%d due and %d left at 49, want 50 and 50", len(due), q.len())
	}
	for i, x := range due {
		if x.e != entries[i] || x.at != int64(i) {
			t.Fatalf("due[%d] is entry %s at %d, want %d", i, x.e.key, x.at, i)
		}
	}
	if due = q.popDue(48, due[:0]); len(due) != 0 {
		t.Fatalf("%d due at 48 after 49 was swept", len(due))
	}
	due = q.popDue(1000, due[:0])
	if len(due) != 50 || q.len() != 0 || due[0].e != entries[50] || due[49].e != entries[99] {
		t.Fatalf("%d due at 1000 (first %s, last %s), %d left", len(due), due[0].e.key, due[49].e.key, q.len())
	}
}

// entryCount is the number of entries a LeaseStore keeps.
func entryCount(s *LeaseStore) int {
	return shardSum(s, func(sh *leaseShard) int { return len(sh.m) })
}

// seenCount is the number of first sights a LeaseStore has noted.
func seenCount(s *LeaseStore) int {
	return shardSum(s, func(sh *leaseShard) int { return len(sh.seen) })
}

// shardSum adds up count over the shards of s, each under its lock.
func shardSum(s *LeaseStore, count func(*leaseShard) int) int {
	n := 0
	for i := range s.shards {
		s.shards[i].mu.Lock()
		n += count(&s.shards[i])
		s.shards[i].mu.Unlock()
	}
	return n
}

// expiringCount is the number of lease ends a LeaseStore has recorded.
func expiringCount(s *LeaseStore) int {
	n := 0
	for i := range s.shards {
		n += s.shards[i].expiring.len()
	}
	return n
}

// TestLeaseSweepIdleAndExpired: the sweeper gives back an expired lease at
// the first sweep after it ends, through the lease ends it recorded (none
// is left over once they have passed), and forgets an entry idle for more
// than a ttl within leaseIdleRounds sweeps, never one seen since.
func TestLeaseSweepIdleAndExpired(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	f := newLeaseFixture(t, srv, true, 1)
	lease := Lease{Max: 50, TTL: time.Second}
	res := make([]Result, 1)
	check := func(i int) []Check {
		return []Check{leaseCheck(TokenBucket, fmt.Sprintf("sweep-%d", i), 1000, 1000*time.Hour, lease)}
	}
	decide := func(i int) {
		t.Helper()
		if ok, err := f.lease.Decide(bgCtx, check(i), res); !ok || err != nil {
			t.Fatalf("tenant %d: admitted %v, err %v", i, ok, err)
		}
	}
	const tenants = 40
	// Each tenant twice at one instant: the second request takes a lease
	// of two and leaves one unit.
	for i := range tenants {
		decide(i)
		decide(i)
	}
	if n := entryCount(f.lease); n != tenants {
		t.Fatalf("%d entries, want %d", n, tenants)
	}
	if st := f.lease.Stats()["p"]; st.Units != tenants || expiringCount(f.lease) != tenants {
		t.Fatalf("%d units held and %d lease ends recorded, want %d and %d", st.Units, expiringCount(f.lease), tenants, tenants)
	}
	// Before the leases end, sweeping gives nothing back and forgets
	// nothing.
	for range leaseIdleRounds {
		f.lease.Sweep(bgCtx)
	}
	if st := f.lease.Stats()["p"]; st.Units != tenants || st.Returned != 0 || entryCount(f.lease) != tenants {
		t.Fatalf("before the leases end: %+v, %d entries", st, entryCount(f.lease))
	}
	// One sweep when they end gives every lease back (and forgets
	// nothing: no entry has been idle for more than a ttl yet).
	f.clk.Advance(time.Second)
	f.lease.Sweep(bgCtx)
	if st := f.lease.Stats()["p"]; st.Units != 0 || st.Returned != tenants || expiringCount(f.lease) != 0 || entryCount(f.lease) != tenants {
		t.Fatalf("one sweep when the leases ended: %+v, %d lease ends left, %d entries", st, expiringCount(f.lease), entryCount(f.lease))
	}
	if err := f.redis.Peek(bgCtx, check(0), res); err != nil || res[0].Remaining != 998 {
		t.Fatalf("Redis remaining %d (err %v), want 998", res[0].Remaining, err)
	}
	// Idle for more than a ttl, except tenant 0: every other entry is
	// forgotten within leaseIdleRounds sweeps. (Its demand is one request
	// again, as a new entry's.) A tenant seen once is a first sight, not
	// an entry, and is forgotten a ttl after it was seen.
	f.clk.Advance(300 * time.Millisecond)
	decide(0)
	decide(tenants)
	if n, seen := entryCount(f.lease), seenCount(f.lease); n != tenants || seen != 1 {
		t.Fatalf("%d entries and %d first sights, want %d and 1", n, seen, tenants)
	}
	f.clk.Advance(200 * time.Millisecond)
	for range leaseIdleRounds {
		f.lease.Sweep(bgCtx)
	}
	if n, seen := entryCount(f.lease), seenCount(f.lease); n != 1 || seen != 1 {
		t.Fatalf("%d entries and %d first sights after %d sweeps, want 1 (the tenant seen within a ttl) and 1", n, seen, leaseIdleRounds)
	}
	f.clk.Advance(time.Second)
	for range leaseIdleRounds {
		f.lease.Sweep(bgCtx)
	}
	if n, seen := entryCount(f.lease), seenCount(f.lease); n != 0 || seen != 0 {
		t.Fatalf("%d entries and %d first sights a ttl later, want none", n, seen)
	}
}

// TestLeaseExpiriesOnePerEntry: however often a busy entry is refilled,
// the sweeper's heap holds one item for it, and its lease is still given
// back when it ends. (An item per grant made a lease of 2 units with a
// one-hour ttl leave 100 000 items behind 200 000 requests.)
func TestLeaseExpiriesOnePerEntry(t *testing.T) {
	clk := newManualClock(baseTime)
	s := NewLeaseStore(LeaseOptions{Store: NewMemoryStore(MemoryOptions{Clock: clk}), Taker: grantingTaker{}, Clock: clk, SweepInterval: -1})
	defer s.Close()
	c := []Check{{Algorithm: TokenBucket, Tenant: "busy", Policy: "p", Rate: Rate{Limit: 1 << 30, Window: time.Hour}, Cost: 1, Lease: Lease{Max: 2, TTL: time.Hour}}}
	res := make([]Result, 1)
	for i := range 2000 {
		if ok, err := s.Decide(bgCtx, c, res); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if i%100 == 0 {
			clk.Advance(time.Minute)
			s.Sweep(bgCtx)
		}
	}
	if n := expiringCount(s); n != 1 {
		t.Fatalf("%d lease ends recorded for one entry, want 1", n)
	}
	if s.Stats()["p"].Units != 1 {
		t.Fatalf("units held %d, want 1 (a lease of 2, one spent)", s.Stats()["p"].Units)
	}
	clk.Advance(time.Hour)
	s.Sweep(bgCtx)
	if st := s.Stats()["p"]; st.Units != 0 || st.Returned != 1 || expiringCount(s) != 0 {
		t.Fatalf("after the lease ended: %+v, %d lease ends left", st, expiringCount(s))
	}
}

// TestLeaseSweepDuringPrefetch: a lease that ends while its prefetch is
// on the wire is looked at again at the next sweep, so when the prefetch
// fails (nothing extends the lease) its units still go back.
func TestLeaseSweepDuringPrefetch(t *testing.T) {
	clk := newManualClock(baseTime)
	taker := &gatedTaker{held: make(chan struct{}), release: make(chan error)}
	s := NewLeaseStore(LeaseOptions{Store: NewMemoryStore(MemoryOptions{Clock: clk}), Taker: taker, Clock: clk, SweepInterval: -1})
	defer s.Close()
	c := []Check{{Algorithm: TokenBucket, Tenant: "prefetching", Policy: "p", Rate: Rate{Limit: 1 << 30, Window: time.Hour}, Cost: 1, Lease: Lease{Max: 12, TTL: time.Second}}}
	res := make([]Result, 1)
	decide := func() {
		if ok, err := s.Decide(bgCtx, c, res); !ok || err != nil {
			t.Error(ok, err)
		}
	}
	// Ramp until a grant of at least 8 (top-ups bring the lease to 12).
	for i := 0; s.entry(c).lastGrant < 8; i++ {
		if i == 100 {
			t.Fatalf("no grant of 8 or more after %d requests", i)
		}
		decide()
	}
	// Spend down to 3 left: the next request leaves 2 (a quarter of a
	// grant of 8 to 11) and prefetches.
	for s.Stats()["p"].Units > 3 {
		decide()
	}
	taker.hold.Store(true)
	prefetching := make(chan struct{})
	go func() {
		defer close(prefetching)
		decide()
	}()
	select {
	case <-taker.held:
	case <-prefetching:
		t.Fatal("no prefetch")
	}
	clk.Advance(1100 * time.Millisecond)
	held := func() int64 {
		e := s.entry(c)
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.units
	}
	s.Sweep(bgCtx) // the lease ended, its prefetch is in flight
	if n, st := held(), s.Stats()["p"]; n != 2 || st.Returned != 0 {
		taker.release <- nil
		t.Fatalf("while the prefetch is in flight: %d units held, %+v; want 2 held", n, st)
	}
	taker.release <- errors.New("the store failed")
	<-prefetching
	s.Sweep(bgCtx)
	if n, st := held(), s.Stats()["p"]; n != 0 || st.Returned != 2 || expiringCount(s) != 0 {
		t.Fatalf("after the prefetch failed: %d units held, %+v, %d lease ends left; want the 2 units given back", n, st, expiringCount(s))
	}
}

// gatedTaker grants every lease in full, but while hold is set a call
// that takes units waits for release and fails with what it sends.
type gatedTaker struct {
	hold    atomic.Bool
	held    chan struct{}
	release chan error
}

func (g *gatedTaker) Lease(ctx context.Context, req *LeaseRequest, results []Result) (LeaseGrant, error) {
	if req.Want > 0 && g.hold.Load() {
		g.held <- struct{}{}
		if err := <-g.release; err != nil {
			return LeaseGrant{}, err
		}
	}
	return grantingTaker{}.Lease(ctx, req, results)
}

// grantingTaker grants every lease in full, without a store: for
// measuring the lease cache alone.
type grantingTaker struct{}

func (grantingTaker) Lease(_ context.Context, req *LeaseRequest, results []Result) (LeaseGrant, error) {
	for i := range req.Checks {
		results[i] = Result{Allowed: true, Remaining: 1 << 30}
	}
	return LeaseGrant{Requests: req.Want, Expires: req.TTL}, nil
}

// BenchmarkLeaseSweep: one sweep of a store that keeps 10 000 entries (a
// thin tenant each, every one holding a lease that has not ended): what
// the sweeper costs, ten times a second, on an instance serving a wide
// tenant population.
func BenchmarkLeaseSweep(b *testing.B) {
	clk := newManualClock(baseTime)
	s := NewLeaseStore(LeaseOptions{Store: NewMemoryStore(MemoryOptions{Clock: clk}), Taker: grantingTaker{}, Clock: clk, SweepInterval: -1})
	defer s.Close()
	res := make([]Result, 1)
	for i := range 10000 {
		c := []Check{{Algorithm: TokenBucket, Tenant: fmt.Sprint("t", i), Policy: "p", Rate: Rate{Limit: 1 << 30, Window: time.Hour}, Cost: 1, Lease: Lease{Max: 50, TTL: time.Hour}}}
		for range 2 {
			if ok, err := s.Decide(bgCtx, c, res); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
	}
	b.ResetTimer()
	for range b.N {
		s.Sweep(bgCtx)
	}
}

// admitAllStore admits every request without keeping anything: the inner
// store of a lease cache whose own memory is measured.
type admitAllStore struct{}

func (admitAllStore) Decide(_ context.Context, checks []Check, results []Result) (bool, error) {
	for i := range checks {
		results[i] = Result{Allowed: true, Remaining: 1 << 30}
	}
	return true, nil
}
func (admitAllStore) Release(context.Context, []Check) error        { return nil }
func (admitAllStore) Peek(context.Context, []Check, []Result) error { return nil }
func (admitAllStore) Reset(context.Context, string, []string) error { return nil }
func (admitAllStore) Close() error                                  { return nil }
func (admitAllStore) Now() time.Time                                { return time.Time{} }

// TestLeaseEntryMemory: what an instance keeps per tenant seen within a
// lease ttl. A tenant seen once is a hash in the seen table; one seen
// twice gets an entry (whether or not it ever leases). The long tail of a
// large tenant population, each tenant seen once a ttl or less often,
// costs the first for up to 10s after each tenant's request on an hourly
// limit. Measured on 20 000 tenants, each seen once, then once more.
func TestLeaseEntryMemory(t *testing.T) {
	clk := newManualClock(baseTime)
	s := NewLeaseStore(LeaseOptions{Store: admitAllStore{}, Taker: grantingTaker{}, Clock: clk, SweepInterval: -1})
	defer s.Close()
	const tenants = 20000
	res := make([]Result, 1)
	checks := make([]Check, tenants)
	for i := range checks {
		checks[i] = Check{Algorithm: TokenBucket, Tenant: fmt.Sprintf("tenant-%06d", i), Policy: "api",
			Rate: Rate{Limit: 1000, Window: time.Hour}, Cost: 1, Lease: Lease{Max: 50}}
	}
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	round := func() float64 {
		before := heap()
		for i := range checks {
			if ok, err := s.Decide(bgCtx, checks[i:i+1], res); !ok || err != nil {
				t.Fatal(ok, err)
			}
		}
		clk.Advance(time.Second)
		return float64(heap()-before) / tenants
	}
	once := round()
	twice := round()
	t.Logf("%.0f bytes per tenant seen once, %.0f more per tenant seen twice (an entry)", once, twice)
	if once > 128 {
		t.Fatalf("%.0f bytes per tenant seen once, want at most 128", once)
	}
	if twice > 1024 {
		t.Fatalf("%.0f bytes per entry, want at most 1 KiB", twice)
	}
	if n := s.Stats()["api"].Entries; n != tenants {
		t.Fatalf("%d entries after two sights of %d tenants", n, tenants)
	}
	runtime.KeepAlive(checks)
}

// hookStore is an admitAllStore that can panic once, deny, and hold its
// calls until release is closed (telling entered first).
type hookStore struct {
	admitAllStore
	panics  atomic.Int32
	deny    bool
	entered chan struct{}
	release chan struct{}
}

func (h *hookStore) Decide(ctx context.Context, checks []Check, results []Result) (bool, error) {
	if h.panics.Add(-1) >= 0 {
		panic("store failure")
	}
	if h.release != nil {
		h.entered <- struct{}{}
		<-h.release
	}
	if h.deny {
		for i := range checks {
			results[i] = Result{RetryAfter: time.Minute}
		}
		return false, nil
	}
	return h.admitAllStore.Decide(ctx, checks, results)
}

// TestLeaseFirstSightPanic: a store that panics deciding a first sight
// (net/http recovers the panic) does not leave the checks' later requests
// waiting for that decision forever.
func TestLeaseFirstSightPanic(t *testing.T) {
	in := &hookStore{}
	in.panics.Store(1)
	s := NewLeaseStore(LeaseOptions{Store: in, Taker: grantingTaker{}, SweepInterval: -1})
	defer s.Close()
	c := []Check{leaseCheck(TokenBucket, "panics", 1000, time.Hour, Lease{Max: 50})}
	res := make([]Result, 1)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the store's panic did not reach the caller")
			}
		}()
		s.Decide(bgCtx, c, res)
	}()
	ctx, cancel := context.WithTimeout(bgCtx, 2*time.Second)
	defer cancel()
	if ok, err := s.Decide(ctx, c, res); !ok || err != nil {
		t.Fatalf("the request after the panic: admitted %v, err %v", ok, err)
	}
}

// TestLeaseSmallTopUpKeepsPrefetching: a top-up of a few units (the lease
// still held most of the demand) sets the next mark at a quarter of what
// the lease then holds, so a steady tenant's requests keep being served
// from the lease. Counted from the small top-up alone, the mark fell
// below one unit and the lease ran dry: a request waited for a refill.
func TestLeaseSmallTopUpKeepsPrefetching(t *testing.T) {
	clk := newManualClock(baseTime)
	s := NewLeaseStore(LeaseOptions{Store: admitAllStore{}, Taker: grantingTaker{}, Clock: clk, SweepInterval: -1})
	defer s.Close()
	c := []Check{leaseCheck(TokenBucket, "small-top-up", 1000, time.Hour, Lease{Max: 50, TTL: time.Second})}
	e := s.entry(c)
	now := clk.Now().UnixNano()
	e.mu.Lock()
	for i := range 6 {
		e.noteDemand(now - int64(i)*int64(10*time.Millisecond))
	}
	// Five left of a grant of 20: the next request leaves 4 (a fifth of
	// 20) and tops up to the demand of 7.
	e.units, e.lastGrant, e.expires = 5, 20, now+int64(time.Second)
	e.mu.Unlock()
	res := make([]Result, 1)
	for i := range 30 {
		if ok, err := s.Decide(bgCtx, c, res); !ok || err != nil || res[0].From != OriginLease {
			t.Fatalf("request %d: admitted %v, err %v, from %v; want every one from the lease", i, ok, err, res[0].From)
		}
		clk.Advance(10 * time.Millisecond)
	}
}

// TestLeaseIdleEntryStartsAfresh: an entry idle for a ttl counts its
// demand as a new entry would, so forgetting it changes nothing: a busy
// period's count does not carry over into the size of the next lease.
func TestLeaseIdleEntryStartsAfresh(t *testing.T) {
	s := NewLeaseStore(LeaseOptions{Store: admitAllStore{}, Taker: grantingTaker{}, SweepInterval: -1})
	defer s.Close()
	c := []Check{leaseCheck(TokenBucket, "idle", 1000, time.Hour, Lease{Max: 500, TTL: time.Second})}
	kept, fresh := s.newEntry("kept", c), s.newEntry("fresh", c)
	t0 := baseTime.UnixNano()
	for i := range 100 {
		kept.noteDemand(t0 + int64(i)*int64(time.Millisecond))
	}
	t1 := t0 + int64(1200*time.Millisecond)
	for i := range 8 {
		kept.noteDemand(t1 + int64(i))
		fresh.noteDemand(t1 + int64(i))
	}
	if k, f := kept.want(t1+8), fresh.want(t1+8); k != f {
		t.Fatalf("an entry idle for 1.2 ttl wants %d, a new one %d", k, f)
	}
}

// TestLeaseKeepsEntryHandingOutTurns: an entry whose turns (a delay)
// reach past its idle ttl is not forgotten while they last.
func TestLeaseKeepsEntryHandingOutTurns(t *testing.T) {
	clk := newManualClock(baseTime)
	s := NewLeaseStore(LeaseOptions{Store: admitAllStore{}, Taker: grantingTaker{}, Clock: clk, SweepInterval: -1})
	defer s.Close()
	c := leaseCheck(TokenBucket, "turns", 1000, time.Hour, Lease{Max: 50, TTL: time.Second})
	c.Rate.Delay = 30 * time.Second
	e := s.entry([]Check{c})
	now := clk.Now().UnixNano()
	e.mu.Lock()
	e.noteDemand(now)
	e.reserveUntil = now + int64(20*time.Second)
	e.mu.Unlock()
	clk.Advance(2 * time.Second)
	forgetIdle(e.shard, clk.Now().UnixNano())
	if entryCount(s) != 1 {
		t.Fatal("an entry handing out turns for 18s more was forgotten")
	}
}

// TestLeaseCloseDuringFirstSight: a first sight denied after Close makes
// no entry in the drained store.
func TestLeaseCloseDuringFirstSight(t *testing.T) {
	in := &hookStore{deny: true, entered: make(chan struct{}), release: make(chan struct{})}
	s := NewLeaseStore(LeaseOptions{Store: in, Taker: grantingTaker{}, SweepInterval: -1})
	c := []Check{leaseCheck(TokenBucket, "closing", 1000, time.Hour, Lease{Max: 50})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Decide(bgCtx, c, make([]Result, 1))
	}()
	<-in.entered
	s.Close()
	close(in.release)
	<-done
	if n := entryCount(s); n != 0 {
		t.Fatalf("%d entries after Close", n)
	}
}

// panicTaker is a LeaseTaker that panics on its next panics calls.
type panicTaker struct {
	grantingTaker
	panics atomic.Int32
}

func (p *panicTaker) Lease(ctx context.Context, req *LeaseRequest, results []Result) (LeaseGrant, error) {
	if p.panics.Add(-1) >= 0 {
		panic("store failure")
	}
	return p.grantingTaker.Lease(ctx, req, results)
}

// TestLeaseFlightPanic: a store that panics during an entry's call (a
// refill, a prefetch, or the decision of a lone request; net/http
// recovers the panic) does not leave the entry's later requests waiting
// for that call forever: each of the next 100 is admitted at once.
func TestLeaseFlightPanic(t *testing.T) {
	for _, call := range []string{"refill", "prefetch", "decide-one"} {
		t.Run(call, func(t *testing.T) {
			clk := newManualClock(baseTime)
			in, taker := &hookStore{}, &panicTaker{}
			s := NewLeaseStore(LeaseOptions{Store: in, Taker: taker, Clock: clk, SweepInterval: -1})
			defer s.Close()
			c := []Check{leaseCheck(TokenBucket, "panics-"+call, 1<<20, time.Hour, Lease{Max: 8, TTL: time.Minute})}
			res := make([]Result, 1)
			panicked := false
			decide := func() {
				t.Helper()
				defer func() {
					if recover() != nil {
						panicked = true
					}
				}()
				ctx, cancel := context.WithTimeout(bgCtx, 2*time.Second)
				defer cancel()
				if ok, err := s.Decide(ctx, c, res); !ok || err != nil {
					t.Fatalf("admitted %v, err %v", ok, err)
				}
			}
			switch call {
			case "refill":
				decide() // a first sight
				taker.panics.Store(1)
				decide() // the entry's first lease
			case "prefetch":
				for range 20 {
					decide() // leases of 2, 4 and 8
				}
				taker.panics.Store(1)
				for i := 0; !panicked && i < 20; i++ {
					decide()
				}
			case "decide-one":
				for range 3 {
					decide() // a first sight and a lease of 2, spent
				}
				clk.Advance(2 * time.Minute) // the demand is one again
				in.panics.Store(1)
				decide()
			}
			if !panicked {
				t.Fatalf("the store's %s did not panic", call)
			}
			for range 100 {
				decide()
			}
		})
	}
}
