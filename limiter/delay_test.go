package limiter

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// wantWait is an admission whose turn is wait away.
func wantWait(remaining int64, reset, wait time.Duration) Result {
	return Result{Allowed: true, Remaining: remaining, Reset: reset, Wait: wait}
}

// delayRate is 10 per second (a unit every 100ms), burst 1, turns up to
// 1s away: the example.
var delayRate = Rate{Limit: 10, Window: time.Second, Burst: 1, Delay: time.Second}

// turnSteps is shared by token_bucket and gcra: ten requests at one
// instant pass at 0, 100, ..., 900ms, the eleventh at 1s (the longest
// wait, included), the twelfth is denied with Retry-After its turn.
var turnSteps = func() []algoStep {
	steps := []algoStep{{at: 0, cost: 1, want: wantAllow(0, 100*msec)}}
	for k := 1; k <= 10; k++ {
		d := time.Duration(k) * 100 * msec
		steps = append(steps, algoStep{at: 0, cost: 1, want: wantWait(0, d+100*msec, d)})
	}
	return append(steps,
		algoStep{at: 0, cost: 1, want: wantDeny(0, 1100*msec, 1100*msec)},
		// A cost beyond the capacity never fits, turn or not.
		algoStep{at: 0, cost: 2, want: wantDeny(0, time.Second, 1100*msec)},
		// Half a unit has come back: the next turn is 50ms away, right
		// after the last one handed out (at 1100ms).
		algoStep{at: 1050 * msec, cost: 1, want: wantWait(0, 150*msec, 50*msec)},
		algoStep{at: 1050 * msec, cost: 0, want: wantAllow(0, 150*msec)},
		algoStep{at: 3 * time.Second, cost: 0, want: wantAllow(1, 0)},
		algoStep{at: 3 * time.Second, cost: 1, want: wantAllow(0, 100*msec)},
	)
}()

// burstTurnSteps: 2 per second, capacity 4, turns up to 2s away, costs
// above one.
var burstTurnSteps = []algoStep{
	{at: 0, cost: 3, want: wantAllow(1, 500*msec)},
	{at: 0, cost: 3, want: wantWait(0, 1500*msec, time.Second)},
	{at: 0, cost: 2, want: wantWait(0, 2500*msec, 2*time.Second)},
	{at: 0, cost: 1, want: wantDeny(0, 2500*msec, 2500*msec)},
	{at: 0, cost: 5, want: wantDeny(0, time.Second, 2500*msec)},
	{at: 500 * msec, cost: 1, want: wantWait(0, 2500*msec, 2*time.Second)},
}

// TestDelayAlgorithms: the turns of the pure functions and of the memory
// store, exactly.
func TestDelayAlgorithms(t *testing.T) {
	for _, sc := range []algoScenario{
		{name: "token_bucket", algo: TokenBucket, rate: delayRate, steps: turnSteps},
		{name: "gcra", algo: GCRA, rate: delayRate, steps: turnSteps},
		{name: "token_bucket/burst", algo: TokenBucket, rate: Rate{Limit: 2, Window: time.Second, Burst: 4, Delay: 2 * time.Second}, steps: burstTurnSteps},
		{name: "gcra/burst", algo: GCRA, rate: Rate{Limit: 2, Window: time.Second, Burst: 4, Delay: 2 * time.Second}, steps: burstTurnSteps},
	} {
		t.Run(sc.name, func(t *testing.T) { runAlgoScenario(t, sc) })
	}
}

