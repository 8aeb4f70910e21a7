package limiter

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// The conformance suite: one table of behavioural scenarios, played against
// a MemoryStore and a RedisStore on a real redis-server, so that both
// stores mean the same thing. Both run on a manual clock: the RedisStore's
// test hook hands the clock's instant (in µs) to the script in place of
// Redis TIME. Allowed, Remaining and admission are compared exactly on both
// stores; RetryAfter and Reset exactly on the memory store and, on Redis,
// exactly rounded up to the microsecond (the unit of the scripts).

type confOp uint8

const (
	opDecide confOp = iota
	opPeek
	opRelease
	opReset
	opRefund
)

// confStep is one operation at instant at (since baseTime).
type confStep struct {
	at       time.Duration
	op       confOp
	checks   []Check
	admitted bool     // opDecide
	want     []Result // opDecide, opPeek: one per check
	tenant   string   // opReset
	policies []string // opReset
}

type confScenario struct {
	name  string
	steps []confStep
}

// confTarget builds a fresh store on a manual clock at baseTime.
type confTarget struct {
	name  string
	redis bool
	new   func(t *testing.T) (Store, *manualClock)
}

// conformanceTargets starts one redis-server for the calling test; every
// store built on it gets its own key prefix, so scenarios never share a
// bucket.
func conformanceTargets(t *testing.T) []confTarget {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	var seq atomic.Int64
	return []confTarget{
		{name: "memory", new: func(t *testing.T) (Store, *manualClock) {
			return newTestStore(t, MemoryOptions{})
		}},
		{name: "redis", redis: true, new: func(t *testing.T) (Store, *manualClock) {
			clk := newManualClock(baseTime)
			s := NewRedisStore(RedisOptions{Client: client, Prefix: fmt.Sprintf("conf%d", seq.Add(1)), Timeout: 5 * time.Second})
			s.now = func() int64 { return clk.Now().UnixMicro() }
			return s, clk
		}},
		// The function library (FCALL, the default in Caddy), which keeps
		// state between calls (the rate tables it built) where a script
		// keeps none.
		{name: "redis-functions", redis: true, new: func(t *testing.T) (Store, *manualClock) {
			clk := newManualClock(baseTime)
			s := NewRedisStore(RedisOptions{Client: client, Prefix: fmt.Sprintf("conf%d", seq.Add(1)), Timeout: 5 * time.Second, Functions: true})
			s.now = func() int64 { return clk.Now().UnixMicro() }
			return s, clk
		}},
	}
}

// ceilMicro rounds d up to a whole microsecond.
func ceilMicro(d time.Duration) time.Duration {
	return (d + time.Microsecond - 1) / time.Microsecond * time.Microsecond
}

// sameResult compares got with want: exactly, or with durations rounded up
// to the microsecond on Redis.
func sameResult(onRedis bool, got, want Result) bool {
	// The store's instant of an admission: TestGiveBackAt checks it.
	got.At, want.At = 0, 0
	if !onRedis {
		return got == want
	}
	want.RetryAfter = ceilMicro(want.RetryAfter)
	want.Reset = ceilMicro(want.Reset)
	want.Wait = ceilMicro(want.Wait)
	return got == want
}

func runConfScenario(t *testing.T, target confTarget, sc confScenario) {
	s, clk := target.new(t)
	for i, st := range sc.steps {
		clk.Set(baseTime.Add(st.at))
		res := make([]Result, len(st.checks))
		var err error
		var admitted bool
		switch st.op {
		case opDecide:
			admitted, err = s.Decide(bgCtx, st.checks, res)
		case opPeek:
			err = s.Peek(bgCtx, st.checks, res)
		case opRelease:
			err = s.Release(bgCtx, st.checks)
		case opReset:
			err = s.Reset(bgCtx, st.tenant, st.policies)
		case opRefund:
			err = giveBack(s, st.checks)
		}
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if st.op == opDecide && admitted != st.admitted {
			t.Fatalf("step %d (at %s): admitted %v, want %v; results %+v", i, st.at, admitted, st.admitted, res)
		}
		if st.op == opDecide || st.op == opPeek {
			for j := range st.checks {
				if !sameResult(target.redis, res[j], st.want[j]) {
					t.Fatalf("step %d (at %s) check %d (%s %q/%s cost %d): got %+v, want %+v",
						i, st.at, j, st.checks[j].Algorithm, trunc(st.checks[j].Tenant), st.checks[j].Policy, st.checks[j].Cost, res[j], st.want[j])
				}
			}
		}
	}
}

func trunc(s string) string {
	if len(s) > 20 {
		return fmt.Sprintf("%.20s...(%d bytes)", s, len(s))
	}
	return s
}

