package limiter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

var bgCtx = context.Background()

func tbCheck(tenant, policy string, limit int64, window time.Duration) Check {
	return Check{Algorithm: TokenBucket, Tenant: tenant, Policy: policy, Rate: Rate{Limit: limit, Window: window}, Cost: 1}
}

func fwCheck(tenant, policy string, limit int64, window time.Duration) Check {
	return Check{Algorithm: FixedWindow, Tenant: tenant, Policy: policy, Rate: Rate{Limit: limit, Window: window}, Cost: 1}
}

// entryWeight is what a bucket of c weighs against MaxMemory without a
// sliding log.
func entryWeight(c Check) int {
	return memEntryOverhead + len(AppendKey(nil, DefaultPrefix, c.Algorithm, c.Tenant, c.Policy, c.Part))
}

// logWeight is what a sliding-log bucket of c weighs with a buffer of n
// entries.
func logWeight(c Check, n int) int {
	return entryWeight(c) + logRingBytes + n*logEntryBytes
}

// weight sums the shards' weights.
func (m *MemoryStore) weight() int {
	n := 0
	for i := range m.shards {
		m.shards[i].mu.Lock()
		n += m.shards[i].weight
		m.shards[i].mu.Unlock()
	}
	return n
}

func TestMultiCheckAllOrNothing(t *testing.T) {
	m, _ := newTestStore(t, MemoryOptions{})
	a := tbCheck("t", "a", 10, 10*time.Second)
	b := fwCheck("t", "b", 1, 10*time.Second)

	ok, res := mustDecide(t, m, a, b)
	if !ok || res[0] != wantAllow(9, time.Second) || res[1] != wantAllow(0, 10*time.Second) {
		t.Fatalf("first: %v %+v", ok, res)
	}
	// b denies: a allows on its own but is not charged, and reports its
	// current state.
	ok, res = mustDecide(t, m, a, b)
	if ok || res[0] != wantAllow(9, time.Second) || res[1] != wantDeny(0, 10*time.Second, 10*time.Second) {
		t.Fatalf("second: %v %+v", ok, res)
	}
	if got := mustPeek(t, m, a)[0]; got.Remaining != 9 {
		t.Fatalf("a was charged by a denied request: %+v", got)
	}
	// Order does not matter.
	ok, _ = mustDecide(t, m, b, a)
	if ok {
		t.Fatal("admitted with b exhausted")
	}
	if got := mustPeek(t, m, a)[0]; got.Remaining != 9 {
		t.Fatalf("a was charged by a denied request: %+v", got)
	}
}

func TestShadowChecks(t *testing.T) {
	m, clk := newTestStore(t, MemoryOptions{})
	a := tbCheck("t", "a", 10, 10*time.Second)
	// 2 per 2s: one token per second.
	s := tbCheck("t", "s", 2, 2*time.Second)
	s.Shadow = true
	for i, want := range []Result{wantAllow(1, time.Second), wantAllow(0, time.Second), wantDeny(0, time.Second, time.Second)} {
		ok, res := mustDecide(t, m, a, s)
		if !ok {
			t.Fatalf("request %d: a denying shadow check blocked it", i)
		}
		if res[1] != want {
			t.Fatalf("request %d: shadow result %+v, want %+v", i, res[1], want)
		}
	}
	// The denying shadow check was not charged: its next token is still
	// 1s away (a charge would have pushed it to 2s).
	s0 := s
	s0.Cost = 0
	if got := mustPeek(t, m, s0)[0]; got != wantAllow(0, time.Second) {
		t.Fatalf("shadow bucket after its denial: %+v", got)
	}
	if got := mustPeek(t, m, a)[0]; got.Remaining != 7 {
		t.Fatalf("enforcing bucket: %+v, want Remaining 7", got)
	}

	// A shadow check that allows a request that is denied anyway is not
	// charged.
	b := fwCheck("t", "b", 1, 10*time.Second)
	mustDecide(t, m, b)
	d := tbCheck("t", "d", 5, 5*time.Second)
	d.Shadow = true
	ok, res := mustDecide(t, m, b, d)
	if ok || res[1] != wantAllow(5, 0) {
		t.Fatalf("denied request: %v, shadow result %+v", ok, res[1])
	}
	if got := mustPeek(t, m, d)[0]; got != wantAllow(5, 0) {
		t.Fatalf("shadow charged by a denied request: %+v", got)
	}
	if m.Len() != 3 {
		t.Fatalf("Len %d: a bucket was created for an uncharged check", m.Len())
	}

	// Same with a sliding log, whose charge appends to the log.
	l := Check{Algorithm: SlidingLog, Tenant: "t", Policy: "l", Rate: Rate{Limit: 1, Window: 10 * time.Second}, Cost: 1, Shadow: true}
	if ok, res := mustDecide(t, m, a, l); !ok || !res[1].Allowed {
		t.Fatalf("shadow log: %v %+v", ok, res)
	}
	clk.Advance(time.Second)
	if ok, res := mustDecide(t, m, a, l); !ok || res[1] != wantDeny(0, 9*time.Second, 9*time.Second) {
		t.Fatalf("shadow log denial: %v %+v", ok, res)
	}
	l.Cost = 0
	// Only the unit of the first request is logged: more quota in 9s.
	if got := mustPeek(t, m, l)[0]; got != wantAllow(0, 9*time.Second) {
		t.Fatalf("shadow log charged by its denial: %+v", got)
	}
}