// TestDelayOnlyForContinuousBuckets: Rate.Delay is refused for other
// algorithms and out of its range, by policies and by stores (as invalid
// input, never a store failure).
func TestDelayOnlyForContinuousBuckets(t *testing.T) {
	m, _ := newTestStore(t, MemoryOptions{})
	for _, algo := range []Algorithm{SlidingWindow, FixedWindow, SlidingLog, Concurrency} {
		r := Rate{Limit: 10, Window: time.Second, Delay: time.Second}
		p := &Policy{Name: "p", Algorithm: algo, Limit: Limit{Rate: r}}
		err := p.Validate()
		if err == nil || !strings.Contains(err.Error(), "delay: applies only to token_bucket, gcra, not "+algo.String()) {
			t.Errorf("%s: Validate = %v", algo, err)
		}
		_, err = m.Decide(bgCtx, []Check{{Algorithm: algo, Tenant: "t", Policy: "p", Rate: r, Cost: 1}}, make([]Result, 1))
		if !errors.Is(err, ErrInvalidCheck) {
			t.Errorf("%s: Decide = %v, want ErrInvalidCheck", algo, err)
		}
	}
	for _, d := range []time.Duration{-time.Millisecond, time.Microsecond, MaxDelay + 1} {
		c := tbCheck("t", "p", 10, time.Second)
		c.Rate.Delay = d
		if _, err := m.Decide(bgCtx, []Check{c}, make([]Result, 1)); !errors.Is(err, ErrInvalidCheck) {
			t.Errorf("delay %s: Decide = %v, want ErrInvalidCheck", d, err)
		}
		if err := CheckDelay(d); !errors.Is(err, ErrOutOfRange) || !strings.Contains(err.Error(), "allowed: 1ms to 1h; 0 never waits") {
			t.Errorf("CheckDelay(%s) = %v", d, err)
		}
	}
	for _, d := range []time.Duration{0, MinDelay, MaxDelay} {
		if err := CheckDelay(d); err != nil {
			t.Errorf("CheckDelay(%s) = %v", d, err)
		}
	}
}

