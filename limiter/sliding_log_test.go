package limiter

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// Tests of the sliding log's representation: one entry per admission with
// running counts, in memory (logRing) and in Redis (a list [base, ts1,
// cum1, ...]), checked against a model that logs one timestamp per unit.

// requireGroupedLog fails the test at once unless s logs a request as one
// entry whatever its cost, so that the tests with costs up to 2^53 cannot
// make an implementation that logs one timestamp per unit allocate
// terabytes: they fail instead.
func requireGroupedLog(t testing.TB, s Store) {
	t.Helper()
	c := Check{Algorithm: SlidingLog, Tenant: "grouped-probe", Policy: "p", Rate: Rate{Limit: 1 << 20, Window: time.Hour}, Cost: 4096}
	if ok, _ := mustDecide(t, s, c); !ok {
		t.Fatal("probe denied")
	}
	switch s := s.(type) {
	case *MemoryStore:
		key := AppendKey(nil, s.prefix, SlidingLog, c.Tenant, c.Policy, "")
		for i := range s.shards {
			sh := &s.shards[i]
			sh.mu.Lock()
			e := sh.m[string(key)]
			n := 0
			if e != nil {
				n = e.log.len()
			}
			sh.mu.Unlock()
			if e != nil && n != 1 {
				t.Fatalf("a request of cost 4096 is %d log entries in memory, want 1", n)
			}
		}
	case *RedisStore:
		key := string(AppendKey(nil, s.prefix, SlidingLog, c.Tenant, c.Policy, ""))
		if typ := s.client.Type(bgCtx, key).Val(); typ != "list" {
			t.Fatalf("the sliding log is a Redis %s, want a list", typ)
		}
		if n := s.client.LLen(bgCtx, key).Val(); n != 3 {
			t.Fatalf("a request of cost 4096 is a list of %d elements, want 3 (base, ts, cum)", n)
		}
	}
	if err := s.Reset(bgCtx, c.Tenant, []string{c.Policy}); err != nil {
		t.Fatal(err)
	}
}

// naiveLog is the sliding log as documented in slidinglog.go, one
// timestamp per unit and nothing ever dropped: the oracle of the random
// tests (small costs only).
type naiveLog struct {
	units []int64 // instants of the logged units, non-decreasing
	last  int64   // instant of the last admission (0: never)
}

// eval answers a request of cost at now and logs its units when it allows.
func (l *naiveLog) eval(now int64, r Rate, cost int64) Result {
	w := int64(r.Window)
	first := sort.Search(len(l.units), func(i int) bool { return l.units[i] > now-w })
	view := func() Result {
		count := int64(len(l.units) - first)
		res := Result{Allowed: true, Remaining: max(r.Limit-count, 0)}
		if count > 0 {
			k := int64(1)
			if count > r.Limit {
				k = count - r.Limit + 1
			}
			res.Reset = nsDuration(l.units[first+int(k)-1] + w - now)
		}
		return res
	}
	peek := view()
	count := int64(len(l.units) - first)
	switch {
	case cost == 0:
		return peek
	case cost > r.Limit:
		return Result{Remaining: peek.Remaining, RetryAfter: r.Window, Reset: peek.Reset}
	}
	var wait int64
	if count+cost > r.Limit {
		wait = l.units[first+int(count+cost-r.Limit)-1] + w - now
	}
	if r.MinInterval > 0 && l.last != 0 && now-l.last < int64(r.MinInterval) {
		wait = max(wait, l.last+int64(r.MinInterval)-now)
	}
	if wait > 0 {
		peek.Allowed = false
		peek.RetryAfter = nsDuration(wait)
		return peek
	}
	t := max(now, l.last)
	for range cost {
		l.units = append(l.units, t)
	}
	l.last = t
	return view()
}

func (l *naiveLog) clone() *naiveLog {
	return &naiveLog{units: slices.Clone(l.units), last: l.last}
}

// naiveStore decides like a Store (all or nothing, chained checks,
// shadows) on naive logs.
type naiveStore map[string]*naiveLog

func (m naiveStore) log(c Check) *naiveLog {
	k := c.Tenant + "/" + c.Policy
	if m[k] == nil {
		m[k] = &naiveLog{}
	}
	return m[k]
}