func TestSameBucketTwice(t *testing.T) {
	m, _ := newTestStore(t, MemoryOptions{})
	x := tbCheck("t", "x", 3, 3*time.Second)
	x.Cost = 2
	ok, res := mustDecide(t, m, x, x)
	if ok || res[0] != wantAllow(3, 0) || res[1] != wantDeny(1, time.Second, time.Second) {
		t.Fatalf("2+2 of 3: %v %+v", ok, res)
	}
	if got := mustPeek(t, m, x)[0]; got.Remaining != 3 {
		t.Fatalf("charged by a denied request: %+v", got)
	}
	x.Cost = 1
	ok, res = mustDecide(t, m, x, x)
	if !ok || res[0].Remaining != 2 || res[1].Remaining != 1 {
		t.Fatalf("1+1 of 3: %v %+v", ok, res)
	}
	if got := mustPeek(t, m, x)[0]; got.Remaining != 1 {
		t.Fatalf("after 1+1: %+v", got)
	}

	l := Check{Algorithm: SlidingLog, Tenant: "t", Policy: "l", Rate: Rate{Limit: 3, Window: 10 * time.Second}, Cost: 1}
	ok, res = mustDecide(t, m, l, l)
	if !ok || res[0].Remaining != 2 || res[1].Remaining != 1 {
		t.Fatalf("log 1+1 of 3: %v %+v", ok, res)
	}
	ok, res = mustDecide(t, m, l, l)
	if ok || res[0] != wantAllow(1, 10*time.Second) || res[1] != wantDeny(0, 10*time.Second, 10*time.Second) {
		t.Fatalf("log 1+1 of 1 left: %v %+v", ok, res)
	}
	if got := mustPeek(t, m, l)[0]; got.Remaining != 1 {
		t.Fatalf("log after: %+v", got)
	}
	// min_interval applies between two checks of one request too.
	mi := l
	mi.Policy = "mi"
	mi.Rate.MinInterval = time.Second
	if ok, res := mustDecide(t, m, mi, mi); ok || res[1].RetryAfter != time.Second {
		t.Fatalf("min_interval twice: %v %+v", ok, res)
	}
	if got := mustPeek(t, m, mi)[0]; got != wantAllow(3, 0) {
		t.Fatalf("min_interval bucket charged: %+v", got)
	}
}

func TestPeek(t *testing.T) {
	m, clk := newTestStore(t, MemoryOptions{})
	x := tbCheck("t", "x", 2, 10*time.Second)
	x.Cost = 2
	mustDecide(t, m, x)
	x.Cost = 1
	if got := mustPeek(t, m, x)[0]; got != wantDeny(0, 5*time.Second, 5*time.Second) {
		t.Fatalf("peek exhausted: %+v", got)
	}
	clk.Advance(5 * time.Second)
	// Allowed, and Remaining is what is left now: nothing is charged.
	if got := mustPeek(t, m, x, x); got[0] != wantAllow(1, 5*time.Second) || got[1] != got[0] {
		t.Fatalf("peek: %+v", got)
	}
	if got := mustPeek(t, m, x)[0]; got.Remaining != 1 {
		t.Fatalf("peek charged: %+v", got)
	}
	if m.Len() != 1 {
		t.Fatalf("Len %d", m.Len())
	}
	// Peeking an unknown bucket creates nothing.
	mustPeek(t, m, tbCheck("other", "x", 1, time.Second))
	if m.Len() != 1 {
		t.Fatalf("Len %d after peeking an unknown bucket", m.Len())
	}
}