// delayScenarios are the conformance scenarios of turns: both stores hand
// out the same turns, all or nothing across checks, and give them back
// alike.
func delayScenarios() []confScenario {
	sec := time.Second
	scs := []confScenario{
		fromAlgoScenario("delay/token_bucket", TokenBucket, delayRate, turnSteps),
		fromAlgoScenario("delay/gcra", GCRA, delayRate, turnSteps),
		fromAlgoScenario("delay/token_bucket_burst", TokenBucket, Rate{Limit: 2, Window: sec, Burst: 4, Delay: 2 * sec}, burstTurnSteps),
		fromAlgoScenario("delay/gcra_burst", GCRA, Rate{Limit: 2, Window: sec, Burst: 4, Delay: 2 * sec}, burstTurnSteps),
	}

	// Several policies: each check gets its own turn; a check that denies
	// (here a fixed window, or a turn too far) leaves every bucket as it
	// was, turns included.
	a := Check{Algorithm: TokenBucket, Tenant: "t", Policy: "a", Rate: delayRate, Cost: 1}
	b := Check{Algorithm: GCRA, Tenant: "t", Policy: "b", Rate: Rate{Limit: 5, Window: sec, Burst: 1, Delay: sec}, Cost: 1}
	f := fwCheck("t", "f", 3, 10*sec)
	scs = append(scs, confScenario{name: "delay/multi_policy", steps: []confStep{
		decideStep(0, true, cks(a, b, f), wantAllow(0, 100*msec), wantAllow(0, 200*msec), wantAllow(2, 10*sec)),
		decideStep(0, true, cks(a, b, f), wantWait(0, 200*msec, 100*msec), wantWait(0, 400*msec, 200*msec), wantAllow(1, 10*sec)),
		decideStep(0, true, cks(a, b, f), wantWait(0, 300*msec, 200*msec), wantWait(0, 600*msec, 400*msec), wantAllow(0, 10*sec)),
		decideStep(0, false, cks(a, b, f), wantAllow(0, 300*msec), wantAllow(0, 600*msec), wantDeny(0, 10*sec, 10*sec)),
		peekStep(0, cks(a, b), wantAllow(0, 300*msec), wantAllow(0, 600*msec)),
		decideStep(0, true, cks(b), wantWait(0, 800*msec, 600*msec)),
		decideStep(0, true, cks(b), wantWait(0, sec, 800*msec)),
		decideStep(0, true, cks(b), wantWait(0, 1200*msec, sec)),
		// b's next turn is 1.2s away: a's turn is not taken either.
		decideStep(0, false, cks(a, b), wantAllow(0, 300*msec), wantDeny(0, 1200*msec, 1200*msec)),
		decideStep(0, true, cks(a), wantWait(0, 400*msec, 300*msec)),
		// Two checks of one bucket are chained: two turns.
		decideStep(0, true, cks(a, a), wantWait(0, 500*msec, 400*msec), wantWait(0, 600*msec, 500*msec)),
	}})

	// A shadow check takes its turn too (so its bucket is what enforcing
	// it would have made it) and never blocks.
	sh := asShadow(Check{Algorithm: TokenBucket, Tenant: "t", Policy: "s", Rate: delayRate, Cost: 1})
	e := fwCheck("t", "e", 100, 10*sec)
	scs = append(scs, confScenario{name: "delay/shadow", steps: []confStep{
		decideStep(0, true, cks(e, sh), wantAllow(99, 10*sec), wantAllow(0, 100*msec)),
		decideStep(0, true, cks(e, sh), wantAllow(98, 10*sec), wantWait(0, 200*msec, 100*msec)),
		decideStep(0, true, cks(withCost(sh, 0)), wantAllow(0, 200*msec)),
	}})

	// Refunds: a turn given back is taken by the next request; a refund
	// never fills a bucket beyond full, and a fresh bucket has nothing to
	// give back.
	for _, algo := range []Algorithm{TokenBucket, GCRA} {
		c := Check{Algorithm: algo, Tenant: "t", Policy: "r", Rate: delayRate, Cost: 1}
		refund := confStep{op: opRefund, checks: cks(c)}
		scs = append(scs, confScenario{name: "delay/refund_" + algo.String(), steps: []confStep{
			decideStep(0, true, cks(c), wantAllow(0, 100*msec)),
			decideStep(0, true, cks(c), wantWait(0, 200*msec, 100*msec)),
			decideStep(0, true, cks(c), wantWait(0, 300*msec, 200*msec)),
			refund,
			decideStep(0, true, cks(c), wantWait(0, 300*msec, 200*msec)),
			refund, refund, refund,
			peekStep(0, cks(withCost(c, 0)), wantAllow(1, 0)),
			refund,
			decideStep(0, true, cks(c), wantAllow(0, 100*msec)),
			decideStep(0, true, cks(c), wantWait(0, 200*msec, 100*msec)),
			// Later, the request waiting for 100ms goes away at 50ms: the
			// next one takes its turn.
			{at: 50 * msec, op: opRefund, checks: cks(c)},
			decideStep(50*msec, true, cks(c), wantWait(0, 150*msec, 50*msec)),
			{at: 50 * msec, op: opRefund, checks: cks(withCost(c, 5), tbCheck("t", "never-charged", 1, sec))},
			peekStep(50*msec, cks(withCost(c, 0)), wantAllow(1, 0)),
		}})
	}
	return scs
}