func (m naiveStore) decide(now int64, checks []Check) (bool, []Result) {
	orig := map[*naiveLog]*naiveLog{}
	res := make([]Result, len(checks))
	admitted := true
	for i, c := range checks {
		l := m.log(c)
		if orig[l] == nil {
			orig[l] = l.clone()
		}
		before := l.clone()
		res[i] = l.eval(now, c.Rate, c.Cost)
		if !res[i].Allowed {
			*l = *before
			if !c.Shadow {
				admitted = false
			}
		}
	}
	if !admitted {
		for l, o := range orig {
			*l = *o
		}
		for i, c := range checks {
			if res[i].Allowed && c.Cost > 0 {
				res[i] = m.log(c).eval(now, c.Rate, 0)
			}
		}
	}
	return admitted, res
}

func (m naiveStore) peek(now int64, checks []Check) []Result {
	res := make([]Result, len(checks))
	for i, c := range checks {
		l := m.log(c).clone()
		res[i] = l.eval(now, c.Rate, c.Cost)
		if res[i].Allowed && c.Cost > 0 {
			res[i] = m.log(c).clone().eval(now, c.Rate, 0)
		}
	}
	return res
}

// TestSlidingLogRandom plays random traffic on a few sliding logs (long
// and short logs, min_interval, lowered limits, chained and shadow checks
// of one bucket, peeks, several admissions per instant) against the naive
// model, the memory store and the Redis store, and compares every answer
// exactly (Redis in whole µs: every instant is a whole µs). Time only
// moves forward: going back after a store dropped expired entries is
// covered by the conformance scenarios.
func TestSlidingLogRandom(t *testing.T) {
	targets := conformanceTargets(t)
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			stores := make([]Store, len(targets))
			clocks := make([]*manualClock, len(targets))
			for i, tg := range targets {
				stores[i], clocks[i] = tg.new(t)
			}
			buckets := []Check{
				// Hundreds of entries: 1ms steps in a 2s window.
				{Policy: "long", Rate: Rate{Limit: 2000, Window: 2 * time.Second}},
				{Policy: "short", Rate: Rate{Limit: 5, Window: 300 * time.Millisecond}},
				{Policy: "mi", Rate: Rate{Limit: 30, Window: time.Second, MinInterval: 7 * time.Millisecond}},
				{Policy: "mid", Rate: Rate{Limit: 40, Window: 500 * time.Millisecond}},
			}
			model := naiveStore{}
			at := time.Duration(0)
			for step := 0; step < 3000; step++ {
				switch x := rng.IntN(100); {
				case x < 60:
					at += time.Duration(rng.IntN(3000)) * time.Microsecond
				case x < 62:
					at += time.Duration(rng.IntN(3000)) * time.Millisecond
				}
				now := baseTime.Add(at)
				for _, c := range clocks {
					c.Set(now)
				}
				n := 1 + rng.IntN(3)
				checks := make([]Check, n)
				for i := range checks {
					b := buckets[rng.IntN(len(buckets))]
					if i > 0 && rng.IntN(2) == 0 {
						b = checks[0] // the same bucket again: chained
					}
					b.Algorithm = SlidingLog
					b.Tenant = "t"
					b.Cost = int64(rng.IntN(4))
					if rng.IntN(20) == 0 {
						b.Cost = b.Rate.Limit + int64(rng.IntN(2))
					}
					if rng.IntN(10) == 0 {
						// A lowered (or raised) limit, for this request.
						b.Rate.Limit = max(1, b.Rate.Limit/2+int64(rng.IntN(3))-1)
					}
					b.Shadow = rng.IntN(6) == 0
					checks[i] = b
				}
				peek := rng.IntN(5) == 0
				var want []Result
				var wantOK bool
				if peek {
					want = model.peek(now.UnixNano(), checks)
				} else {
					wantOK, want = model.decide(now.UnixNano(), checks)
				}
				for i, s := range stores {
					res := make([]Result, n)
					var ok bool
					var err error
					if peek {
						err = s.Peek(bgCtx, checks, res)
					} else {
						ok, err = s.Decide(bgCtx, checks, res)
					}
					if err != nil {
						t.Fatal(err)
					}
					if !peek && ok != wantOK {
						t.Fatalf("step %d (at %s) %s: admitted %v, want %v\nchecks %+v\ngot  %+v\nwant %+v", step, at, targets[i].name, ok, wantOK, checks, res, want)
					}
					for j := range checks {
						if !sameResult(false, res[j], want[j]) {
							t.Fatalf("step %d (at %s) %s peek=%v check %d of %+v:\ngot  %+v\nwant %+v", step, at, targets[i].name, peek, j, checks, res[j], want[j])
						}
					}
				}
			}
		})
	}
}

