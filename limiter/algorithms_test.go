package limiter

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

const msec = time.Millisecond

// algoStep is one request of a scripted sequence: at an instant (since t0), a
// decision for cost units, or a Release of release units.
type algoStep struct {
	at      time.Duration
	cost    int64
	release int64
	rate    Rate // when set, replaces the scenario's rate for this step
	want    Result
}

func wantAllow(remaining int64, reset time.Duration) Result {
	return Result{Allowed: true, Remaining: remaining, Reset: reset}
}

func wantDeny(remaining int64, retryAfter, reset time.Duration) Result {
	return Result{Remaining: remaining, RetryAfter: retryAfter, Reset: reset}
}

type algoScenario struct {
	name  string
	algo  Algorithm
	rate  Rate
	steps []algoStep
}

// runAlgoScenario plays the steps against the pure functions and against a
// MemoryStore, which must both give exactly the wanted results.
func runAlgoScenario(t *testing.T, sc algoScenario) {
	t.Run("pure", func(t *testing.T) {
		b := pureBucket{algo: sc.algo}
		for i, st := range sc.steps {
			if st.release > 0 {
				b.release(st.release)
				continue
			}
			r := sc.rate
			if st.rate.Limit != 0 {
				r = st.rate
			}
			got := b.decide(baseTime.Add(st.at).UnixNano(), r, st.cost)
			if got != st.want {
				t.Fatalf("step %d (at %s, cost %d): got %+v, want %+v", i, st.at, st.cost, got, st.want)
			}
		}
	})
	t.Run("memory", func(t *testing.T) {
		m, clk := newTestStore(t, MemoryOptions{})
		for i, st := range sc.steps {
			clk.Set(baseTime.Add(st.at))
			c := Check{Algorithm: sc.algo, Tenant: "t", Policy: "p", Rate: sc.rate, Cost: st.cost}
			if st.rate.Limit != 0 {
				c.Rate = st.rate
			}
			if st.release > 0 {
				c.Cost = st.release
				if err := m.Release(context.Background(), []Check{c}); err != nil {
					t.Fatal(err)
				}
				continue
			}
			ok, res := mustDecide(t, m, c)
			if ok != st.want.Allowed || res[0] != st.want {
				t.Fatalf("step %d (at %s, cost %d): got %v %+v, want %+v", i, st.at, st.cost, ok, res[0], st.want)
			}
		}
	})
}

// tokenSteps is shared by token_bucket and gcra, which must behave alike:
// 10 per 10s is one token per second, capacity 10.
var tokenSteps = []algoStep{
	{at: 0, cost: 1, want: wantAllow(9, time.Second)},
	{at: 0, cost: 9, want: wantAllow(0, time.Second)},
	{at: 0, cost: 1, want: wantDeny(0, time.Second, time.Second)},
	{at: 500 * msec, cost: 1, want: wantDeny(0, 500*msec, 500*msec)},
	{at: 500 * msec, cost: 3, want: wantDeny(0, 2500*msec, 500*msec)},
	{at: time.Second, cost: 1, want: wantAllow(0, time.Second)},
	{at: 3500 * msec, cost: 0, want: wantAllow(2, 500*msec)},
	{at: 3500 * msec, cost: 11, want: wantDeny(2, 10*time.Second, 500*msec)}, // never fits
	{at: 3500 * msec, cost: 2, want: wantAllow(0, 500*msec)},
	{at: 4 * time.Second, cost: 2, want: wantDeny(1, time.Second, time.Second)},
	{at: time.Hour, cost: 0, want: wantAllow(10, 0)},
	{at: time.Hour, cost: 10, want: wantAllow(0, time.Second)},
}

// burstSteps: 1 per second, capacity 5.
var burstSteps = []algoStep{
	{at: 0, cost: 5, want: wantAllow(0, time.Second)},
	{at: 0, cost: 1, want: wantDeny(0, time.Second, time.Second)},
	{at: 2 * time.Second, cost: 0, want: wantAllow(2, time.Second)},
	{at: 2 * time.Second, cost: 6, want: wantDeny(2, time.Second, time.Second)}, // never fits: Window
	{at: 2 * time.Second, cost: 3, want: wantDeny(2, time.Second, time.Second)},
	{at: 3 * time.Second, cost: 3, want: wantAllow(0, time.Second)},
	{at: 10 * time.Second, cost: 0, want: wantAllow(5, 0)},
}