// TestDecisionWaitAndCancel: a request waits for the latest turn of its
// enforced verdicts (never a shadow one's); Cancel gives its turns and its
// concurrency slot back, and leaves a denied decision alone.
func TestDecisionWaitAndCancel(t *testing.T) {
	m, _ := newTestStore(t, MemoryOptions{})
	pol := func(name string, algo Algorithm, r Rate, shadow bool) *Policy {
		return &Policy{Name: name, Algorithm: algo, Limit: Limit{Rate: r, Shadow: shadow}}
	}
	a := pol("a", TokenBucket, delayRate, false)
	b := pol("b", GCRA, Rate{Limit: 5, Window: time.Second, Burst: 1, Delay: time.Second}, false)
	s := pol("s", TokenBucket, Rate{Limit: 1, Window: time.Second, Burst: 1, Delay: 10 * time.Second}, true)
	cc := pol("cc", Concurrency, Rate{Limit: 3}, false)
	items := []Item{{Policy: a, Tenant: "t", Cost: 1}, {Policy: b, Tenant: "t", Cost: 1}, {Policy: s, Tenant: "t", Cost: 1}, {Policy: cc, Tenant: "t", Cost: 1}}
	var d Decision
	for i, want := range []time.Duration{0, 200 * msec, 400 * msec} {
		if err := d.Decide(bgCtx, m, items); err != nil || !d.Admitted {
			t.Fatalf("request %d: %v, admitted %v", i, err, d.Admitted)
		}
		if got := d.Wait(); got != want {
			t.Errorf("request %d: Wait %s, want %s (the latest enforced turn; shadow s waits %s)", i, got, want, d.Verdicts[2].Result.Wait)
		}
	}
	// The third request goes away: its turns (a: 200ms, b: 400ms) and its
	// slot go back. The next request takes them.
	if err := d.Cancel(bgCtx, Fallback{}); err != nil {
		t.Fatal(err)
	}
	if err := d.Decide(bgCtx, m, items); err != nil || d.Wait() != 400*msec {
		t.Fatalf("after a cancel: %v, wait %s, want 400ms", err, d.Wait())
	}
	if r := d.Verdicts[3].Result; !r.Allowed || r.Remaining != 0 {
		t.Errorf("concurrency after a cancel: %+v, want the 3rd slot taken again", r)
	}
	// A denied request has nothing to give back; NoDelay takes no turn.
	d.NoDelay = true
	if err := d.Decide(bgCtx, m, items[:1]); err != nil || d.Admitted || d.Wait() != 0 {
		t.Fatalf("NoDelay: %v, admitted %v", err, d.Admitted)
	}
	if err := d.Cancel(bgCtx, Fallback{}); err != nil {
		t.Fatal(err)
	}
	if r := mustPeek(t, m, Check{Algorithm: TokenBucket, Tenant: "t", Policy: "a", Rate: delayRate}); r[0].Reset != 300*msec {
		t.Errorf("a after a denied Cancel: %+v, want 3 turns handed out", r[0])
	}
}

// TestDelayFallback: with the store unreachable, fail local hands out
// turns on the fallback store (at its scaled rate), and a cancel gives
// them back there.
func TestDelayFallback(t *testing.T) {
	fb, _ := newTestStore(t, MemoryOptions{})
	p := &Policy{Name: "p", Algorithm: GCRA, Limit: Limit{Rate: Rate{Limit: 20, Window: time.Second, Burst: 2, Delay: time.Second}}}
	items := []Item{{Policy: p, Tenant: "t", Cost: 1}}
	var d Decision
	// Scaled to half: 10 per second, burst 1.
	for i, want := range []time.Duration{0, 100 * msec, 200 * msec} {
		err := d.DecideOrFallback(bgCtx, brokenStore{}, Fallback{Store: fb, Scale: 0.5}, items)
		if !errors.Is(err, errUnreachable) || !d.Admitted || d.Verdicts[0].Path != PathFallback || d.Wait() != want {
			t.Fatalf("request %d: %v admitted %v path %v wait %s, want %s", i, err, d.Admitted, d.Verdicts[0].Path, d.Wait(), want)
		}
	}
	if err := d.Cancel(bgCtx, Fallback{}); err != nil {
		t.Fatal(err)
	}
	_ = d.DecideOrFallback(bgCtx, brokenStore{}, Fallback{Store: fb, Scale: 0.5}, items)
	if d.Wait() != 200*msec {
		t.Errorf("after a cancel on the fallback store: wait %s, want 200ms", d.Wait())
	}
}