// TestSlidingLogHugeRandom plays random traffic with limits and costs up
// to 2^53 on the memory and the Redis store in lockstep: the Redis log's
// running count wraps around 2^53 again and again and both stores must
// still agree on every answer.
func TestSlidingLogHugeRandom(t *testing.T) {
	targets := conformanceTargets(t)
	for _, tg := range targets {
		s, _ := tg.new(t)
		requireGroupedLog(t, s)
	}
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 53))
			stores := make([]Store, len(targets))
			clocks := make([]*manualClock, len(targets))
			for i, tg := range targets {
				stores[i], clocks[i] = tg.new(t)
			}
			limits := []int64{MaxCount, MaxCount - 1, 1 << 52, 3 << 50, 1 << 40, 1000}
			at := time.Duration(0)
			for step := 0; step < 1500; step++ {
				if rng.IntN(3) == 0 {
					at += time.Duration(rng.IntN(400)) * time.Millisecond
				}
				for _, c := range clocks {
					c.Set(baseTime.Add(at))
				}
				limit := limits[rng.IntN(len(limits))]
				var cost int64
				switch rng.IntN(6) {
				case 0:
					cost = 0
				case 1:
					cost = 1 + rng.Int64N(10)
				case 2:
					cost = limit / int64(1+rng.IntN(4))
				case 3:
					cost = 1 + rng.Int64N(limit)
				case 4:
					cost = 1 + rng.Int64N(MaxCount)
				default:
					cost = max(1, limit-rng.Int64N(3))
				}
				c := Check{Algorithm: SlidingLog, Tenant: "t", Policy: "huge", Rate: Rate{Limit: limit, Window: 2 * time.Second}, Cost: cost}
				checks := []Check{c}
				if rng.IntN(4) == 0 {
					c2 := c
					c2.Cost = rng.Int64N(1 << 52)
					checks = append(checks, c2)
				}
				results := make([][]Result, len(stores))
				admitted := make([]bool, len(stores))
				peek := rng.IntN(5) == 0
				for i, s := range stores {
					results[i] = make([]Result, len(checks))
					var err error
					if peek {
						err = s.Peek(bgCtx, checks, results[i])
					} else {
						admitted[i], err = s.Decide(bgCtx, checks, results[i])
					}
					if err != nil {
						t.Fatal(err)
					}
				}
				for k := 1; k < len(stores); k++ {
					if admitted[0] != admitted[k] {
						t.Fatalf("step %d: admitted memory %v, %s %v (%+v)", step, admitted[0], targets[k].name, admitted[k], checks)
					}
					for j := range checks {
						if !sameResult(true, results[k][j], results[0][j]) {
							t.Fatalf("step %d (at %s) check %d of %+v:\nmemory %+v\n%s %+v", step, at, j, checks, results[0][j], targets[k].name, results[k][j])
						}
					}
				}
			}
		})
	}
}

