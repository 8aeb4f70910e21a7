package protect

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/manualclock"
)

// TestAdaptsToCapacity simulates an upstream whose latency is flat up to
// C requests in flight and grows in proportion beyond (the latency of a
// request is fixed by the count it finds), under a load that always fills
// the limit, starting from the default initial limit of 20: the limit
// reaches 0.9 C within 5 s, then in flight never passes 1.2 C; when C
// halves the limit follows within 5 s, and settles at C/2 to 1.2 × C/2.
func TestAdaptsToCapacity(t *testing.T) {
	for _, tc := range []struct {
		latency  time.Duration
		capacity int
	}{
		{20 * time.Millisecond, 100},
		{200 * time.Millisecond, 20},
		{200 * time.Millisecond, 40},
	} {
		t.Run(fmt.Sprint(tc.latency, "_C", tc.capacity), func(t *testing.T) {
			clk := manualclock.New(time.Unix(1_800_000_000, 0))
			l := New(Options{Min: 2, Max: 1000, Now: clk.Now})
			capacity := tc.capacity
			type req struct {
				s   *Slot
				end time.Time
			}
			var inflight []req
			// run simulates d in steps of 1ms and returns when in flight
			// first reached at least reach (or -1), and the most in
			// flight from then on.
			run := func(d time.Duration, reach int) (reached time.Duration, peak int) {
				reached = -1
				from := clk.Now()
				for end := from.Add(d); clk.Now().Before(end); clk.Advance(time.Millisecond) {
					now := clk.Now()
					kept := inflight[:0]
					for _, r := range inflight {
						if !now.Before(r.end) {
							r.s.Release(r.end.Sub(r.s.start), false)
						} else {
							kept = append(kept, r)
						}
					}
					inflight = kept
					for {
						s, _, err := tryAcquire(l)
						if err != nil {
							break
						}
						lat := tc.latency
						if n := len(inflight) + 1; n > capacity {
							lat = lat * time.Duration(n) / time.Duration(capacity)
						}
						inflight = append(inflight, req{s, now.Add(lat)})
					}
					if reached < 0 && len(inflight) >= reach {
						reached = now.Sub(from)
					}
					if reached >= 0 {
						peak = max(peak, len(inflight))
					}
				}
				return reached, peak
			}
			c := float64(capacity)
			reached, peak := run(20*time.Second, int(0.9*c))
			lim := l.Stats().Limit
			t.Logf("C %d: 0.9 C after %v, then at most %d in flight; limit %d", capacity, reached, peak, lim)
			if reached < 0 || reached > 5*time.Second || float64(peak) > 1.2*c || float64(lim) < 0.9*c || float64(lim) > 1.2*c {
				t.Fatalf("C %d: 0.9 C after %v (want within 5s), then at most %d in flight (want ≤ 1.2 C), limit %d (want 0.9 C to 1.2 C)", capacity, reached, peak, lim)
			}
			capacity /= 2
			run(5*time.Second, 0)
			if lim := l.Stats().Limit; float64(lim) > 1.2*c/2 {
				t.Fatalf("5 s after C halved to %d: limit %d, want at most 1.2 × C/2", capacity, lim)
			}
			_, peak = run(10*time.Second, 0)
			if lim := l.Stats().Limit; float64(lim) < 0.9*c/2 || float64(lim) > 1.2*c/2 || float64(peak) > 1.2*c/2 {
				t.Fatalf("C halved to %d: limit %d, in flight at most %d; want 0.9 to 1.2 × C/2", capacity, lim, peak)
			}
		})
	}
}

// TestFastFailuresDoNotTeachTheBaseline: an upstream that refuses fast
// when overloaded (a 503 in microseconds) shrinks the limit, and its
// refusals do not become the latency baseline (which would pin the limit
// to its floor).
func TestFastFailuresDoNotTeachTheBaseline(t *testing.T) {
	clk := manualclock.New(time.Unix(1_800_000_000, 0))
	l := New(Options{Min: 2, Max: 100, Initial: 40, Now: clk.Now})
	for range 20 { // 2 s of 200 ms answers at 40 in flight
		for range 40 {
			s, _, _ := tryAcquire(l)
			clk.Advance(2500 * time.Microsecond)
			s.Release(200*time.Millisecond, false)
		}
	}
	before := l.Stats()
	for range 5 { // then fast refusals
		for range 40 {
			s, _, _ := tryAcquire(l)
			clk.Advance(2500 * time.Microsecond)
			s.Release(50*time.Microsecond, true)
		}
	}
	after := l.Stats()
	if after.Baseline != before.Baseline || after.Limit >= before.Limit {
		t.Fatalf("before %+v, after %+v: want the baseline kept and the limit lower", before, after)
	}
}