// fromAlgoScenario turns an algorithm scenario (one bucket) into steps.
func fromAlgoScenario(name string, algo Algorithm, rate Rate, steps []algoStep) confScenario {
	sc := confScenario{name: name}
	for _, a := range steps {
		c := Check{Algorithm: algo, Tenant: "t", Policy: "p", Rate: rate, Cost: a.cost}
		if a.rate.Limit != 0 {
			c.Rate = a.rate
		}
		if a.release > 0 {
			c.Cost = a.release
			sc.steps = append(sc.steps, confStep{at: a.at, op: opRelease, checks: []Check{c}})
			continue
		}
		sc.steps = append(sc.steps, confStep{at: a.at, checks: []Check{c}, admitted: a.want.Allowed, want: []Result{a.want}})
	}
	return sc
}

func decideStep(at time.Duration, admitted bool, checks []Check, want ...Result) confStep {
	return confStep{at: at, checks: checks, admitted: admitted, want: want}
}

func peekStep(at time.Duration, checks []Check, want ...Result) confStep {
	return confStep{at: at, op: opPeek, checks: checks, want: want}
}

func cks(c ...Check) []Check { return c }

func withCost(c Check, cost int64) Check {
	c.Cost = cost
	return c
}

func asShadow(c Check) Check {
	c.Shadow = true
	return c
}