// TestSlidingLogHugeCost: a request of cost 2^40 on a limit of 2^53 is
// one entry in memory and in Redis, decided at once with O(1) memory (a
// log of one timestamp per unit would need 8 TiB).
func TestSlidingLogHugeCost(t *testing.T) {
	for _, tg := range conformanceTargets(t) {
		t.Run(tg.name, func(t *testing.T) {
			s, clk := tg.new(t)
			requireGroupedLog(t, s)
			c := Check{Algorithm: SlidingLog, Tenant: "huge", Policy: "p", Rate: Rate{Limit: MaxCount, Window: time.Minute}, Cost: 1 << 40}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			start := time.Now()
			for i := range 64 {
				clk.Set(baseTime.Add(time.Duration(i) * time.Millisecond))
				if ok, res := mustDecide(t, s, c); !ok || res[0].Remaining != MaxCount-int64(i+1)<<40 {
					t.Fatalf("request %d: %v %+v", i, ok, res)
				}
			}
			elapsed := time.Since(start)
			runtime.ReadMemStats(&after)
			// 64 requests, 2^46 units: a few KiB of entries and the
			// calls' own garbage, whatever the cost.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 4<<20 {
				t.Errorf("64 requests of cost 2^40 allocated %d bytes", alloc)
			}
			t.Logf("64 requests of cost 2^40 in %s", elapsed)
			switch s := s.(type) {
			case *MemoryStore:
				key := AppendKey(nil, s.prefix, SlidingLog, c.Tenant, c.Policy, "")
				for i := range s.shards {
					if e := s.shards[i].m[string(key)]; e != nil && (e.log.len() != 64 || e.log.bytes() != 64*logEntryBytes) {
						t.Fatalf("log of %d entries in %d bytes, want 64 in %d", e.log.len(), e.log.bytes(), 64*logEntryBytes)
					}
				}
			case *RedisStore:
				key := string(AppendKey(nil, s.prefix, SlidingLog, c.Tenant, c.Policy, ""))
				if n := s.client.LLen(bgCtx, key).Val(); n != 1+2*64 {
					t.Fatalf("list of %d elements, want %d", n, 1+2*64)
				}
				if b := s.client.MemoryUsage(bgCtx, key, 0).Val(); b > 4096 {
					t.Fatalf("MEMORY USAGE %d bytes for 64 entries", b)
				}
			}
			// The (2^40 x 63 + 1)-th oldest unit is the first of the last
			// entry, logged at 63ms: a request that needs it waits for it.
			c.Cost = MaxCount - 1<<40 + 1
			clk.Set(baseTime.Add(time.Second))
			if ok, res := mustDecide(t, s, c); ok || res[0].RetryAfter != time.Minute+63*time.Millisecond-time.Second {
				t.Fatalf("needing the newest entry: %v %+v", ok, res)
			}
		})
	}
}

// redisLog returns the list of a sliding-log key as integers.
func redisLog(t *testing.T, client *redis.Client, key string) []int64 {
	t.Helper()
	raw, err := client.LRange(bgCtx, key, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int64, len(raw))
	for i, v := range raw {
		if out[i], err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// newManualRedis returns a RedisStore on a fresh server whose scripts use
// a manual clock at baseTime.
func newManualRedis(t *testing.T) (*RedisStore, *redis.Client, *manualClock) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout})
	clk := newManualClock(baseTime)
	s.now = func() int64 { return clk.Now().UnixMicro() }
	return s, client, clk
}

// TestRedisSlidingLogLayout: the list holds base, then (ts, cum) per
// admission; admissions at one instant share an entry; entries that left
// the window are dropped when an admission is written (LTRIM), never by a
// peek or a denial; an empty log is deleted.
func TestRedisSlidingLogLayout(t *testing.T) {
	s, client, clk := newManualRedis(t)
	t0 := baseTime.UnixMicro()
	sec := int64(time.Second / time.Microsecond)
	c := Check{Algorithm: SlidingLog, Tenant: "t", Policy: "p", Rate: Rate{Limit: 10, Window: 10 * time.Second}, Cost: 2}
	key := "rl:sliding_log:{t}:p"
	same := func(want ...int64) {
		t.Helper()
		if got := redisLog(t, client, key); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("list %v, want %v", got, want)
		}
	}
	mustDecide(t, s, c)
	mustDecide(t, s, withCost(c, 1))
	same(0, t0, 3)
	for i := int64(1); i <= 3; i++ {
		clk.Set(baseTime.Add(time.Duration(i) * time.Second))
		mustDecide(t, s, c)
	}
	same(0, t0, 3, t0+sec, 5, t0+2*sec, 7, t0+3*sec, 9)
	// At 12s the entries of 0s, 1s and 2s left the window: a denial and a
	// peek write nothing, an admission drops them with the new one.
	clk.Set(baseTime.Add(12 * time.Second))
	if ok, _ := mustDecide(t, s, withCost(c, 11)); ok {
		t.Fatal("cost 11 admitted")
	}
	mustPeek(t, s, c)
	same(0, t0, 3, t0+sec, 5, t0+2*sec, 7, t0+3*sec, 9)
	if ok, res := mustDecide(t, s, c); !ok || res[0] != wantAllow(6, time.Second) {
		t.Fatalf("at 12s: %v %+v", ok, res)
	}
	same(7, t0+3*sec, 9, t0+12*sec, 11)
	if ttl := client.PTTL(bgCtx, key).Val(); ttl <= 0 || ttl > 10*time.Second {
		t.Fatalf("PTTL %s", ttl)
	}
	// Everything left: the next admission starts from the last cum.
	clk.Set(baseTime.Add(30 * time.Second))
	mustDecide(t, s, c)
	same(11, t0+30*sec, 13)
}