func TestDecideErrors(t *testing.T) {
	m, _ := newTestStore(t, MemoryOptions{})
	a := tbCheck("t", "a", 10, time.Second)
	if _, err := m.Decide(bgCtx, []Check{a, a}, make([]Result, 1)); err == nil {
		t.Fatal("short results accepted")
	}
	if err := m.Peek(bgCtx, []Check{a}, nil); err == nil {
		t.Fatal("Peek: short results accepted")
	}
	bad := a
	bad.Rate.Limit = 0
	if _, err := m.Decide(bgCtx, []Check{a, bad}, make([]Result, 2)); !errors.Is(err, ErrInvalidCheck) {
		t.Fatalf("invalid check: %v", err)
	}
	neg := Check{Algorithm: Concurrency, Rate: Rate{Limit: 1}, Cost: -1}
	if err := m.Release(bgCtx, []Check{neg}); err == nil {
		t.Fatal("negative release accepted")
	}
	if m.Len() != 0 {
		t.Fatalf("a failed call charged something: Len %d", m.Len())
	}
	if ok, _ := mustDecide(t, m); !ok {
		t.Fatal("no checks: not admitted")
	}
}

func TestExpiryAndSweep(t *testing.T) {
	ten := 10 * time.Second
	for _, tc := range []struct {
		name string
		algo Algorithm
		rate Rate
		cost int64
		exp  time.Duration
	}{
		{"token_bucket", TokenBucket, Rate{Limit: 10, Window: ten}, 3, 3 * time.Second},
		{"gcra", GCRA, Rate{Limit: 10, Window: ten}, 3, 3 * time.Second},
		{"sliding_window", SlidingWindow, Rate{Limit: 10, Window: ten}, 1, 2 * ten},
		{"fixed_window", FixedWindow, Rate{Limit: 10, Window: ten}, 1, ten},
		{"sliding_log", SlidingLog, Rate{Limit: 10, Window: ten}, 2, ten},
		{"sliding_log_min_interval", SlidingLog, Rate{Limit: 10, Window: ten, MinInterval: time.Minute}, 1, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, clk := newTestStore(t, MemoryOptions{})
			for i := range 50 {
				c := Check{Algorithm: tc.algo, Tenant: strconv.Itoa(i), Policy: "p", Rate: tc.rate, Cost: tc.cost}
				if ok, _ := mustDecide(t, m, c); !ok {
					t.Fatal("denied")
				}
			}
			clk.Set(baseTime.Add(tc.exp - 1))
			if n := m.sweep(); n != 0 || m.Len() != 50 {
				t.Fatalf("1ns before expiry: swept %d, Len %d", n, m.Len())
			}
			clk.Set(baseTime.Add(tc.exp))
			if n := m.sweep(); n != 50 || m.Len() != 0 || m.weight() != 0 {
				t.Fatalf("at expiry: swept %d, Len %d, weight %d", n, m.Len(), m.weight())
			}
		})
	}
	t.Run("concurrency", func(t *testing.T) {
		m, clk := newTestStore(t, MemoryOptions{})
		var checks []Check
		for i := range 50 {
			c := Check{Algorithm: Concurrency, Tenant: strconv.Itoa(i), Policy: "p", Rate: Rate{Limit: 2}, Cost: 1}
			checks = append(checks, c)
			mustDecide(t, m, c)
		}
		clk.Advance(1000 * time.Hour)
		if m.sweep(); m.Len() != 50 {
			t.Fatalf("in-flight buckets swept: Len %d", m.Len())
		}
		if err := m.Release(bgCtx, checks); err != nil {
			t.Fatal(err)
		}
		if m.sweep(); m.Len() != 0 {
			t.Fatalf("released buckets kept: Len %d", m.Len())
		}
	})
}

// TestExpiredLookup: an expired bucket is fresh even before the sweeper
// deletes it, and its log memory is given back.
func TestExpiredLookup(t *testing.T) {
	m, clk := newTestStore(t, MemoryOptions{})
	c := Check{Algorithm: SlidingLog, Tenant: "t", Policy: "p", Rate: Rate{Limit: 1000, Window: 10 * time.Second}, Cost: 10}
	for i := range 100 {
		clk.Set(baseTime.Add(time.Duration(i) * time.Millisecond))
		mustDecide(t, m, c)
	}
	if w := m.weight(); w != logWeight(c, 128) {
		t.Fatalf("weight %d, want %d", w, logWeight(c, 128))
	}
	clk.Set(baseTime.Add(10*time.Second + 99*time.Millisecond))
	c.Cost = 1
	if ok, res := mustDecide(t, m, c); !ok || res[0].Remaining != 999 {
		t.Fatalf("expired log not fresh: %v %+v", ok, res)
	}
	if w := m.weight(); w != logWeight(c, minLogBuf) || m.Len() != 1 {
		t.Fatalf("weight %d, Len %d after the log restarted", w, m.Len())
	}
}