func conformanceScenarios() []confScenario {
	sec := time.Second
	var scs []confScenario

	// Each algorithm alone: exact allow/deny sequences, cost > 1, costs
	// that never fit, peeks (cost 0), lowered limits.
	scs = append(scs,
		fromAlgoScenario("token_bucket", TokenBucket, Rate{Limit: 10, Window: 10 * sec}, tokenSteps),
		fromAlgoScenario("token_bucket/burst", TokenBucket, Rate{Limit: 1, Window: sec, Burst: 5}, burstSteps),
		// 3 per second: waits that are not whole µs round up.
		fromAlgoScenario("token_bucket/third", TokenBucket, Rate{Limit: 3, Window: sec}, []algoStep{
			{at: 0, cost: 3, want: wantAllow(0, 333333334)},
			{at: 333333 * time.Microsecond, cost: 1, want: wantDeny(0, 334, 334)},
			{at: 333334 * time.Microsecond, cost: 1, want: wantAllow(0, 333332667)},
		}),
		fromAlgoScenario("gcra", GCRA, Rate{Limit: 10, Window: 10 * sec}, tokenSteps),
		fromAlgoScenario("gcra/burst", GCRA, Rate{Limit: 1, Window: sec, Burst: 5}, burstSteps),
		fromAlgoScenario("sliding_window", SlidingWindow, Rate{Limit: 10, Window: 10 * sec}, []algoStep{
			{at: 0, cost: 4, want: wantAllow(6, 12500*msec)},
			{at: 5 * sec, cost: 6, want: wantAllow(0, 6*sec)},
			{at: 9900 * msec, cost: 1, want: wantDeny(0, 1100*msec, 1100*msec)},
			{at: 10 * sec, cost: 1, want: wantDeny(0, sec, sec)},
			{at: 15 * sec, cost: 0, want: wantAllow(5, sec)},
			{at: 15 * sec, cost: 5, want: wantAllow(0, sec)},
			{at: 15 * sec, cost: 11, want: wantDeny(0, 10*sec, sec)},
			{at: 15 * sec, cost: 3, want: wantDeny(0, 3*sec, sec)},
			{at: 25 * sec, cost: 0, want: wantAllow(7, sec)},
			{at: 25 * sec, cost: 10, want: wantDeny(7, 5*sec, sec)},
			{at: 40 * sec, cost: 0, want: wantAllow(10, 0)},
		}),
		// 3 per 10s: a previous window of 3 weighs 3 x (10s - e)/10s.
		fromAlgoScenario("sliding_window/thirds", SlidingWindow, Rate{Limit: 4, Window: 10 * sec}, []algoStep{
			{at: 0, cost: 1, want: wantAllow(3, 20*sec)},
			{at: 0, cost: 1, want: wantAllow(2, 15*sec)},
			{at: 0, cost: 1, want: wantAllow(1, 13333333334)},
			{at: 0, cost: 1, want: wantAllow(0, 12500*msec)},
			{at: 0, cost: 1, want: wantDeny(0, 12500*msec, 12500*msec)},
			{at: 12500 * msec, cost: 1, want: wantAllow(0, 2500*msec)},
		}),
		fromAlgoScenario("fixed_window", FixedWindow, Rate{Limit: 10, Window: 10 * sec}, []algoStep{
			{at: 0, cost: 4, want: wantAllow(6, 10*sec)},
			{at: 9900 * msec, cost: 6, want: wantAllow(0, 100*msec)},
			{at: 9900 * msec, cost: 1, want: wantDeny(0, 100*msec, 100*msec)},
			{at: 10 * sec, cost: 10, want: wantAllow(0, 10*sec)},
			{at: 10 * sec, cost: 11, want: wantDeny(0, 10*sec, 10*sec)},
			{at: 15 * sec, cost: 0, want: wantAllow(0, 5*sec)},
			{at: 25 * sec, cost: 0, want: wantAllow(10, 0)},
		}),
		fromAlgoScenario("sliding_log", SlidingLog, Rate{Limit: 3, Window: 10 * sec}, []algoStep{
			{at: 0, cost: 1, want: wantAllow(2, 10*sec)},
			{at: 2 * sec, cost: 1, want: wantAllow(1, 8*sec)},
			{at: 4 * sec, cost: 1, want: wantAllow(0, 6*sec)},
			{at: 5 * sec, cost: 1, want: wantDeny(0, 5*sec, 5*sec)},
			{at: 5 * sec, cost: 2, want: wantDeny(0, 7*sec, 5*sec)},
			{at: 5 * sec, cost: 4, want: wantDeny(0, 10*sec, 5*sec)},
			{at: 10 * sec, cost: 1, want: wantAllow(0, 2*sec)},
			{at: 10 * sec, cost: 0, want: wantAllow(0, 2*sec)},
			{at: 14 * sec, cost: 2, want: wantAllow(0, 6*sec)},
			{at: 20 * sec, cost: 1, want: wantAllow(0, 4*sec)},
			{at: 23 * sec, cost: 1, want: wantDeny(0, sec, sec)},
			{at: 24 * sec, cost: 2, want: wantAllow(0, 6*sec)},
			{at: time.Hour, cost: 0, want: wantAllow(3, 0)},
		}),
		fromAlgoScenario("sliding_log/min_interval", SlidingLog, Rate{Limit: 10, Window: 10 * sec, MinInterval: sec}, []algoStep{
			{at: 0, cost: 1, want: wantAllow(9, 10*sec)},
			{at: 500 * msec, cost: 1, want: wantDeny(9, 500*msec, 9500*msec)},
			{at: sec, cost: 1, want: wantAllow(8, 9*sec)},
			{at: 1200 * msec, cost: 0, want: wantAllow(8, 8800*msec)},
			{at: 1200 * msec, cost: 3, want: wantDeny(8, 800*msec, 8800*msec)},
			{at: 2 * sec, cost: 3, want: wantAllow(5, 8*sec)},
		}),
		fromAlgoScenario("sliding_log/min_interval_longer_than_window", SlidingLog, Rate{Limit: 5, Window: sec, MinInterval: 10 * sec}, []algoStep{
			{at: 0, cost: 1, want: wantAllow(4, sec)},
			{at: 5 * sec, cost: 1, want: wantDeny(5, 5*sec, 0)},
			{at: 10 * sec, cost: 1, want: wantAllow(4, sec)},
		}),
		fromAlgoScenario("sliding_log/limit_lowered", SlidingLog, Rate{Limit: 5, Window: 10 * sec}, []algoStep{
			{at: 0, cost: 5, want: wantAllow(0, 10*sec)},
			{at: sec, cost: 1, rate: Rate{Limit: 2, Window: 10 * sec}, want: wantDeny(0, 9*sec, 9*sec)},
			{at: 10 * sec, cost: 2, rate: Rate{Limit: 2, Window: 10 * sec}, want: wantAllow(0, 10*sec)},
			{at: 10 * sec, cost: 1, want: wantAllow(2, 10*sec)},
		}),
		// Costs and limits up to 2^53 are one entry each: the log's
		// running count wraps around 2^53 in Redis several times here, and
		// a window holding exactly 2^53 units is full, not empty.
		fromAlgoScenario("sliding_log/huge_costs", SlidingLog, Rate{Limit: MaxCount, Window: 10 * sec}, []algoStep{
			{at: 0, cost: 1 << 40, want: wantAllow(MaxCount-1<<40, 10*sec)},
			{at: sec, cost: MaxCount - 1<<40, want: wantAllow(0, 9*sec)},
			{at: 2 * sec, cost: 1, want: wantDeny(0, 8*sec, 8*sec)},
			// The (2^40+1)-th oldest unit is the first one logged at 1s.
			{at: 2 * sec, cost: 1<<40 + 1, want: wantDeny(0, 9*sec, 8*sec)},
			{at: 2 * sec, cost: MaxCount, want: wantDeny(0, 9*sec, 8*sec)},
			{at: 10 * sec, cost: 1 << 40, want: wantAllow(0, sec)},
			{at: 11 * sec, cost: MaxCount - 1<<40, want: wantAllow(0, 9*sec)},
			{at: 12 * sec, cost: 0, want: wantAllow(0, 8*sec)},
			{at: 20 * sec, cost: 1, want: wantAllow(1<<40-1, sec)},
			{at: 20 * sec, cost: 1 << 40, want: wantDeny(1<<40-1, sec, sec)},
			{at: 31 * sec, cost: 0, want: wantAllow(MaxCount, 0)},
		}),
		// Admissions at one instant share an entry; the k-th oldest unit
		// is found inside it.
		fromAlgoScenario("sliding_log/same_instant", SlidingLog, Rate{Limit: 6, Window: 10 * sec}, []algoStep{
			{at: 0, cost: 1, want: wantAllow(5, 10*sec)},
			{at: 0, cost: 2, want: wantAllow(3, 10*sec)},
			{at: 0, cost: 1, want: wantAllow(2, 10*sec)},
			{at: 5 * sec, cost: 2, want: wantAllow(0, 5*sec)},
			{at: 5 * sec, cost: 3, want: wantDeny(0, 5*sec, 5*sec)},
			{at: 5 * sec, cost: 5, want: wantDeny(0, 10*sec, 5*sec)},
			{at: 10 * sec, cost: 0, want: wantAllow(4, 5*sec)},
			{at: 10 * sec, cost: 4, want: wantAllow(0, 5*sec)},
			{at: 15 * sec, cost: 0, want: wantAllow(2, 5*sec)},
		}),
		// Units logged while the clock is back join the newest entry.
		fromAlgoScenario("sliding_log/clock_backwards_entries", SlidingLog, Rate{Limit: 10, Window: 10 * sec}, []algoStep{
			{at: 15 * sec, cost: 3, want: wantAllow(7, 10*sec)},
			{at: 16 * sec, cost: 3, want: wantAllow(4, 9*sec)},
			{at: 14 * sec, cost: 2, want: wantAllow(2, 11*sec)},
			{at: 14 * sec, cost: 3, want: wantDeny(2, 11*sec, 11*sec)},
			{at: 25 * sec, cost: 0, want: wantAllow(5, sec)},
			{at: 26 * sec, cost: 0, want: wantAllow(10, 0)},
		}),
		fromAlgoScenario("sliding_log/min_interval_huge", SlidingLog, Rate{Limit: MaxCount, Window: 10 * sec, MinInterval: 3 * sec}, []algoStep{
			{at: 0, cost: 1 << 52, want: wantAllow(1<<52-1, 10*sec)},
			{at: sec, cost: 1, want: wantDeny(1<<52-1, 2*sec, 9*sec)},
			{at: 3 * sec, cost: 1<<52 - 1, want: wantAllow(0, 7*sec)},
			{at: 5 * sec, cost: 1, want: wantDeny(0, 5*sec, 5*sec)},
			{at: 11 * sec, cost: 1, want: wantAllow(1<<52-1, 2*sec)},
		}),
		fromAlgoScenario("concurrency", Concurrency, Rate{Limit: 2}, []algoStep{
			{cost: 1, want: wantAllow(1, sec)},
			{cost: 1, want: wantAllow(0, sec)},
			{cost: 1, want: wantDeny(0, sec, sec)},
			{release: 1},
			{cost: 1, want: wantAllow(0, sec)},
			{cost: 3, want: wantDeny(0, sec, sec)},
			{release: 2},
			{cost: 0, want: wantAllow(2, 0)},
			{release: 5},
			{cost: 2, want: wantAllow(0, sec)},
			{cost: 1, want: wantDeny(0, sec, sec)},
		}),
	)

	// Several policies: all or nothing. b denies, so a (which allows) is
	// not charged, whatever the order and the algorithms.
	a := tbCheck("t", "a", 10, 10*sec)
	b := fwCheck("t", "b", 1, 10*sec)
	lg := Check{Algorithm: SlidingLog, Tenant: "t", Policy: "lg", Rate: Rate{Limit: 5, Window: 10 * sec}, Cost: 1}
	cc := Check{Algorithm: Concurrency, Tenant: "t", Policy: "cc", Rate: Rate{Limit: 1}, Cost: 1}
	scs = append(scs, confScenario{name: "multi_policy", steps: []confStep{
		decideStep(0, true, cks(a, b), wantAllow(9, sec), wantAllow(0, 10*sec)),
		decideStep(0, false, cks(a, b), wantAllow(9, sec), wantDeny(0, 10*sec, 10*sec)),
		peekStep(0, cks(a), wantAllow(9, sec)),
		decideStep(0, false, cks(b, a), wantDeny(0, 10*sec, 10*sec), wantAllow(9, sec)),
		peekStep(0, cks(a), wantAllow(9, sec)),
		// Four algorithms in one request; the concurrency slot is taken.
		decideStep(sec, true, cks(lg, cc, a), wantAllow(4, 10*sec), wantAllow(0, sec), wantAllow(9, sec)),
		// a refilled: full again.
		decideStep(2*sec, false, cks(lg, a, cc), wantAllow(4, 9*sec), wantAllow(10, 0), wantDeny(0, sec, sec)),
		peekStep(2*sec, cks(withCost(lg, 0), withCost(a, 0)), wantAllow(4, 9*sec), wantAllow(10, 0)),
		{at: 2 * sec, op: opRelease, checks: cks(cc, a)}, // a is not a concurrency check: ignored
		decideStep(3*sec, true, cks(lg, a, cc), wantAllow(3, 8*sec), wantAllow(9, sec), wantAllow(0, sec)),
		// b's window rolled: everything allows again.
		decideStep(10*sec, true, cks(b, withCost(a, 2)), wantAllow(0, 10*sec), wantAllow(8, sec)),
	}})

	// Shadow checks never block; they are charged only when they allow and
	// the request is admitted.
	sh := asShadow(tbCheck("t", "s", 2, 2*sec)) // one token per second
	d := asShadow(tbCheck("t", "d", 5, 5*sec))
	lgs := asShadow(Check{Algorithm: SlidingLog, Tenant: "t", Policy: "l", Rate: Rate{Limit: 1, Window: 10 * sec}, Cost: 1})
	scs = append(scs, confScenario{name: "shadow", steps: []confStep{
		decideStep(0, true, cks(a, sh), wantAllow(9, sec), wantAllow(1, sec)),
		decideStep(0, true, cks(a, sh), wantAllow(8, sec), wantAllow(0, sec)),
		decideStep(0, true, cks(a, sh), wantAllow(7, sec), wantDeny(0, sec, sec)),
		// The denying shadow check was not charged: next token still 1s away.
		peekStep(0, cks(withCost(sh, 0), a), wantAllow(0, sec), wantAllow(7, sec)),
		decideStep(0, true, cks(b), wantAllow(0, 10*sec)),
		// A shadow check that allows a request denied anyway is not charged.
		decideStep(0, false, cks(b, d), wantDeny(0, 10*sec, 10*sec), wantAllow(5, 0)),
		peekStep(0, cks(d), wantAllow(5, 0)),
		// Same with a sliding log, whose charge appends to the log.
		decideStep(0, true, cks(a, lgs), wantAllow(6, sec), wantAllow(0, 10*sec)),
		decideStep(sec, true, cks(a, lgs), wantAllow(6, sec), wantDeny(0, 9*sec, 9*sec)),
		peekStep(sec, cks(withCost(lgs, 0)), wantAllow(0, 9*sec)),
		// Only shadow checks: always admitted.
		decideStep(sec, true, cks(lgs, sh), wantDeny(0, 9*sec, 9*sec), wantAllow(0, sec)),
	}})

	// Two checks of one bucket in one request are chained.
	x := tbCheck("t", "x", 3, 3*sec)
	l := Check{Algorithm: SlidingLog, Tenant: "t", Policy: "l", Rate: Rate{Limit: 3, Window: 10 * sec}, Cost: 1}
	mi := l
	mi.Policy = "mi"
	mi.Rate.MinInterval = sec
	scs = append(scs, confScenario{name: "duplicate_keys", steps: []confStep{
		decideStep(0, false, cks(withCost(x, 2), withCost(x, 2)), wantAllow(3, 0), wantDeny(1, sec, sec)),
		peekStep(0, cks(withCost(x, 2)), wantAllow(3, 0)),
		decideStep(0, true, cks(x, x), wantAllow(2, sec), wantAllow(1, sec)),
		peekStep(0, cks(x), wantAllow(1, sec)),
		decideStep(0, true, cks(l, l), wantAllow(2, 10*sec), wantAllow(1, 10*sec)),
		decideStep(0, false, cks(l, l), wantAllow(1, 10*sec), wantDeny(0, 10*sec, 10*sec)),
		peekStep(0, cks(l), wantAllow(1, 10*sec)),
		decideStep(0, false, cks(mi, mi), wantAllow(3, 0), wantDeny(2, sec, 10*sec)),
		peekStep(0, cks(mi), wantAllow(3, 0)),
		// A shadow duplicate sees the enforcing one's charge.
		decideStep(sec, true, cks(x, asShadow(withCost(x, 2))), wantAllow(1, sec), wantDeny(1, sec, sec)),
	}})

	// Chained checks of one sliding log: each sees the units the earlier
	// ones would log; a denial charges none of them.
	sl := Check{Algorithm: SlidingLog, Tenant: "t", Policy: "chain", Rate: Rate{Limit: 5, Window: 10 * sec}, Cost: 1}
	scs = append(scs, confScenario{name: "sliding_log_chained", steps: []confStep{
		decideStep(0, true, cks(withCost(sl, 2), withCost(sl, 2)), wantAllow(3, 10*sec), wantAllow(1, 10*sec)),
		decideStep(sec, false, cks(sl, sl), wantAllow(1, 9*sec), wantDeny(0, 9*sec, 9*sec)),
		decideStep(sec, true, cks(sl, asShadow(withCost(sl, 2))), wantAllow(0, 9*sec), wantDeny(0, 9*sec, 9*sec)),
		decideStep(10*sec, true, cks(withCost(sl, 3), sl), wantAllow(1, sec), wantAllow(0, sec)),
		peekStep(10*sec, cks(sl), wantDeny(0, sec, sec)),
		peekStep(11*sec, cks(withCost(sl, 0)), wantAllow(1, 9*sec)),
		// Three checks, the third denied by the two before it: the others
		// report their bucket as it is.
		decideStep(20*sec, false, cks(withCost(sl, 2), withCost(sl, 2), withCost(sl, 2)), wantAllow(5, 0), wantAllow(5, 0), wantDeny(1, 10*sec, 10*sec)),
		peekStep(20*sec, cks(withCost(sl, 0)), wantAllow(5, 0)),
	}})

	// Peek never charges and reports what Decide would.
	p := tbCheck("t", "x", 2, 10*sec)
	scs = append(scs, confScenario{name: "peek", steps: []confStep{
		decideStep(0, true, cks(withCost(p, 2)), wantAllow(0, 5*sec)),
		peekStep(0, cks(p), wantDeny(0, 5*sec, 5*sec)),
		peekStep(5*sec, cks(p, p), wantAllow(1, 5*sec), wantAllow(1, 5*sec)),
		peekStep(5*sec, cks(p), wantAllow(1, 5*sec)),
		peekStep(5*sec, cks(tbCheck("other", "x", 1, sec)), wantAllow(1, 0)),
		decideStep(5*sec, true, cks(p), wantAllow(0, 5*sec)),
	}})

	// A clock that goes back never refills or rolls a bucket.
	r10 := Rate{Limit: 10, Window: 10 * sec}
	for _, tc := range []struct {
		algo                 Algorithm
		first, back1, back10 Result
	}{
		{TokenBucket, wantAllow(0, sec), wantDeny(0, 2*sec, 2*sec), wantDeny(0, 11*sec, 11*sec)},
		{GCRA, wantAllow(0, sec), wantDeny(0, 2*sec, 2*sec), wantDeny(0, 11*sec, 11*sec)},
		{SlidingWindow, wantAllow(0, 6*sec), wantDeny(0, 7*sec, 7*sec), wantDeny(0, 16*sec, 16*sec)},
		{FixedWindow, wantAllow(0, 5*sec), wantDeny(0, 6*sec, 6*sec), wantDeny(0, 15*sec, 15*sec)},
		{SlidingLog, wantAllow(0, 10*sec), wantDeny(0, 11*sec, 11*sec), wantDeny(0, 20*sec, 20*sec)},
	} {
		c := Check{Algorithm: tc.algo, Tenant: "t", Policy: "p", Rate: r10, Cost: 1}
		scs = append(scs, confScenario{name: "clock_backwards/" + tc.algo.String(), steps: []confStep{
			decideStep(15*sec, true, cks(withCost(c, 10)), tc.first),
			decideStep(14*sec, false, cks(c), tc.back1),
			decideStep(5*sec, false, cks(c), tc.back10),
		}})
	}
	// A unit logged while the clock is back is logged at the newest
	// instant, keeping the log sorted.
	back := Check{Algorithm: SlidingLog, Tenant: "t", Policy: "back", Rate: r10, Cost: 5}
	scs = append(scs, confScenario{name: "clock_backwards/sliding_log_charge", steps: []confStep{
		decideStep(15*sec, true, cks(back), wantAllow(5, 10*sec)),
		decideStep(14*sec, true, cks(withCost(back, 1)), wantAllow(4, 11*sec)),
		decideStep(25*sec, true, cks(withCost(back, 1)), wantAllow(9, 10*sec)),
	}})

	scs = append(scs, resetScenario(), hostileScenario())
	scs = append(scs, delayScenarios()...)
	return scs
}