// thirdSteps: 3 per second, a rate whose token interval (333333333.3ns)
// is not a whole number of nanoseconds: waits round up, never down. The
// token bucket then keeps the 0.000000002 token left over (next token in
// 333333333ns) where GCRA's interval is rounded up to 333333334ns.
func thirdSteps(lastReset time.Duration) []algoStep {
	return []algoStep{
		{at: 0, cost: 3, want: wantAllow(0, 333333334)},
		{at: 333333333, cost: 1, want: wantDeny(0, 1, 1)},
		{at: 333333334, cost: 1, want: wantAllow(0, lastReset)},
	}
}

func TestTokenBucket(t *testing.T) {
	for _, sc := range []algoScenario{
		{"basic", TokenBucket, Rate{Limit: 10, Window: 10 * time.Second}, tokenSteps},
		{"burst", TokenBucket, Rate{Limit: 1, Window: time.Second, Burst: 5}, burstSteps},
		{"third", TokenBucket, Rate{Limit: 3, Window: time.Second}, thirdSteps(333333333)},
	} {
		t.Run(sc.name, func(t *testing.T) { runAlgoScenario(t, sc) })
	}
}

func TestGCRA(t *testing.T) {
	for _, sc := range []algoScenario{
		{"basic", GCRA, Rate{Limit: 10, Window: 10 * time.Second}, tokenSteps},
		{"burst", GCRA, Rate{Limit: 1, Window: time.Second, Burst: 5}, burstSteps},
		{"third", GCRA, Rate{Limit: 3, Window: time.Second}, thirdSteps(333333334)},
	} {
		t.Run(sc.name, func(t *testing.T) { runAlgoScenario(t, sc) })
	}
}

func TestSlidingWindow(t *testing.T) {
	runAlgoScenario(t, algoScenario{"basic", SlidingWindow, Rate{Limit: 10, Window: 10 * time.Second}, []algoStep{
		// weighted 4: 7 units fit once prev=4 weighs 3, 2.5s into the next window.
		{at: 0, cost: 4, want: wantAllow(6, 12500*msec)},
		// weighted 10: one unit fits once prev=10 weighs 9, at 11s.
		{at: 5 * time.Second, cost: 6, want: wantAllow(0, 6*time.Second)},
		{at: 9900 * msec, cost: 1, want: wantDeny(0, 1100*msec, 1100*msec)},
		// New window: prev=10 still weighs 10 at its start.
		{at: 10 * time.Second, cost: 1, want: wantDeny(0, time.Second, time.Second)},
		// At 15s prev weighs 5.
		{at: 15 * time.Second, cost: 0, want: wantAllow(5, time.Second)},
		{at: 15 * time.Second, cost: 5, want: wantAllow(0, time.Second)},
		{at: 15 * time.Second, cost: 11, want: wantDeny(0, 10*time.Second, time.Second)}, // never fits
		// 3 units fit when prev weighs 2, at 18s.
		{at: 15 * time.Second, cost: 3, want: wantDeny(0, 3*time.Second, time.Second)},
		// Next window: prev=5 weighs 2.5 at 25s.
		{at: 25 * time.Second, cost: 0, want: wantAllow(7, time.Second)},
		// cur=5, prev=0: a full window of 10 needs cur to fade out
		// entirely, two windows after it.
		{at: 25 * time.Second, cost: 10, want: wantDeny(7, 5*time.Second, time.Second)},
		{at: 40 * time.Second, cost: 0, want: wantAllow(10, 0)},
	}})
}

func TestFixedWindow(t *testing.T) {
	runAlgoScenario(t, algoScenario{"basic", FixedWindow, Rate{Limit: 10, Window: 10 * time.Second}, []algoStep{
		{at: 0, cost: 4, want: wantAllow(6, 10*time.Second)},
		{at: 9900 * msec, cost: 6, want: wantAllow(0, 100*msec)},
		{at: 9900 * msec, cost: 1, want: wantDeny(0, 100*msec, 100*msec)},
		{at: 10 * time.Second, cost: 10, want: wantAllow(0, 10*time.Second)},
		{at: 10 * time.Second, cost: 11, want: wantDeny(0, 10*time.Second, 10*time.Second)}, // never fits
		{at: 15 * time.Second, cost: 0, want: wantAllow(0, 5*time.Second)},
		{at: 25 * time.Second, cost: 0, want: wantAllow(10, 0)},
	}})
}