// tryAcquire takes a slot only when one is free now (the simulation
// never queues).
func tryAcquire(l *Limiter) (*Slot, bool, error) {
	l.mu.Lock()
	if l.inflight >= int(l.limit) {
		l.mu.Unlock()
		return nil, false, errors.New("full")
	}
	q := l.tenants["sim"]
	if q == nil {
		q = &tenantQueue{name: "sim", weight: 1, index: -1}
		l.tenants["sim"] = q
		l.weights++
	}
	return l.takeLocked(q, l.o.Now()), false, nil
}

// TestFairShare: with the limit reached, a flooding tenant queued first
// gets its weight's share of the freed slots while others wait: with
// weights 1 (flood), 1 and 2, the slots go 1:1:2.
func TestFairShare(t *testing.T) {
	weights := map[string]int{"free": 1, "gold": 2}
	l := New(Options{Min: 1, Max: 1, Initial: 1, MaxWait: time.Minute, TargetWait: time.Minute, QueueLimit: 100,
		Weight: func(tier string) int { return weights[tier] }})
	first, _, err := l.Acquire(context.Background(), "flood", "free", Normal, false)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	enqueue := func(tenant, tier string, n int) {
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, _, err := l.Acquire(context.Background(), tenant, tier, Normal, false)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				order = append(order, tenant)
				mu.Unlock()
				s.Release(time.Millisecond, false)
			}()
		}
	}
	// The flood queues 40 first, then the others 20 each.
	for i := range 40 {
		enqueue("flood", "free", 1)
		waitFor(t, func() bool { return l.Stats().Queued == i+1 })
	}
	for i := range 20 {
		enqueue("light", "free", 1)
		enqueue("gold", "gold", 1)
		waitFor(t, func() bool { return l.Stats().Queued == 40+2*(i+1) })
	}
	first.Release(time.Millisecond, false)
	wg.Wait()
	// The first 40 served after the others arrived: 10 flood, 10 light,
	// 20 gold (the order is by virtual finish time; the flood had queued
	// first but gets its share).
	counts := map[string]int{}
	for _, tenant := range order[:40] {
		counts[tenant]++
	}
	if counts["flood"] > 12 || counts["light"] < 9 || counts["gold"] < 18 {
		t.Fatalf("first 40 slots: %v (order %v)", counts, order)
	}
}

// TestAloneTakesAll: a tenant alone is never queued below the limit, and
// queued requests are served in arrival order when nobody else waits.
func TestAloneTakesAll(t *testing.T) {
	l := New(Options{Min: 5, Max: 5, Initial: 5})
	var slots []*Slot
	for range 5 {
		s, _, err := l.Acquire(context.Background(), "solo", "", Normal, false)
		if err != nil {
			t.Fatal(err)
		}
		slots = append(slots, s)
	}
	if st := l.Stats(); st.InFlight != 5 || st.Queued != 0 {
		t.Fatalf("%+v", st)
	}
	for _, s := range slots {
		s.Release(time.Millisecond, false)
	}
}

