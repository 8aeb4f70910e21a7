package limiter

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Benchmarks of metered costs (Decision.Settle) on a local redis-server:
//
//	go test -run xxx -bench RedisSettle -benchmem -count 3 ./limiter/
//
// The first three cases are one request each, the way the handler makes
// it: decide (the baseline: one token bucket, cost 1), decide+settle (real
// cost 30: a forced Charge) and decide+settle-refund (up front 10, real 3:
// a Refund). redis-us/call is the time Redis spent per EVALSHA (INFO
// commandstats), redis-calls/op and redis-us/op what one request costs
// Redis in all.
//
// The "interleaved" case splits the calls by kind on a noisy machine: in
// rounds of settleBenchPhase requests it decides them, then settles them,
// then decides refund requests, then settles those, reading INFO
// commandstats (timer stopped) after each phase. So a settlement's Redis
// time and wall time are measured against decisions made in the same
// rounds, and redis-x/settle is their ratio.

// settleBenchRate never denies during a benchmark (1e9 units) and refills
// slowly (31.7 units/s), so a Peek right after a settlement sees the units
// it charged, to the unit.
var settleBenchRate = Rate{Limit: 1_000_000_000, Window: MaxWindow}

// settleBenchPhase is how many requests make one phase of the interleaved
// case.
const settleBenchPhase = 128

// settleCase is one kind of request: its up-front cost and its real cost
// (NotMetered: no settlement).
type settleCase struct {
	name       string
	cost, real int64
}

var settleCases = []settleCase{
	{"decide", 1, NotMetered},
	{"decide+settle", 1, 30},
	{"decide+settle-refund", 10, 3},
}

// settleItems returns the request of one tenant on a metered token bucket.
func settleItems(tenant string, cost int64) []Item {
	p := &Policy{Name: "tokens", Algorithm: TokenBucket, FailMode: FailLocal, Limit: Limit{Rate: settleBenchRate}}
	return []Item{{Policy: p, Tenant: tenant, Cost: cost}}
}

// settleRequest decides one request of items and, unless real is
// NotMetered, settles it.
func settleRequest(tb testing.TB, s Store, d *Decision, items []Item, real []int64) {
	if err := d.Decide(bgCtx, s, items); err != nil || !d.Admitted {
		tb.Fatalf("decide: admitted %v, %v", d.Admitted, err)
	}
	if real[0] == NotMetered {
		return
	}
	if err := d.Settle(bgCtx, Fallback{}, real); err != nil {
		tb.Fatalf("settle: %v", err)
	}
}

// verifySettle makes one request of sc on a fresh tenant and checks with a
// Peek that its bucket was charged exactly the real cost (the up-front
// cost when not metered), and that it took one script call per decision
// and per settlement.
func verifySettle(tb testing.TB, s *RedisStore, client *redis.Client, sc settleCase) {
	tb.Helper()
	tenant := fmt.Sprintf("verify-%s-%d", sc.name, time.Now().UnixNano())
	want, calls := sc.real, 2.0
	if sc.real == NotMetered {
		want, calls = sc.cost, 1
	}
	c0, _ := scriptStats(tb, client)
	var d Decision
	settleRequest(tb, s, &d, settleItems(tenant, sc.cost), []int64{sc.real})
	c1, _ := scriptStats(tb, client)
	r := mustPeek(tb, s, Check{Algorithm: TokenBucket, Tenant: tenant, Policy: "tokens", Rate: settleBenchRate})
	// The bucket refills 31.7 units/s: at most one unit back by now.
	if charged := settleBenchRate.Limit - r[0].Remaining; charged != want && charged != want-1 {
		tb.Fatalf("%s: the bucket was charged %d units, want %d (remaining %d)", sc.name, charged, want, r[0].Remaining)
	}
	if c1-c0 != calls {
		tb.Fatalf("%s: %v script calls for one request, want %v", sc.name, c1-c0, calls)
	}
}