func TestSlidingLog(t *testing.T) {
	for _, sc := range []algoScenario{
		{"basic", SlidingLog, Rate{Limit: 3, Window: 10 * time.Second}, []algoStep{
			{at: 0, cost: 1, want: wantAllow(2, 10*time.Second)},
			{at: 2 * time.Second, cost: 1, want: wantAllow(1, 8*time.Second)},
			{at: 4 * time.Second, cost: 1, want: wantAllow(0, 6*time.Second)},
			// the unit of 0s leaves the window at 10s
			{at: 5 * time.Second, cost: 1, want: wantDeny(0, 5*time.Second, 5*time.Second)},
			// two units: the second oldest (2s) leaves at 12s
			{at: 5 * time.Second, cost: 2, want: wantDeny(0, 7*time.Second, 5*time.Second)},
			{at: 5 * time.Second, cost: 4, want: wantDeny(0, 10*time.Second, 5*time.Second)}, // never fits
			// (now-Window, now]: the unit of 0s is out at exactly 10s
			{at: 10 * time.Second, cost: 1, want: wantAllow(0, 2*time.Second)},
			{at: 10 * time.Second, cost: 0, want: wantAllow(0, 2*time.Second)},
			{at: 14 * time.Second, cost: 2, want: wantAllow(0, 6*time.Second)},
			// cost 2 logged two units at 14s; 10s left at 20s
			{at: 20 * time.Second, cost: 1, want: wantAllow(0, 4*time.Second)},
			{at: 23 * time.Second, cost: 1, want: wantDeny(0, time.Second, time.Second)},
			// both units of 14s leave together
			{at: 24 * time.Second, cost: 2, want: wantAllow(0, 6*time.Second)},
			{at: time.Hour, cost: 0, want: wantAllow(3, 0)},
		}},
		{"min_interval", SlidingLog, Rate{Limit: 10, Window: 10 * time.Second, MinInterval: time.Second}, []algoStep{
			{at: 0, cost: 1, want: wantAllow(9, 10*time.Second)},
			{at: 500 * msec, cost: 1, want: wantDeny(9, 500*msec, 9500*msec)},
			{at: time.Second, cost: 1, want: wantAllow(8, 9*time.Second)},
			{at: 1200 * msec, cost: 0, want: wantAllow(8, 8800*msec)}, // a peek ignores min_interval
			{at: 1200 * msec, cost: 3, want: wantDeny(8, 800*msec, 8800*msec)},
			{at: 2 * time.Second, cost: 3, want: wantAllow(5, 8*time.Second)},
		}},
		{"min_interval_longer_than_window", SlidingLog, Rate{Limit: 5, Window: time.Second, MinInterval: 10 * time.Second}, []algoStep{
			{at: 0, cost: 1, want: wantAllow(4, time.Second)},
			{at: 5 * time.Second, cost: 1, want: wantDeny(5, 5*time.Second, 0)},
			{at: 10 * time.Second, cost: 1, want: wantAllow(4, time.Second)},
		}},
		{"limit_lowered", SlidingLog, Rate{Limit: 5, Window: 10 * time.Second}, []algoStep{
			{at: 0, cost: 5, want: wantAllow(0, 10*time.Second)},
			{at: time.Second, cost: 1, rate: Rate{Limit: 2, Window: 10 * time.Second}, want: wantDeny(0, 9*time.Second, 9*time.Second)},
			{at: 10 * time.Second, cost: 2, rate: Rate{Limit: 2, Window: 10 * time.Second}, want: wantAllow(0, 10*time.Second)},
			{at: 10 * time.Second, cost: 1, want: wantAllow(2, 10*time.Second)},
		}},
	} {
		t.Run(sc.name, func(t *testing.T) { runAlgoScenario(t, sc) })
	}
}