// TestRedisSlidingLogUpgrade: a key written by an older Tollgate (a string
// of 8-byte little-endian µs timestamps, one per unit, oldest first) is
// read as the same log, converted to the list on first use with equal
// timestamps grouped and its TTL kept.
func TestRedisSlidingLogUpgrade(t *testing.T) {
	s, client, clk := newManualRedis(t)
	t0 := baseTime.UnixMicro()
	sec := int64(time.Second / time.Microsecond)
	pack := func(ts ...int64) string {
		b := make([]byte, 0, 8*len(ts))
		for _, v := range ts {
			for i := range 8 {
				b = append(b, byte(v>>(8*i)))
			}
		}
		return string(b)
	}
	c := Check{Algorithm: SlidingLog, Tenant: "old", Policy: "p", Rate: Rate{Limit: 10, Window: 10 * time.Second}, Cost: 1}
	key := "rl:sliding_log:{old}:p"
	client.Set(bgCtx, key, pack(t0, t0, t0, t0+sec, t0+2*sec, t0+2*sec), 9*time.Second)

	// A peek reads it (3 units at 0s, 1 at 1s, 2 at 2s).
	clk.Set(baseTime.Add(3 * time.Second))
	if got := mustPeek(t, s, c)[0]; got != wantAllow(4, 7*time.Second) {
		t.Fatalf("peek of the old log: %+v", got)
	}
	if got := redisLog(t, client, key); fmt.Sprint(got) != fmt.Sprint([]int64{0, t0, 3, t0 + sec, 4, t0 + 2*sec, 6}) {
		t.Fatalf("converted to %v", got)
	}
	if ttl := client.PTTL(bgCtx, key).Val(); ttl <= 8*time.Second || ttl > 9*time.Second {
		t.Fatalf("PTTL %s after the conversion, want the old 9s", ttl)
	}
	if ok, res := mustDecide(t, s, withCost(c, 4)); !ok || res[0] != wantAllow(0, 7*time.Second) {
		t.Fatalf("decide on the converted log: %v %+v", ok, res)
	}
	// At 10s the 3 units of 0s left, 7 remain: a request of 4 waits for
	// the oldest of them (1s).
	clk.Set(baseTime.Add(10 * time.Second))
	if ok, res := mustDecide(t, s, withCost(c, 4)); ok || res[0] != wantDeny(3, time.Second, time.Second) {
		t.Fatalf("at 10s: %v %+v", ok, res)
	}

	// An old log converted by a decide; one whose units all left the
	// window; a string that is not a log (treated as empty, as before).
	client.Set(bgCtx, "rl:sliding_log:{old2}:p", pack(t0+sec, t0+sec), time.Minute)
	client.Set(bgCtx, "rl:sliding_log:{old3}:p", pack(t0-20*sec), time.Minute)
	client.Set(bgCtx, "rl:sliding_log:{old4}:p", "garbage", time.Minute)
	clk.Set(baseTime.Add(2 * time.Second))
	for tenant, want := range map[string]Result{"old2": wantAllow(7, 9*time.Second), "old3": wantAllow(9, 10*time.Second), "old4": wantAllow(9, 10*time.Second)} {
		cc := c
		cc.Tenant = tenant
		if ok, res := mustDecide(t, s, cc); !ok || res[0] != want {
			t.Fatalf("%s: %v %+v, want %+v", tenant, ok, res, want)
		}
		if typ := client.Type(bgCtx, "rl:sliding_log:{"+tenant+"}:p").Val(); typ != "list" {
			t.Fatalf("%s is a %s after a decide", tenant, typ)
		}
	}
	// Another type is an error, not a silent overwrite.
	client.HSet(bgCtx, "rl:sliding_log:{hash}:p", "a", "b")
	cc := c
	cc.Tenant = "hash"
	if _, err := s.Decide(bgCtx, []Check{cc}, make([]Result, 1)); err == nil {
		t.Fatal("a hash was taken for a sliding log")
	}
}

// runRefund gives back checks charged at the µs instant at, as RedisStore
// does after a cross-slot denial: one Charge of their negated costs.
func runRefund(t *testing.T, s *RedisStore, at int64, checks ...Check) []Result {
	t.Helper()
	back := make([]Check, len(checks))
	for i := range checks {
		back[i] = giveBackCheck(&checks[i], at*int64(time.Microsecond))
	}
	res := make([]Result, len(checks))
	if err := s.charge(bgCtx, "", back, make([]int64, len(back)), res); err != nil {
		t.Fatal(err)
	}
	return res
}