func TestSweeperGoroutine(t *testing.T) {
	before := runtime.NumGoroutine()
	clk := newManualClock(baseTime)
	m := NewMemoryStore(MemoryOptions{Clock: clk, SweepInterval: 5 * time.Millisecond})
	for i := range 100 {
		mustDecide(t, m, tbCheck(strconv.Itoa(i), "p", 10, 10*time.Second))
	}
	if m.Len() != 100 {
		t.Fatalf("Len %d", m.Len())
	}
	clk.Advance(time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for m.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("sweeper did not delete expired buckets: Len %d", m.Len())
		}
		time.Sleep(time.Millisecond)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("goroutines: %d before, %d after Close", before, runtime.NumGoroutine())
		}
		time.Sleep(time.Millisecond)
	}
	// Still answers after Close.
	if ok, _ := mustDecide(t, m, tbCheck("x", "p", 1, time.Second)); !ok {
		t.Fatal("closed store denied")
	}
}

func TestMaxMemoryFlood(t *testing.T) {
	const maxMemory = 64 << 10
	for _, algo := range []Algorithm{TokenBucket, GCRA, SlidingWindow, FixedWindow, SlidingLog} {
		t.Run(algo.String(), func(t *testing.T) {
			m, _ := newTestStore(t, MemoryOptions{MaxMemory: maxMemory})
			active := Check{Algorithm: TokenBucket, Tenant: "active", Policy: "p", Rate: Rate{Limit: 1_000_000, Window: time.Hour}, Cost: 1}
			rng := rand.New(rand.NewPCG(1, 2))
			hits := int64(0)
			biggest := 0
			for i := range 4000 {
				c := Check{Algorithm: algo, Tenant: strconv.FormatUint(rng.Uint64(), 36), Policy: "p", Rate: Rate{Limit: 1000, Window: time.Hour}, Cost: 1}
				if ok, _ := mustDecide(t, m, c); !ok {
					t.Fatal("flood request denied")
				}
				w := entryWeight(c)
				if algo == SlidingLog {
					w = logWeight(c, minLogBuf)
				}
				biggest = max(biggest, w)
				if i%4 == 0 {
					mustDecide(t, m, active)
					hits++
				}
				if i%64 == 0 && m.weight() > maxMemory {
					t.Fatalf("weight %d > MaxMemory %d", m.weight(), maxMemory)
				}
			}
			if m.weight() > maxMemory {
				t.Fatalf("weight %d > MaxMemory %d", m.weight(), maxMemory)
			}
			if m.weight() < maxMemory*3/4 || m.Len() < maxMemory*3/4/biggest {
				t.Fatalf("weight %d, Len %d: evicted far more than needed", m.weight(), m.Len())
			}
			// The active bucket was never evicted: it counted every hit.
			if got := mustPeek(t, m, active)[0]; got.Remaining != 1_000_000-hits {
				t.Fatalf("active bucket Remaining %d, want %d", got.Remaining, 1_000_000-hits)
			}
		})
	}
}

func TestEvictExpiredFirst(t *testing.T) {
	// Tenant names of one length: every bucket weighs the same, 16 fit.
	tb := func(name string, limit int64, window time.Duration) Check { return tbCheck(name, "p", limit, window) }
	w := entryWeight(tb("old00", 1, time.Hour))
	m, clk := newTestStore(t, MemoryOptions{MaxMemory: int64(16 * w)})
	if len(m.shards) != 1 {
		t.Fatalf("%d shards for a MaxMemory of %d", len(m.shards), 16*w)
	}
	old := func(i int) Check { return tb(fmt.Sprintf("old%02d", i), 1, time.Hour) }
	for i := range 8 {
		mustDecide(t, m, old(i))
	}
	for i := range 8 {
		mustDecide(t, m, tb(fmt.Sprintf("sht%02d", i), 10, time.Second)) // expire after 100ms
	}
	clk.Advance(time.Second)
	mustDecide(t, m, tb("new00", 1, time.Hour))
	// The expired buckets went, although more recently used than old0.
	if m.Len() != 9 || m.weight() != 9*w {
		t.Fatalf("Len %d, weight %d; want 9, %d", m.Len(), m.weight(), 9*w)
	}
	if got := mustPeek(t, m, old(0))[0]; got.Remaining != 0 {
		t.Fatalf("old0 evicted before expired buckets: %+v", got)
	}
	// Then least recently used first: old0.
	for i := range 8 {
		mustDecide(t, m, tb(fmt.Sprintf("mor%02d", i), 1, time.Hour))
	}
	if m.Len() != 16 || m.weight() != 16*w {
		t.Fatalf("Len %d, weight %d; want 16, %d", m.Len(), m.weight(), 16*w)
	}
	if got := mustPeek(t, m, old(0))[0]; got.Remaining != 1 {
		t.Fatalf("old0 (least recently used) kept: %+v", got)
	}
	if got := mustPeek(t, m, old(1))[0]; got.Remaining != 0 {
		t.Fatalf("old1 evicted: %+v", got)
	}
}