func TestConcurrency(t *testing.T) {
	runAlgoScenario(t, algoScenario{"basic", Concurrency, Rate{Limit: 2}, []algoStep{
		{cost: 1, want: wantAllow(1, time.Second)},
		{cost: 1, want: wantAllow(0, time.Second)},
		{cost: 1, want: wantDeny(0, time.Second, time.Second)},
		{release: 1},
		{cost: 1, want: wantAllow(0, time.Second)},
		{cost: 3, want: wantDeny(0, time.Second, time.Second)}, // never fits: 1s
		{release: 2},
		{cost: 0, want: wantAllow(2, 0)},
		{release: 5}, // more than in flight: stays at zero
		{cost: 2, want: wantAllow(0, time.Second)},
		{cost: 1, want: wantDeny(0, time.Second, time.Second)},
	}})
}

// TestBoundaryBurst: limit 10 per 10s, 10 requests at 9.9s and 10 at 10.0s.
// Only the fixed window admits all 20.
func TestBoundaryBurst(t *testing.T) {
	rate := Rate{Limit: 10, Window: 10 * time.Second}
	for _, tc := range []struct {
		algo Algorithm
		want int
	}{
		{FixedWindow, 20},
		{SlidingWindow, 10},
		{SlidingLog, 10},
		{TokenBucket, 10}, // 0.1s refills only 0.1 token
		{GCRA, 10},
	} {
		t.Run(tc.algo.String(), func(t *testing.T) {
			m, clk := newTestStore(t, MemoryOptions{})
			c := Check{Algorithm: tc.algo, Tenant: "t", Policy: "p", Rate: rate, Cost: 1}
			admitted := 0
			for _, at := range []time.Duration{9900 * msec, 10 * time.Second} {
				clk.Set(baseTime.Add(at))
				for range 10 {
					if ok, _ := mustDecide(t, m, c); ok {
						admitted++
					}
				}
			}
			if admitted != tc.want {
				t.Fatalf("admitted %d, want %d", admitted, tc.want)
			}
		})
	}
}

// TestRetryAfterNeverEarly checks, for every algorithm and awkward rates,
// that a denied request is still denied 1ns before its RetryAfter and
// admitted exactly at it (for concurrency, RetryAfter is a guess).
func TestRetryAfterNeverEarly(t *testing.T) {
	rates := []Rate{
		{Limit: 3, Window: time.Second},
		{Limit: 7, Window: 13 * time.Second, Burst: 11},
		{Limit: 1000, Window: time.Hour},
		{Limit: 1, Window: MaxWindow},
		{Limit: 999_999_937, Window: 24 * time.Hour},
	}
	for _, algo := range []Algorithm{TokenBucket, GCRA, SlidingWindow, FixedWindow, SlidingLog} {
		for _, r := range rates {
			if !algo.UsesBurst() {
				r.Burst = 0
			}
			if algo == SlidingLog && r.Limit > 10_000 {
				continue
			}
			t.Run(fmt.Sprintf("%s/%d_per_%s", algo, r.Limit, r.Window), func(t *testing.T) {
				b := pureBucket{algo: algo}
				now := baseTime.UnixNano() + 123_456_789
				// Exhaust the bucket at a few instants.
				for i := 0; i < 3; i++ {
					for b.decide(now, r, max(r.Capacity()/2, 1)).Allowed {
					}
					now += int64(r.Window) / 7
				}
				checked := 0
				defer func() {
					if checked == 0 {
						t.Fatal("no request was denied: nothing checked")
					}
				}()
				for _, cost := range []int64{1, min(2, r.Capacity()), r.Capacity()} {
					res := b.clone().decide(now, r, cost)
					if res.Allowed {
						continue
					}
					checked++
					ra := int64(res.RetryAfter)
					if ra <= 0 {
						t.Fatalf("cost %d: denied with RetryAfter %d", cost, ra)
					}
					probe := b.clone()
					if got := probe.decide(now+ra-1, r, cost); got.Allowed {
						t.Fatalf("cost %d: admitted 1ns before RetryAfter %s", cost, res.RetryAfter)
					}
					probe = b.clone()
					if got := probe.decide(now+ra, r, cost); !got.Allowed {
						t.Fatalf("cost %d: denied at RetryAfter %s: %+v", cost, res.RetryAfter, got)
					}
					// Reset: Remaining grows at Reset, not before.
					if res.Reset > 0 {
						probe = b.clone()
						if got := probe.decide(now+int64(res.Reset)-1, r, 0); got.Remaining > res.Remaining {
							t.Fatalf("Remaining %d > %d 1ns before Reset %s", got.Remaining, res.Remaining, res.Reset)
						}
						probe = b.clone()
						if got := probe.decide(now+int64(res.Reset), r, 0); got.Remaining <= res.Remaining {
							t.Fatalf("Remaining %d not above %d at Reset %s", got.Remaining, res.Remaining, res.Reset)
						}
					}
				}
			})
		}
	}
}