// TestRedisSlidingLogRefund: a refund takes up to cost units from the
// entry logged at the charge's instant, shifts the later entries' counts
// and deletes the entry (or the key) it empties.
func TestRedisSlidingLogRefund(t *testing.T) {
	s, client, clk := newManualRedis(t)
	t0 := baseTime.UnixMicro()
	sec := int64(time.Second / time.Microsecond)
	c := Check{Algorithm: SlidingLog, Tenant: "r", Policy: "p", Rate: Rate{Limit: 100, Window: time.Hour}}
	key := "rl:sliding_log:{r}:p"
	same := func(want ...int64) {
		t.Helper()
		if got := redisLog(t, client, key); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("list %v, want %v", got, want)
		}
	}
	for i, cost := range []int64{2, 3, 1, 4} {
		clk.Set(baseTime.Add(time.Duration(i) * time.Second))
		mustDecide(t, s, withCost(c, cost))
	}
	same(0, t0, 2, t0+sec, 5, t0+2*sec, 6, t0+3*sec, 10)
	clk.Set(baseTime.Add(4 * time.Second))
	if res := runRefund(t, s, t0+sec, withCost(c, 2)); res[0] != wantAllow(92, time.Hour-4*time.Second) {
		t.Fatalf("refund reply %+v", res[0])
	}
	same(0, t0, 2, t0+sec, 3, t0+2*sec, 4, t0+3*sec, 8)
	// More than the entry holds: the entry goes.
	runRefund(t, s, t0+sec, withCost(c, 5))
	same(0, t0, 2, t0+2*sec, 3, t0+3*sec, 7)
	// No entry at that instant: nothing changes.
	runRefund(t, s, t0+5*sec, withCost(c, 5))
	runRefund(t, s, t0+sec, withCost(c, 5))
	same(0, t0, 2, t0+2*sec, 3, t0+3*sec, 7)
	// Two checks of the key in one refund, the newest entry first.
	runRefund(t, s, t0+3*sec, withCost(c, 1), withCost(c, 3))
	same(0, t0, 2, t0+2*sec, 3)
	if got := mustPeek(t, s, c)[0]; got != wantAllow(97, time.Hour-4*time.Second) {
		t.Fatalf("after the refunds: %+v", got)
	}
	// The min_interval of the remaining newest entry still applies.
	mi := c
	mi.Rate.MinInterval = 3 * time.Second
	if ok, res := mustDecide(t, s, withCost(mi, 1)); ok || res[0].RetryAfter != time.Second {
		t.Fatalf("min_interval after a refund: %v %+v", ok, res)
	}
	runRefund(t, s, t0, withCost(c, 2))
	runRefund(t, s, t0+2*sec, withCost(c, 1))
	if n := client.Exists(bgCtx, key).Val(); n != 0 {
		t.Fatalf("emptied log still stored: %v", redisLog(t, client, key))
	}

	// Counts that wrapped around 2^53.
	client.RPush(bgCtx, key, 1<<53-3, t0, 1<<53-1, t0+sec, 1)
	client.Expire(bgCtx, key, time.Hour)
	if got := mustPeek(t, s, c)[0]; got != wantAllow(96, time.Hour-4*time.Second) {
		t.Fatalf("wrapped log: %+v", got)
	}
	runRefund(t, s, t0, withCost(c, 2))
	same(1<<53-3, t0+sec, 1<<53-1)
	if got := mustPeek(t, s, c)[0]; got != wantAllow(98, time.Hour-3*time.Second) {
		t.Fatalf("wrapped log after a refund: %+v", got)
	}
}