// TestCoDel: a queue that drains within the target is never shed, however
// long; waits above the target for a whole interval are shed.
func TestCoDel(t *testing.T) {
	l := New(Options{Min: 1, Max: 1, Initial: 1, TargetWait: 20 * time.Millisecond, Interval: 50 * time.Millisecond, MaxWait: 5 * time.Second, QueueLimit: 100})
	hold, _, _ := l.Acquire(context.Background(), "a", "", Normal, false)
	results := make(chan error, 20)
	for range 20 {
		go func() {
			s, _, err := l.Acquire(context.Background(), "a", "", Normal, false)
			if err == nil {
				time.Sleep(15 * time.Millisecond) // slower than the queue can bear
				s.Release(15*time.Millisecond, false)
			}
			results <- err
		}()
	}
	waitFor(t, func() bool { return l.Stats().Queued == 20 })
	hold.Release(time.Millisecond, false)
	shed, served := 0, 0
	for range 20 {
		var se *ShedError
		switch err := <-results; {
		case err == nil:
			served++
		case errors.As(err, &se) && se.Reason == ReasonWait:
			shed++
		default:
			t.Fatalf("unexpected %v", err)
		}
	}
	if shed == 0 || served < 3 {
		t.Fatalf("served %d, shed %d: want some of each", served, shed)
	}
}