// TestClockBackwards: a clock that goes back never refills a bucket.
func TestClockBackwards(t *testing.T) {
	r := Rate{Limit: 10, Window: 10 * time.Second}
	for _, algo := range []Algorithm{TokenBucket, GCRA, SlidingWindow, FixedWindow, SlidingLog} {
		t.Run(algo.String(), func(t *testing.T) {
			b := pureBucket{algo: algo}
			now := baseTime.Add(15 * time.Second).UnixNano()
			if res := b.decide(now, r, 10); !res.Allowed {
				t.Fatal("first request denied")
			}
			for _, back := range []time.Duration{time.Second, 10 * time.Second, time.Hour} {
				res := b.decide(now-int64(back), r, 1)
				if res.Allowed {
					t.Fatalf("%s back in time: admitted %+v", back, res)
				}
				if res.RetryAfter < back {
					t.Fatalf("%s back in time: RetryAfter %s", back, res.RetryAfter)
				}
			}
		})
	}
}

func TestExpiresAt(t *testing.T) {
	for _, tc := range []struct {
		algo Algorithm
		rate Rate
		cost int64
		want time.Duration // after t0; 0 = immediately
	}{
		{TokenBucket, Rate{Limit: 10, Window: 10 * time.Second}, 3, 3 * time.Second},
		{TokenBucket, Rate{Limit: 3, Window: time.Second}, 1, 333333334},
		{GCRA, Rate{Limit: 10, Window: 10 * time.Second}, 3, 3 * time.Second},
		{SlidingWindow, Rate{Limit: 10, Window: 10 * time.Second}, 1, 20 * time.Second},
		{FixedWindow, Rate{Limit: 10, Window: 10 * time.Second}, 1, 10 * time.Second},
		{SlidingLog, Rate{Limit: 10, Window: 10 * time.Second}, 2, 10 * time.Second},
		{SlidingLog, Rate{Limit: 10, Window: 10 * time.Second, MinInterval: time.Minute}, 1, time.Minute},
	} {
		t.Run(tc.algo.String(), func(t *testing.T) {
			b := pureBucket{algo: tc.algo}
			now := baseTime.UnixNano()
			b.decide(now, tc.rate, tc.cost)
			got := expiresAt(tc.algo, b.s, &b.log, tc.rate)
			if want := now + int64(tc.want); got != want {
				t.Fatalf("expires at t0+%s, want t0+%s", time.Duration(got-now), tc.want)
			}
			// One nanosecond before, the state is not fresh yet; at
			// expiry it answers like a fresh bucket.
			fresh := pureBucket{algo: tc.algo}
			probe := b.clone()
			if got, want := probe.decide(got-1, tc.rate, 1), fresh.decide(got-1, tc.rate, 1); got == want {
				t.Fatalf("state already fresh 1ns before expiry: %+v", got)
			}
			probe = b.clone()
			fresh = pureBucket{algo: tc.algo}
			if got, want := probe.decide(got, tc.rate, tc.rate.Limit), fresh.decide(got, tc.rate, tc.rate.Limit); got != want {
				t.Fatalf("at expiry: %+v, fresh bucket: %+v", got, want)
			}
		})
	}
	if got := expiresAt(Concurrency, bucketState{N: 1}, nil, Rate{Limit: 1}); got != math.MaxInt64 {
		t.Fatalf("concurrency in flight expires at %d", got)
	}
	if got := expiresAt(Concurrency, bucketState{}, nil, Rate{Limit: 1}); got != math.MinInt64 {
		t.Fatalf("idle concurrency expires at %d", got)
	}
}