// TestRedisSlidingLogCharge: the force mode (recovery charging) on a
// sliding log charges what fits, chained over two checks of the key, and
// a cost of 2^40 is one entry.
func TestRedisSlidingLogCharge(t *testing.T) {
	s, client, clk := newManualRedis(t)
	c := Check{Algorithm: SlidingLog, Tenant: "f", Policy: "p", Rate: Rate{Limit: 20, Window: time.Minute, MinInterval: time.Hour}, Cost: 3}
	mustDecide(t, s, c)
	clk.Advance(time.Second)
	charged := make([]int64, 2)
	if err := s.Charge(bgCtx, "", []Check{withCost(c, 5), withCost(c, 1000)}, charged); err != nil {
		t.Fatal(err)
	}
	if charged[0] != 5 || charged[1] != 12 {
		t.Fatalf("charged %v, want [5 12]", charged)
	}
	if got := redisLog(t, client, "rl:sliding_log:{f}:p"); len(got) != 5 || got[4] != 20 {
		t.Fatalf("list %v", got)
	}
	if got := mustPeek(t, s, withCost(c, 0))[0]; got != wantAllow(0, time.Minute-time.Second) {
		t.Fatalf("after the charge: %+v", got)
	}
	// Running counts are kept modulo 2^53: 2^40 units that expired plus
	// a full window of MaxCount units wrap the newest count to 2^40-1.
	h := Check{Algorithm: SlidingLog, Tenant: "fh", Policy: "p", Rate: Rate{Limit: MaxCount, Window: time.Minute}}
	if err := s.Charge(bgCtx, "", []Check{withCost(h, 1<<40)}, charged[:1]); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute)
	if err := s.Charge(bgCtx, "", []Check{withCost(h, 1<<40), withCost(h, MaxCount)}, charged); err != nil {
		t.Fatal(err)
	}
	if charged[0] != 1<<40 || charged[1] != MaxCount-1<<40 {
		t.Fatalf("charged %v", charged)
	}
	if got := redisLog(t, client, "rl:sliding_log:{fh}:p"); len(got) != 3 || got[2] != 1<<40-1 {
		t.Fatalf("list %v, want one entry whose count wrapped to 2^40-1", got)
	}
	if got := mustPeek(t, s, withCost(h, 1))[0]; got != wantDeny(0, time.Minute, time.Minute) {
		t.Fatalf("after charging MaxCount: %+v", got)
	}
}

// TestRedisSlidingLogFlatCost: a decision on a sliding log that holds
// 30 000 admissions costs Redis about what one on a log of 100 does. Both
// logs are kept at their length (one admission in, the oldest out, 1ms
// apart, each store on its own clock) and decided in alternating rounds
// of 500; the Redis time per call comes from INFO commandstats, so the
// test does not time itself. A log that is rewritten or read whole on
// every call costs about 75 times more at 30 000 entries.
func TestRedisSlidingLogFlatCost(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	const step = 1000 // µs
	type bucket struct {
		store      *RedisStore
		check      Check
		n          int
		calls, sec float64
	}
	var buckets []*bucket
	for _, n := range []int{30_000, 100} {
		c := Check{Algorithm: SlidingLog, Tenant: fmt.Sprint("flat-", n), Policy: "p",
			Rate: Rate{Limit: 1 << 40, Window: time.Duration(n*step) * time.Microsecond}, Cost: 1}
		now := fillSlidingLog(t, client, "rl", c, n, baseTime.UnixMicro(), step)
		s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout})
		s.now = func() int64 { return now }
		// Decide advances the store's own clock after each call.
		b := &bucket{store: s, check: c, n: n}
		b.store.now = func() int64 { now += step; return now - step }
		buckets = append(buckets, b)
	}
	res := make([]Result, 1)
	for round := range 5 {
		for _, b := range buckets {
			if round == 0 { // warm up
				for range 200 {
					b.store.Decide(bgCtx, []Check{b.check}, res)
				}
				continue
			}
			calls0, usec0 := scriptStats(t, client)
			for range 500 {
				if ok, err := b.store.Decide(bgCtx, []Check{b.check}, res); !ok || err != nil {
					t.Fatal(ok, err)
				}
			}
			calls1, usec1 := scriptStats(t, client)
			b.calls += calls1 - calls0
			b.sec += usec1 - usec0
			if res[0].Remaining != 1<<40-int64(b.n) {
				t.Fatalf("Remaining %d: the log does not hold %d units", res[0].Remaining, b.n)
			}
		}
	}
	long, short := buckets[0].sec/buckets[0].calls, buckets[1].sec/buckets[1].calls
	t.Logf("Redis µs per decision: %.1f at 30 000 entries, %.1f at 100", long, short)
	if long > 4*short {
		t.Fatalf("a decision at 30 000 entries costs %.1f µs of Redis, %.1f times one at 100 entries (%.1f µs)", long, long/short, short)
	}
}