// TestQueueLimitAndTimeout: a full queue sheds at once; a request waits
// at most MaxWait; a client that leaves takes its place back.
func TestQueueLimitAndTimeout(t *testing.T) {
	l := New(Options{Min: 1, Max: 1, Initial: 1, QueueLimit: 2, MaxWait: 50 * time.Millisecond, TargetWait: time.Second})
	hold, _, _ := l.Acquire(context.Background(), "a", "", Normal, false)
	errs := make(chan error, 2)
	for range 2 {
		go func() { _, _, err := l.Acquire(context.Background(), "a", "", Normal, false); errs <- err }()
	}
	waitFor(t, func() bool { return l.Stats().Queued == 2 })
	var se *ShedError
	if _, _, err := l.Acquire(context.Background(), "a", "", Normal, false); !errors.As(err, &se) || se.Reason != ReasonQueueFull {
		t.Fatalf("third queued: %v", err)
	}
	for range 2 {
		if err := <-errs; !errors.As(err, &se) || se.Reason != ReasonTimeout {
			t.Fatalf("after MaxWait: %v", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(10 * time.Millisecond); cancel() }()
	if _, _, err := l.Acquire(ctx, "b", "", Normal, false); !errors.Is(err, context.Canceled) {
		t.Fatalf("client gone: %v", err)
	}
	if st := l.Stats(); st.Queued != 0 || st.InFlight != 1 {
		t.Fatalf("after: %+v", st)
	}
	hold.Release(time.Millisecond, false)
	if s, wouldQueue, err := l.Acquire(context.Background(), "a", "", Normal, true); err != nil || wouldQueue {
		t.Fatalf("shadow below the limit: %v %v", wouldQueue, err)
	} else {
		_, wq, _ := l.Acquire(context.Background(), "a", "", Normal, true)
		if !wq {
			t.Fatal("shadow at the limit: not reported as would-queue")
		}
		s.Release(0, false)
	}
}

// TestPriority: critical requests of a tenant go before its normal and
// sheddable ones.
func TestPriority(t *testing.T) {
	l := New(Options{Min: 1, Max: 1, Initial: 1, MaxWait: time.Minute, TargetWait: time.Minute})
	hold, _, _ := l.Acquire(context.Background(), "a", "", Normal, false)
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	for i, p := range []Priority{Sheddable, Normal, Critical} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, _, err := l.Acquire(context.Background(), "a", "", p, false)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, fmt.Sprint(p))
			mu.Unlock()
			s.Release(0, false)
		}()
		waitFor(t, func() bool { return l.Stats().Queued == i+1 })
	}
	hold.Release(0, false)
	wg.Wait()
	if fmt.Sprint(order) != "[2 1 0]" {
		t.Fatalf("order %v, want critical, normal, sheddable", order)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestReserveForTenantsBelowShare: a tenant flooding the queue cannot
// take the last free slots while another tenant is active; a request of a
// tenant below its fair share takes one at once instead of waiting behind
// the flood for the next slot to free.
func TestReserveForTenantsBelowShare(t *testing.T) {
	l := New(Options{Min: 10, Max: 10, Initial: 10, MaxWait: time.Minute, TargetWait: time.Minute, QueueLimit: 100})
	light, _, err := l.Acquire(context.Background(), "light", "", Normal, false)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var flood []*Slot
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, _, err := l.Acquire(context.Background(), "flood", "", Normal, false)
			if err == nil {
				mu.Lock()
				flood = append(flood, s)
				mu.Unlock()
			}
		}()
	}
	// One slot is kept free per other active tenant: the flood holds 8.
	waitFor(t, func() bool { st := l.Stats(); return st.InFlight+st.Queued == 21 })
	if st := l.Stats(); st.InFlight != 9 || st.Queued != 12 {
		t.Fatalf("with the flood queued: %+v, want 9 in flight (8 flood, 1 light) and 12 queued", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	second, _, err := l.Acquire(ctx, "light", "", Normal, false)
	if err != nil {
		t.Fatalf("the light tenant's second request waited behind the flood: %v", err)
	}
	// The limit is full now: the flood waits, and gets the slots back
	// once the light tenant is done.
	if st := l.Stats(); st.InFlight != 10 || st.Queued != 12 {
		t.Fatalf("after the light request: %+v", st)
	}
	light.Release(time.Millisecond, false)
	second.Release(time.Millisecond, false)
	waitFor(t, func() bool { return l.Stats().InFlight == 10 })
	for {
		mu.Lock()
		s := flood
		flood = nil
		mu.Unlock()
		if len(s) == 0 && l.Stats().Queued == 0 {
			break
		}
		for _, x := range s {
			x.Release(time.Millisecond, false)
		}
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	if st := l.Stats(); st.InFlight != 0 || st.Queued != 0 {
		t.Fatalf("after all: %+v", st)
	}
}

// TestFailureCutsAtOnce: once failures are a fifth of the recent answers
// (three in a row), each lowers the limit below what is in flight at
// once, not at the end of the period (an overloaded upstream answers the
// next requests with failures in microseconds); a burst of failures cuts
// to 0.9 of what is still in flight, not 0.9 per failure; and a failure
// among many successes cuts nothing.
func TestFailureCutsAtOnce(t *testing.T) {
	clk := manualclock.New(time.Unix(1_800_000_000, 0))
	l := New(Options{Min: 2, Max: 100, Initial: 40, Now: clk.Now})
	var slots []*Slot
	for range 30 {
		s, _, _ := tryAcquire(l)
		slots = append(slots, s)
	}
	clk.Advance(10 * time.Millisecond)
	slots[0].Release(time.Millisecond, true)
	slots[1].Release(time.Millisecond, true)
	if lim := l.Stats().Limit; lim != 40 {
		t.Fatalf("limit after two failures: %d, want 40 (not yet a fifth of the answers)", lim)
	}
	slots[2].Release(time.Millisecond, true)
	if lim := l.Stats().Limit; lim != 24 { // 0.9 × 27 in flight
		t.Fatalf("limit after a third failure with 27 in flight: %d, want 24", lim)
	}
	for _, s := range slots[3:10] {
		s.Release(time.Millisecond, true)
	}
	if lim := l.Stats().Limit; lim != 18 { // 0.9 × 20, not 40 × 0.9^8
		t.Fatalf("limit after 10 failures with 20 left in flight: %d, want 18", lim)
	}
	// No growth for a second after the cut, however fast the answers.
	for _, s := range slots[10:19] {
		clk.Advance(100 * time.Millisecond)
		s.Release(time.Millisecond, false)
	}
	if lim := l.Stats().Limit; lim != 18 {
		t.Fatalf("limit 0.9 s after the cut: %d, want 18", lim)
	}
}

// BenchmarkAcquireRelease is the fast path: a slot free at once, taken
// and given back, for one tenant and for a new tenant each time (the
// tenant's state is made when it has nothing in flight).
func BenchmarkAcquireRelease(b *testing.B) {
	tenants := make([]string, 1024)
	for i := range tenants {
		tenants[i] = fmt.Sprint("tenant-", i)
	}
	for _, bc := range []struct {
		name string
		pick func(i int) string
	}{
		{"one_tenant", func(int) string { return "a" }},
		{"many_tenants", func(i int) string { return tenants[i%len(tenants)] }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := New(Options{Min: 100, Max: 100, Initial: 100})
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				s, _, err := l.Acquire(ctx, bc.pick(i), "", Normal, false)
				if err != nil {
					b.Fatal(err)
				}
				s.Release(time.Millisecond, false)
				i++
			}
		})
	}
}