func TestLogRing(t *testing.T) {
	entries := func(l *logRing) []logEntry {
		var es []logEntry
		for i := range l.len() {
			es = append(es, l.at(i))
		}
		return es
	}
	same := func(l *logRing, want ...logEntry) {
		t.Helper()
		if got := entries(l); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("entries %v, want %v", got, want)
		}
	}
	var l logRing
	l.add(1, 3)
	l.add(2, 2)
	same(&l, logEntry{1, 3}, logEntry{2, 5})
	if l.unitsFrom(0) != 5 || l.unitsFrom(1) != 2 || l.unitsFrom(2) != 0 {
		t.Fatalf("unitsFrom %d %d %d", l.unitsFrom(0), l.unitsFrom(1), l.unitsFrom(2))
	}
	// The k-th oldest unit: units 1-3 are in entry 0, 4-5 in entry 1.
	for k, want := range []int{0, 0, 0, 1, 1} {
		if got := l.unitEntry(0, int64(k+1)); got != want {
			t.Fatalf("unitEntry(0, %d) = %d, want %d", k+1, got, want)
		}
	}
	if got := l.unitEntry(1, 2); got != 1 {
		t.Fatalf("unitEntry(1, 2) = %d", got)
	}
	l.trim(1)
	same(&l, logEntry{2, 5})
	if l.base != 3 || l.unitsFrom(0) != 2 {
		t.Fatalf("after trim: base %d, units %d", l.base, l.unitsFrom(0))
	}
	// Same instant: one entry. A clock going back logs at the newest
	// instant, in the newest entry.
	l.add(2, 4)
	l.add(1, 1)
	same(&l, logEntry{2, 10})
	// Wraps around the end of the buffer (4 entries).
	for i := range 5 {
		l.add(int64(3+i), 1)
	}
	if len(l.buf) != 8 {
		t.Fatalf("buffer %d after 6 entries, want 8", len(l.buf))
	}
	l.trim(4)
	for i := range 4 {
		l.add(int64(8+i), int64(i+1))
	}
	same(&l, logEntry{5, 13}, logEntry{6, 14}, logEntry{7, 15}, logEntry{8, 16}, logEntry{9, 18}, logEntry{10, 21}, logEntry{11, 25})
	if l.head == 0 {
		t.Fatal("the ring did not wrap")
	}
	if got := l.unitEntry(0, 4); got != 3 || l.unitsFrom(0) != 13 {
		t.Fatalf("unitEntry(0, 4) = %d, units %d", got, l.unitsFrom(0))
	}
	if l.firstAfter(7) != 3 || l.firstAfter(0) != 0 || l.firstAfter(11) != 7 {
		t.Fatalf("firstAfter %d %d %d", l.firstAfter(7), l.firstAfter(0), l.firstAfter(11))
	}
	// A buffer left less than a quarter full shrinks.
	var g logRing
	for i := range 1000 {
		g.add(int64(i), 1)
	}
	if len(g.buf) != 1024 || g.bytes() != 1024*logEntryBytes {
		t.Fatalf("buffer %d after 1000 entries, want 1024", len(g.buf))
	}
	g.trim(989)
	if g.len() != 10 || len(g.buf) != 32 || g.unitsFrom(0) != 10 {
		t.Fatalf("after trim to 10 entries: len %d, buffer %d, units %d", g.len(), len(g.buf), g.unitsFrom(0))
	}
	g.trim(2000)
	if g.len() != 0 || len(g.buf) != minLogBuf || g.base != 1000 {
		t.Fatalf("emptied: len %d, buffer %d, base %d", g.len(), len(g.buf), g.base)
	}
	// Cums wrap around int64: differences stay exact.
	w := logRing{base: math.MaxInt64 - 1}
	w.add(1, math.MaxInt64/2)
	w.add(2, 5)
	if w.unitsFrom(0) != math.MaxInt64/2+5 || w.unitsFrom(1) != 5 || w.unitEntry(0, math.MaxInt64/2+1) != 1 {
		t.Fatalf("wrapped cums: units %d %d, entry %d", w.unitsFrom(0), w.unitsFrom(1), w.unitEntry(0, math.MaxInt64/2+1))
	}
}