// resetScenario: Reset by tenant and by tenant and policy touches exactly
// the buckets it names, with tenants that share prefixes, contain key
// separators or glob metacharacters.
func resetScenario() confScenario {
	long := strings.Repeat("a", 200)
	tenants := []string{"a", "a:b", "a%3Ab", "a*", "a?", "[a]", `a\`, "ab", "a}", "{a}", "b", long, ""}
	policies := []string{"p", "p1"}
	parts := []string{"", "x:y"}
	algos := []Algorithm{FixedWindow, SlidingWindow, SlidingLog}
	check := func(algo Algorithm, tenant, policy, part string) Check {
		return Check{Algorithm: algo, Tenant: tenant, Policy: policy, Part: part, Rate: Rate{Limit: 10, Window: time.Hour}, Cost: 1}
	}
	sc := confScenario{name: "reset"}
	for _, tn := range tenants {
		for _, p := range policies {
			for _, part := range parts {
				for _, algo := range algos {
					sc.steps = append(sc.steps, decideStep(0, true, cks(check(algo, tn, p, part)), wantAllow(9, 0)))
				}
			}
		}
	}
	// Wanted Reset durations are filled in below: fixed window 1h, the
	// others as their algorithm says.
	resetOf := map[Algorithm]time.Duration{FixedWindow: time.Hour, SlidingWindow: 2 * time.Hour, SlidingLog: time.Hour}
	for i := range sc.steps {
		sc.steps[i].want[0].Reset = resetOf[sc.steps[i].checks[0].Algorithm]
	}
	reset := map[[2]string]bool{}
	for _, r := range []struct{ tenant, policy string }{
		{"a", ""},
		{"a*", "p"},
		{"a:b", "p"},
		{long, "p1"},
		{"{a}", ""},
		{"", "p"},
		{"nobody", ""},
		{"a%3Ab", "p1"},
		{`a\`, ""},
	} {
		ps := policies
		if r.policy != "" {
			ps = []string{r.policy}
		}
		sc.steps = append(sc.steps, confStep{op: opReset, tenant: r.tenant, policies: ps})
		for _, p := range policies {
			if r.policy == "" || r.policy == p {
				reset[[2]string{r.tenant, p}] = true
			}
		}
		for _, tn := range tenants {
			for _, p := range policies {
				for _, part := range parts {
					for _, algo := range algos {
						want := wantAllow(9, resetOf[algo])
						if reset[[2]string{tn, p}] {
							want = wantAllow(10, 0)
						}
						sc.steps = append(sc.steps, peekStep(0, cks(check(algo, tn, p, part)), want))
					}
				}
			}
		}
	}
	return sc
}

// hostileScenario: tenants and partitions made of key syntax, control
// bytes or megabytes each get their own bucket.
func hostileScenario() confScenario {
	mb := strings.Repeat("x", 1<<20)
	tenants := []string{"{", "}", "{}", "}{", "{a}", "a}", "a", ":", "a:b", "a%3Ab", "%", "\n", "a\nb", "\x00", "a\x00", "\x00a", "*", "?", "[", `\`, "", mb, mb + "y", "x"}
	check := func(tenant, part string) Check {
		return Check{Algorithm: FixedWindow, Tenant: tenant, Policy: "p", Part: part, Rate: Rate{Limit: 1, Window: time.Hour}, Cost: 1}
	}
	sc := confScenario{name: "hostile_tenants"}
	// Each first request is admitted: no two tenants share a bucket.
	for _, tn := range tenants {
		sc.steps = append(sc.steps, decideStep(0, true, cks(check(tn, "")), wantAllow(0, time.Hour)))
	}
	for _, part := range []string{"{", "}", ":", "\n", "\x00", mb} {
		sc.steps = append(sc.steps, decideStep(0, true, cks(check("a", part)), wantAllow(0, time.Hour)))
	}
	for _, tn := range tenants {
		sc.steps = append(sc.steps, decideStep(time.Second, false, cks(check(tn, "")), wantDeny(0, time.Hour-time.Second, time.Hour-time.Second)))
	}
	// Resetting a hostile tenant resets it alone.
	sc.steps = append(sc.steps, confStep{at: time.Second, op: opReset, tenant: "{a}", policies: []string{"p"}})
	for _, tn := range tenants {
		want := wantDeny(0, time.Hour-time.Second, time.Hour-time.Second)
		if tn == "{a}" {
			want = wantAllow(1, 0)
		}
		sc.steps = append(sc.steps, peekStep(time.Second, cks(check(tn, "")), want))
	}
	return sc
}

// TestConformance plays every scenario on both stores.
func TestConformance(t *testing.T) {
	targets := conformanceTargets(t)
	for _, target := range targets {
		// Some scenarios charge costs of up to 2^53 to a sliding log.
		s, _ := target.new(t)
		requireGroupedLog(t, s)
	}
	for _, sc := range conformanceScenarios() {
		t.Run(sc.name, func(t *testing.T) {
			for _, target := range targets {
				t.Run(target.name, func(t *testing.T) { runConfScenario(t, target, sc) })
			}
		})
	}
}

// TestConformanceRandom plays random traffic (multi-check requests over a
// few buckets of every algorithm, some token buckets and GCRA buckets
// handing out turns (Rate.Delay), shadows, duplicates, peeks, releases,
// refunds and resets, random time steps) on both stores and compares every answer:
// Allowed, Remaining and admission exactly, durations up to the µs.
// Rates keep every instant and window a whole number of µs, and GCRA's
// window a multiple of its limit in µs, where both stores compute the same
// numbers; windows are long enough that no Redis key expires in real time
// before the scenario is over.
func TestConformanceRandom(t *testing.T) {
	confSeeds := uint64(6)
	if s := os.Getenv("TOLLGATE_CONFORMANCE_SEEDS"); s != "" {
		confSeeds, _ = strconv.ParseUint(s, 10, 64)
	}
	targets := conformanceTargets(t)
	for seed := uint64(1); seed <= confSeeds; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 42))
			var buckets []Check
			for _, algo := range benchAlgorithms {
				for p := 0; p < 2; p++ {
					limit := int64(1 + rng.IntN(12))
					window := time.Duration(1+rng.IntN(10)) * time.Minute
					r := Rate{Limit: limit, Window: window}
					switch algo {
					case TokenBucket, GCRA:
						if rng.IntN(2) == 0 {
							r.Burst = limit + int64(rng.IntN(5))
						}
						if algo == GCRA {
							r.Window = time.Duration(limit) * time.Duration(1+rng.IntN(20)) * 3 * time.Second
						}
						if rng.IntN(2) == 0 {
							// Turns up to a few units' time away.
							r.Delay = time.Duration(1+rng.IntN(4)) * (r.Window / time.Duration(limit)).Truncate(time.Millisecond)
						}
					case SlidingLog:
						if rng.IntN(2) == 0 {
							r.MinInterval = time.Duration(rng.IntN(5000)) * time.Millisecond
						}
					case Concurrency:
						r.Window = 0
					}
					for _, tenant := range []string{"t1", "t2"} {
						buckets = append(buckets, Check{Algorithm: algo, Tenant: tenant, Policy: fmt.Sprintf("%s%d", algo, p), Rate: r})
					}
				}
			}
			stores := make([]Store, len(targets))
			clocks := make([]*manualClock, len(targets))
			for i, tg := range targets {
				stores[i], clocks[i] = tg.new(t)
			}
			var held [][]Check // admitted concurrency charges not yet released
			at := time.Duration(0)
			for step := 0; step < 600; step++ {
				if rng.IntN(3) == 0 {
					at += time.Duration(rng.IntN(40000)) * time.Millisecond
				}
				for _, c := range clocks {
					c.Set(baseTime.Add(at))
				}
				n := 1 + rng.IntN(3)
				checks := make([]Check, n)
				for i := range checks {
					checks[i] = buckets[rng.IntN(len(buckets))]
					checks[i].Cost = int64(rng.IntN(4))
					if rng.IntN(4) == 0 {
						checks[i].Cost = 1
					}
					checks[i].Shadow = rng.IntN(5) == 0
				}
				op := rng.IntN(20)
				results := make([][]Result, len(stores))
				admitted := make([]bool, len(stores))
				for i, s := range stores {
					results[i] = make([]Result, n)
					var err error
					switch {
					case op == 0 && len(held) > 0:
						err = s.Release(bgCtx, held[0])
					case op == 1:
						err = s.Reset(bgCtx, checks[0].Tenant, []string{checks[0].Policy})
					case op == 2:
						err = giveBack(s, checks)
					case op == 3:
						err = s.Peek(bgCtx, checks, results[i])
					default:
						admitted[i], err = s.Decide(bgCtx, checks, results[i])
					}
					if err != nil {
						t.Fatalf("step %d on %s: %v", step, targets[i].name, err)
					}
				}
				if op == 0 && len(held) > 0 {
					held = held[1:]
				}
				for k := 1; k < len(stores); k++ {
					if admitted[0] != admitted[k] {
						t.Fatalf("step %d (at %s) %+v: admitted memory %v, %s %v\nmemory %+v\n%s %+v", step, at, checks, admitted[0], targets[k].name, admitted[k], results[0], targets[k].name, results[k])
					}
					for j := range checks {
						if !sameResult(true, results[k][j], results[0][j]) {
							t.Fatalf("step %d (at %s) op %d check %d of %+v:\nmemory %+v\n%s %+v", step, at, op, j, checks, results[0][j], targets[k].name, results[k][j])
						}
					}
				}
				if op >= 4 && admitted[0] {
					var rel []Check
					for j, c := range checks {
						if c.Algorithm == Concurrency && c.Cost > 0 && results[0][j].Allowed {
							rel = append(rel, c)
						}
					}
					if len(rel) > 0 {
						held = append(held, rel)
					}
				}
			}
		})
	}
}