// BenchmarkRedisSettle: the cost of settling a metered request on Redis,
// against deciding it alone. See the comment at the top of the file.
func BenchmarkRedisSettle(b *testing.B) {
	s, client := benchRedisStore(b)
	for _, sc := range settleCases {
		b.Run(sc.name, func(b *testing.B) {
			verifySettle(b, s, client, sc)
			items := settleItems("bench-"+sc.name, sc.cost)
			real := []int64{sc.real}
			var d Decision
			for range 100 { // warm up (bucket, Lua heap, client buffers)
				settleRequest(b, s, &d, items, real)
			}
			if err := client.ConfigResetStat(bgCtx).Err(); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				settleRequest(b, s, &d, items, real)
			}
			calls, usec := scriptStats(b, client)
			n := float64(b.N)
			want := n
			if sc.real != NotMetered {
				want = 2 * n
			}
			if calls != want {
				b.Fatalf("%v script calls for %d requests, want %v", calls, b.N, want)
			}
			b.ReportMetric(calls/n, "redis-calls/op")
			b.ReportMetric(usec/calls, "redis-us/call")
			b.ReportMetric(usec/n, "redis-us/op")
		})
	}
	b.Run("interleaved", func(b *testing.B) {
		benchSettleInterleaved(b, s, client)
	})
}

// benchSettleInterleaved is the interleaved case of BenchmarkRedisSettle:
// one op is one script call (a decision or a settlement).
func benchSettleInterleaved(b *testing.B, s *RedisStore, client *redis.Client) {
	const k = settleBenchPhase
	type phase struct {
		name  string
		items []Item
		real  []int64 // nil: a decide phase
	}
	settle, refund := settleCases[1], settleCases[2]
	phases := []phase{
		{"decide", settleItems("bench-interleaved-settle", settle.cost), nil},
		{"settle", nil, []int64{settle.real}},
		{"decide", settleItems("bench-interleaved-refund", refund.cost), nil},
		{"refund", nil, []int64{refund.real}},
	}
	// The totals of the completed phases of each kind.
	type total struct {
		calls, usec float64
		wall        time.Duration
		phases      int
	}
	totals := map[string]*total{"decide": {}, "settle": {}, "refund": {}}
	ds := make([]Decision, k)
	for _, p := range phases { // warm up
		for j := range ds {
			if p.real == nil {
				settleRequest(b, s, &ds[j], p.items, []int64{NotMetered})
			} else if err := ds[j].Settle(bgCtx, Fallback{}, p.real); err != nil {
				b.Fatal(err)
			}
		}
	}
	calls0, usec0 := scriptStats(b, client)
	b.ReportAllocs()
	var start time.Time
	i := 0
	for b.Loop() {
		p, j := &phases[(i/k)%len(phases)], i%k
		if j == 0 {
			start = time.Now()
		}
		d := &ds[j]
		if p.real == nil {
			if err := d.Decide(bgCtx, s, p.items); err != nil || !d.Admitted {
				b.Fatalf("decide: admitted %v, %v", d.Admitted, err)
			}
		} else if err := d.Settle(bgCtx, Fallback{}, p.real); err != nil {
			b.Fatal(err)
		}
		if j == k-1 {
			wall := time.Since(start)
			b.StopTimer()
			calls, usec := scriptStats(b, client)
			if calls-calls0 != k {
				b.Fatalf("%s phase: %v script calls for %d, want one each", p.name, calls-calls0, k)
			}
			t := totals[p.name]
			t.calls += calls - calls0
			t.usec += usec - usec0
			t.wall += wall
			t.phases++
			calls0, usec0 = calls, usec
			b.StartTimer()
		}
		i++
	}
	dec := totals["decide"]
	if dec.phases == 0 {
		return // too short (-benchtime 1x): no phase completed
	}
	decUs := dec.usec / dec.calls
	b.ReportMetric(decUs, "redis-us/decide")
	b.ReportMetric(float64(dec.wall.Nanoseconds())/dec.calls, "ns/decide")
	for _, kind := range []string{"settle", "refund"} {
		t := totals[kind]
		if t.phases == 0 {
			continue
		}
		us := t.usec / t.calls
		b.ReportMetric(us, "redis-us/"+kind)
		b.ReportMetric(us/decUs, "redis-x/"+kind)
		b.ReportMetric(float64(t.wall.Nanoseconds())/t.calls, "ns/"+kind)
	}
}