func TestCheckValidate(t *testing.T) {
	ok := Rate{Limit: 1, Window: time.Second}
	for _, c := range []Check{
		{Algorithm: numAlgorithms, Rate: ok},
		{Rate: ok, Cost: -1},
		{Rate: Rate{Window: time.Second}},
		{Rate: Rate{Limit: 1}},
		{Rate: Rate{Limit: 1, Window: MaxWindow + 1}},
		{Algorithm: TokenBucket, Rate: Rate{Limit: 1, Window: time.Second, Burst: -1}},
		{Algorithm: SlidingLog, Rate: Rate{Limit: 1, Window: time.Second, MinInterval: -1}},
	} {
		if err := c.validate(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	if err := (&Check{Algorithm: Concurrency, Rate: Rate{Limit: 1}}).validate(); err != nil {
		t.Errorf("concurrency without window: %v", err)
	}
}

func TestSatArithmetic(t *testing.T) {
	if satAdd(math.MaxInt64, 1) != math.MaxInt64 || satAdd(math.MinInt64, -1) != math.MinInt64 || satAdd(2, 3) != 5 {
		t.Fatal("satAdd")
	}
	if satMul(math.MaxInt64, 2) != math.MaxInt64 || satMul(3, 4) != 12 || satMul(0, math.MaxInt64) != 0 {
		t.Fatal("satMul")
	}
	if windowStart(-1, 10) != -10 || windowStart(19, 10) != 10 {
		t.Fatal("windowStart")
	}
	// A huge burst saturates instead of overflowing.
	r := Rate{Limit: 1, Window: MaxWindow, Burst: math.MaxInt64 / 2}
	res, s := gcra(bucketState{}, baseTime.UnixNano(), r, 5)
	if !res.Allowed || s.At <= baseTime.UnixNano() {
		t.Fatalf("huge burst: %+v %+v", res, s)
	}
}

// TestRetryAfterRandom drives random buckets with random rates, instants and
// costs and checks every denial: still denied 1ns before RetryAfter,
// admitted at RetryAfter; and every Reset: no more quota 1ns before, more
// at Reset. Float rounding in the analytic waits is caught here.
func TestRetryAfterRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 7))
	for _, algo := range []Algorithm{TokenBucket, GCRA, SlidingWindow, FixedWindow, SlidingLog} {
		t.Run(algo.String(), func(t *testing.T) {
			denials, resets := 0, 0
			for range 300 {
				r := Rate{Limit: 1 + rng.Int64N(1000), Window: time.Duration(1 + rng.Int64N(int64(48*time.Hour)))}
				if rng.IntN(3) == 0 {
					r.Limit = 1 + rng.Int64N(1_000_000_000)
				}
				if algo == SlidingLog {
					r.Limit = min(r.Limit, 300)
				}
				if algo.UsesBurst() && rng.IntN(2) == 0 {
					r.Burst = r.Limit + rng.Int64N(1000)
				}
				b := &pureBucket{algo: algo}
				now := baseTime.UnixNano() + rng.Int64N(int64(time.Hour))
				for range 20 {
					now += rng.Int64N(int64(r.Window)/max(r.Limit/4, 1) + 1)
					cost := 1 + rng.Int64N(r.Capacity())
					if rng.IntN(2) == 0 {
						cost = 1 + rng.Int64N(min(r.Capacity(), 3))
					}
					res := b.clone().decide(now, r, cost)
					if !res.Allowed {
						denials++
						ra := int64(res.RetryAfter)
						if b.clone().decide(now+ra-1, r, cost).Allowed {
							t.Fatalf("rate %+v cost %d: admitted 1ns before RetryAfter %d", r, cost, ra)
						}
						if !b.clone().decide(now+ra, r, cost).Allowed {
							t.Fatalf("rate %+v cost %d: denied at RetryAfter %d", r, cost, ra)
						}
					}
					if res.Reset > 0 {
						resets++
						// Reset is measured on the bucket as it is after
						// this decision.
						after := b.clone()
						after.decide(now, r, cost)
						rs := int64(res.Reset)
						if got := after.clone().decide(now+rs-1, r, 0); got.Remaining > res.Remaining {
							t.Fatalf("rate %+v: Remaining %d > %d 1ns before Reset %d", r, got.Remaining, res.Remaining, rs)
						}
						if got := after.clone().decide(now+rs, r, 0); got.Remaining <= res.Remaining {
							t.Fatalf("rate %+v: Remaining %d not above %d at Reset %d", r, got.Remaining, res.Remaining, rs)
						}
					}
					b.decide(now, r, cost)
				}
			}
			if denials < 100 || resets < 100 {
				t.Fatalf("only %d denials and %d resets checked", denials, resets)
			}
		})
	}
}