func TestConcurrencyNeverEvicted(t *testing.T) {
	k := Check{Algorithm: Concurrency, Tenant: "k", Policy: "c", Rate: Rate{Limit: 1}, Cost: 1}
	budget := 16 * entryWeight(tbCheck("000", "p", 10, time.Hour))
	m, _ := newTestStore(t, MemoryOptions{MaxMemory: int64(budget)})
	if ok, _ := mustDecide(t, m, k); !ok {
		t.Fatal("denied")
	}
	for i := range 100 {
		mustDecide(t, m, tbCheck(fmt.Sprintf("%03d", i), "p", 10, time.Hour))
	}
	if m.Len() > 16 || m.weight() > budget {
		t.Fatalf("Len %d, weight %d", m.Len(), m.weight())
	}
	if ok, _ := mustDecide(t, m, k); ok {
		t.Fatal("in-flight bucket was evicted: second request admitted")
	}
	if err := m.Release(bgCtx, []Check{k}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := mustDecide(t, m, k); !ok {
		t.Fatal("released slot not available")
	}

	// In-flight buckets beyond the budget are all kept (documented).
	var cs []Check
	for i := range 20 {
		c := k
		c.Tenant = "inflight" + strconv.Itoa(i)
		cs = append(cs, c)
		mustDecide(t, m, c)
	}
	for _, c := range cs {
		if ok, _ := mustDecide(t, m, c); ok {
			t.Fatalf("%s: in-flight bucket evicted", c.Tenant)
		}
	}
	if m.Len() != 21 {
		t.Fatalf("Len %d, want 21 in-flight buckets", m.Len())
	}
}

func TestSlidingLogWeight(t *testing.T) {
	small := func(i int) Check { return tbCheck(fmt.Sprintf("%02d", i), "p", 10, time.Hour) }
	w := entryWeight(small(0))
	m, clk := newTestStore(t, MemoryOptions{MaxMemory: int64(16 * w)})
	for i := range 16 {
		mustDecide(t, m, small(i))
	}
	heavy := Check{Algorithm: SlidingLog, Tenant: "heavy", Policy: "l", Rate: Rate{Limit: 1000, Window: time.Hour}, Cost: 160}
	mustDecide(t, m, heavy)
	// One admission is one entry, whatever its cost: the smallest buffer
	// (2 entries, 32 bytes). The two least recently used buckets made
	// room for it.
	if m.Len() != 15 || m.weight() != 14*w+logWeight(heavy, minLogBuf) {
		t.Fatalf("Len %d, weight %d; want 15, %d", m.Len(), m.weight(), 14*w+logWeight(heavy, minLogBuf))
	}
	// 40 admissions at distinct instants: a buffer of 64 entries (1 KiB).
	heavy.Cost = 1
	for range 39 {
		clk.Advance(time.Millisecond)
		mustDecide(t, m, heavy)
	}
	left := (16*w - logWeight(heavy, 64)) / w
	if m.Len() != 1+left || m.weight() != left*w+logWeight(heavy, 64) {
		t.Fatalf("Len %d, weight %d; want %d, %d", m.Len(), m.weight(), 1+left, left*w+logWeight(heavy, 64))
	}
	// A log larger than the whole budget (256 entries, 4 KiB) is kept on
	// its own.
	for range 200 {
		clk.Advance(time.Millisecond)
		mustDecide(t, m, heavy)
	}
	if m.Len() != 1 || m.weight() != logWeight(heavy, 256) {
		t.Fatalf("Len %d, weight %d; want 1, %d", m.Len(), m.weight(), logWeight(heavy, 256))
	}
	if got := mustPeek(t, m, heavy)[0]; got.Remaining != 1000-160-239 {
		t.Fatalf("heavy log: %+v", got)
	}
	// Once most of its entries left the window, the buffer shrinks and
	// so does its weight: 20 entries in 64.
	clk.Advance(time.Hour - 20*time.Millisecond)
	if got := mustPeek(t, m, heavy)[0]; got.Remaining != 1000-20 {
		t.Fatalf("heavy log after most of it expired: %+v", got)
	}
	if m.weight() != logWeight(heavy, 64) {
		t.Fatalf("weight %d after the log shrank to 20 entries, want %d", m.weight(), logWeight(heavy, 64))
	}
}

func TestReset(t *testing.T) {
	m, _ := newTestStore(t, MemoryOptions{})
	long := strings.Repeat("a", 200)
	tenants := []string{"a", "a:b", "a%3Ab", "a}", "{a}", "b", long, ""}
	policies := []string{"p", "p1"}
	parts := []string{"", "x:y"}
	check := func(tenant, policy, part string) Check {
		c := fwCheck(tenant, policy, 10, time.Hour)
		c.Part = part
		return c
	}
	for _, tn := range tenants {
		for _, p := range policies {
			for _, part := range parts {
				mustDecide(t, m, check(tn, p, part))
				mustDecide(t, m, Check{Algorithm: SlidingWindow, Tenant: tn, Policy: p, Part: part, Rate: Rate{Limit: 10, Window: time.Hour}, Cost: 1})
			}
		}
	}
	total := len(tenants) * len(policies) * len(parts) * 2
	if m.Len() != total {
		t.Fatalf("Len %d, want %d", m.Len(), total)
	}
	reset := map[[2]string]bool{}
	verify := func(stage string) {
		t.Helper()
		n := 0
		for _, tn := range tenants {
			for _, p := range policies {
				for _, part := range parts {
					want := int64(9)
					if reset[[2]string{tn, p}] {
						want = 10
					} else {
						n += 2
					}
					if got := mustPeek(t, m, check(tn, p, part))[0].Remaining; got != want {
						t.Fatalf("%s: tenant %q policy %q part %q: Remaining %d, want %d", stage, tn, p, part, got, want)
					}
				}
			}
		}
		if m.Len() != n {
			t.Fatalf("%s: Len %d, want %d", stage, m.Len(), n)
		}
	}
	for _, st := range []struct{ tenant, policy string }{
		{"a", ""},
		{"a:b", "p"}, // not p1
		{long, "p1"},
		{"{a}", ""},
		{"", "p"},
		{"nobody", ""},
		{"a%3Ab", "p1"},
	} {
		ps := policies
		if st.policy != "" {
			ps = []string{st.policy}
		}
		if err := m.Reset(bgCtx, st.tenant, ps); err != nil {
			t.Fatal(err)
		}
		for _, p := range policies {
			if st.policy == "" || st.policy == p {
				reset[[2]string{st.tenant, p}] = true
			}
		}
		verify("after Reset(" + st.tenant + ", " + st.policy + ")")
	}
}

func TestKeyMatches(t *testing.T) {
	for _, tc := range []struct {
		key, tag, policy string
		want             bool
	}{
		{"rl:token_bucket:{a}:p", "a", "", true},
		{"rl:token_bucket:{a}:p", "a", "p", true},
		{"rl:token_bucket:{a}:p:x%3Ay", "a", "p", true},
		{"rl:token_bucket:{a}:p1", "a", "p", false},
		{"rl:token_bucket:{a%3Ab}:p", "a", "", false},
		{"rl:token_bucket:{ab}:p", "a", "", false},
		{"rl:token_bucket:{b}:p", "", "", false},
		{"rl:token_bucket:{}:p", "", "", true},
		{"rlx:token_bucket:{a}:p", "a", "", false},
		{"other:token_bucket:{a}:p", "a", "", false},
		{"rl:broken", "a", "", false},
	} {
		if got := memKeyMatches(tc.key, "rl", tc.tag, tc.policy); got != tc.want {
			t.Errorf("keyMatches(%q, %q, %q) = %v", tc.key, tc.tag, tc.policy, got)
		}
	}
}

// TestConcurrentHammer: 8 goroutines x 500 requests on one bucket of 1000
// admit exactly 1000, for every algorithm. Run with -race.
func TestConcurrentHammer(t *testing.T) {
	for _, algo := range []Algorithm{TokenBucket, GCRA, SlidingWindow, FixedWindow, SlidingLog, Concurrency} {
		t.Run(algo.String(), func(t *testing.T) {
			m, _ := newTestStore(t, MemoryOptions{})
			c := Check{Algorithm: algo, Tenant: "t", Policy: "p", Rate: Rate{Limit: 1000, Window: time.Hour}, Cost: 1}
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					res := make([]Result, 1)
					for range 500 {
						ok, err := m.Decide(bgCtx, []Check{c}, res)
						if err != nil {
							t.Error(err)
							return
						}
						if ok {
							admitted.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if n := admitted.Load(); n != 1000 {
				t.Fatalf("admitted %d, want 1000", n)
			}
		})
	}
}

// TestMultiShardNoDeadlock: concurrent multi-check decisions over the same
// buckets in every order finish (shards are locked in ascending order) and
// stay all-or-nothing.
func TestMultiShardNoDeadlock(t *testing.T) {
	m, _ := newTestStore(t, MemoryOptions{})
	var checks []Check
	for i := range 6 {
		checks = append(checks, tbCheck("tenant"+strconv.Itoa(i), "p", 1_000_000, time.Hour))
	}
	// One tight bucket shared by every request: at most 100 requests pass
	// it, so every other bucket must be charged exactly as often.
	tight := fwCheck("tight", "p", 100, time.Hour)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			res := make([]Result, 4)
			for range 300 {
				cs := []Check{tight}
				for _, j := range rng.Perm(len(checks))[:3] {
					cs = append(cs, checks[j])
				}
				rng.Shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
				ok, err := m.Decide(bgCtx, cs, res)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if admitted.Load() != 100 {
		t.Fatalf("admitted %d, want 100", admitted.Load())
	}
	var charged int64
	for _, c := range checks {
		charged += 1_000_000 - mustPeek(t, m, c)[0].Remaining
	}
	if charged != 300 {
		t.Fatalf("other buckets charged %d units, want 3 x 100", charged)
	}
}

func TestSmallMaxMemory(t *testing.T) {
	for _, budget := range []int64{1, 100, 1000, 17 << 10, 100 << 10, 1 << 20} {
		m, _ := newTestStore(t, MemoryOptions{MaxMemory: budget})
		w := entryWeight(tbCheck("00000", "p", 10, time.Hour))
		for i := range 5 * (int(budget)/w + 1) {
			mustDecide(t, m, tbCheck(fmt.Sprintf("%05d", i), "p", 10, time.Hour))
		}
		// A bucket larger than the whole budget is kept while in use.
		if got := m.weight(); int64(got) > max(budget, int64(w)) {
			t.Fatalf("MaxMemory %d: weight %d, Len %d", budget, got, m.Len())
		}
		total := 0
		for i := range m.shards {
			total += m.shards[i].budget
			if m.shards[i].budget < 1 {
				t.Fatalf("MaxMemory %d: shard %d has no room", budget, i)
			}
			if len(m.shards) > 1 && m.shards[i].budget < minShardBudget {
				t.Fatalf("MaxMemory %d: shard %d has %d bytes", budget, i, m.shards[i].budget)
			}
		}
		if int64(total) != budget {
			t.Fatalf("MaxMemory %d: budgets sum to %d", budget, total)
		}
	}
}

func TestDefaults(t *testing.T) {
	m := NewMemoryStore(MemoryOptions{})
	defer m.Close()
	if m.prefix != DefaultPrefix || len(m.shards) != maxShards || m.stop == nil {
		t.Fatalf("prefix %q, %d shards, sweeper %v", m.prefix, len(m.shards), m.stop != nil)
	}
	if _, ok := m.clock.(SystemClock); !ok {
		t.Fatalf("clock %T", m.clock)
	}
	budget := 0
	for i := range m.shards {
		budget += m.shards[i].budget
	}
	if budget != DefaultMaxMemory {
		t.Fatalf("budget %d", budget)
	}
	if ok, _ := mustDecide(t, m, tbCheck("t", "p", 1, time.Second)); !ok {
		t.Fatal("denied")
	}
	// The key layout of AppendKey with the prefix.
	var keys []string
	for i := range m.shards {
		for k := range m.shards[i].m {
			keys = append(keys, k)
		}
	}
	if len(keys) != 1 || keys[0] != "rl:token_bucket:{t}:p" {
		t.Fatalf("keys %q", keys)
	}
	p := NewMemoryStore(MemoryOptions{Prefix: "edge", SweepInterval: -1})
	defer p.Close()
	mustDecide(t, p, tbCheck("t", "p", 1, time.Second))
	for i := range p.shards {
		for k := range p.shards[i].m {
			if k != "edge:token_bucket:{t}:p" {
				t.Fatalf("key %q", k)
			}
		}
	}
	if p.stop != nil {
		t.Fatal("negative SweepInterval started a sweeper")
	}
}

func TestDecideZeroAllocs(t *testing.T) {
	if raceDetector {
		t.Skip("sync.Pool drops items under the race detector")
	}
	m, _ := newTestStore(t, MemoryOptions{})
	for _, algo := range []Algorithm{TokenBucket, GCRA, SlidingWindow, FixedWindow, Concurrency} {
		c := []Check{{Algorithm: algo, Tenant: "tenant-42", Policy: "api", Part: "GET /v1/items", Rate: Rate{Limit: 1 << 40, Window: time.Hour}, Cost: 1}}
		res := make([]Result, 1)
		m.Decide(bgCtx, c, res)
		if n := testing.AllocsPerRun(1000, func() { m.Decide(bgCtx, c, res) }); n != 0 {
			t.Errorf("%s: %v allocs per Decide on an existing bucket", algo, n)
		}
	}
	multi := []Check{tbCheck("t", "a", 1<<40, time.Hour), fwCheck("t", "b", 1<<40, time.Hour), tbCheck("t", "c", 1<<40, time.Hour)}
	res := make([]Result, 3)
	m.Decide(bgCtx, multi, res)
	if n := testing.AllocsPerRun(1000, func() { m.Decide(bgCtx, multi, res) }); n != 0 {
		t.Errorf("3 checks: %v allocs per Decide", n)
	}
}

// TestSweepLargeShards: the sweeper releases a shard's lock every
// sweepChunk buckets and still deletes exactly the expired ones.
func TestSweepLargeShards(t *testing.T) {
	m, clk := newTestStore(t, MemoryOptions{})
	const n = 64 * sweepChunk * 2
	for i := range n {
		c := tbCheck(strconv.Itoa(i), "p", 10, time.Hour)
		if i%2 == 0 {
			c.Rate.Window = time.Second
		}
		mustDecide(t, m, c)
	}
	clk.Advance(time.Second)
	stop := make(chan struct{})
	done := make(chan struct{})
	var other atomic.Int64
	go func() { // requests on other buckets keep coming while it sweeps
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
				mustDecide(t, m, tbCheck(strconv.Itoa(i), "q", 10, time.Hour))
				other.Store(int64(i + 1))
			}
		}
	}()
	swept := m.sweep()
	close(stop)
	<-done
	if swept != n/2 {
		t.Fatalf("swept %d of %d expired buckets", swept, n/2)
	}
	if got, want := m.Len(), n/2+int(other.Load()); got != want {
		t.Fatalf("Len %d, want %d", got, want)
	}
}

// hostileTenant returns a random value of n bytes made of what a key must
// escape (braces, colons, '%', control bytes) and a few letters.
func hostileTenant(rng *rand.Rand, buf []byte) string {
	const alphabet = "{}:%\n\r\x00\x01\x1b\x7f{{::ab"
	for i := range buf {
		buf[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return string(buf)
}

// TestMaxMemoryHostileFlood: a flood of random hostile tenants and parts
// (129 bytes, digested; 128 bytes that escape to about 350, kept; and 40
// bytes that escape to about 110, kept) on token buckets, sliding windows
// and sliding logs
// keeps the store's live heap within 1.5 x MaxMemory after a garbage
// collection. (When keys were digested before escaping and the bound
// counted buckets, such a flood held about 3 times the heap the bound
// promised.)
func TestMaxMemoryHostileFlood(t *testing.T) {
	const budget = 8 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	m, _ := newTestStore(t, MemoryOptions{MaxMemory: budget})
	rng := rand.New(rand.NewPCG(3, 4))
	digested, long, short := make([]byte, MaxValueLen+1), make([]byte, MaxValueLen), make([]byte, 40)
	algos := []Algorithm{TokenBucket, SlidingWindow, SlidingLog}
	checks := make([]Check, 1)
	res := make([]Result, 1)
	const n = 150_000
	for i := range n {
		c := Check{Algorithm: algos[i%3], Policy: "api", Rate: Rate{Limit: 100, Window: time.Hour}, Cost: 1}
		switch i % 4 {
		case 0:
			c.Tenant = hostileTenant(rng, digested)
		case 1:
			c.Tenant = hostileTenant(rng, long)
		default:
			c.Tenant = hostileTenant(rng, short)
			c.Part = hostileTenant(rng, short)
		}
		checks[0] = c
		if ok, err := m.Decide(bgCtx, checks, res); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	live := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d hostile tenants: %d buckets kept, weight %d, live heap %.1f MiB for a budget of %d MiB (%.2fx)",
		n, m.Len(), m.weight(), float64(live)/(1<<20), budget>>20, float64(live)/budget)
	if m.weight() > budget {
		t.Fatalf("weight %d over the budget %d", m.weight(), budget)
	}
	if m.Len() >= n {
		t.Fatalf("nothing evicted: %d buckets", m.Len())
	}
	if live > budget*3/2 {
		t.Fatalf("live heap %d bytes, more than 1.5 x MaxMemory (%d)", live, budget)
	}
	runtime.KeepAlive(m)
}

// TestWeightConstants: the sizes the weight estimate assumes are the
// structs' sizes (on 64-bit platforms), so a field added to either is not
// left out of the budget.
func TestWeightConstants(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("sizes are for 64-bit platforms")
	}
	// memEntryOverhead leaves 48 bytes for the map slot and the key's
	// size-class rounding besides the entry itself.
	if got := unsafe.Sizeof(memEntry{}); got+48 != memEntryOverhead {
		t.Errorf("memEntry is %d bytes: update memEntryOverhead (%d)", got, memEntryOverhead)
	}
	if got := unsafe.Sizeof(logRing{}); got != logRingBytes {
		t.Errorf("logRing is %d bytes, logRingBytes %d", got, logRingBytes)
	}
	if got := unsafe.Sizeof(logEntry{}); got != logEntryBytes {
		t.Errorf("logEntry is %d bytes, logEntryBytes %d", got, logEntryBytes)
	}
}
