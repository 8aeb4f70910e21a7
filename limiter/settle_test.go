package limiter

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// meteredPolicy is a policy of 100 units per minute.
func meteredPolicy(name string, algo Algorithm) *Policy {
	return &Policy{Name: name, Algorithm: algo, FailMode: FailLocal, Limit: Limit{Rate: Rate{Limit: 100, Window: time.Minute}}}
}

// TestSettleChargeSequence: limit 100 units per minute, 1 unit up front,
// 30 per response: 4 requests pass (the 4th leaves the bucket 20 units in
// debt), the 5th is denied with Remaining 0, on both stores and for every
// algorithm that can be metered. A token bucket pays its debt back by
// refilling (21 units at 100/min: 12.6s); windows by rolling over.
func TestSettleChargeSequence(t *testing.T) {
	for _, target := range conformanceTargets(t) {
		for _, algo := range []Algorithm{TokenBucket, GCRA, SlidingWindow, FixedWindow, SlidingLog} {
			t.Run(target.name+"/"+algo.String(), func(t *testing.T) {
				s, clk := target.new(t)
				p := meteredPolicy("tokens", algo)
				items := []Item{{Policy: p, Tenant: "t", Cost: 1}}
				var d Decision
				wantRem := []int64{99, 69, 39, 9}
				for i := range 4 {
					if err := d.Decide(bgCtx, s, items); err != nil || !d.Admitted {
						t.Fatalf("request %d: admitted %v, %v", i+1, d.Admitted, err)
					}
					if r := d.Verdicts[0].Result.Remaining; r != wantRem[i] {
						t.Fatalf("request %d: remaining %d, want %d", i+1, r, wantRem[i])
					}
					if err := d.Settle(bgCtx, Fallback{}, []int64{30}); err != nil {
						t.Fatal(err)
					}
				}
				if err := d.Decide(bgCtx, s, items); err != nil || d.Admitted {
					t.Fatalf("request 5: admitted %v, %v; want a denial (20 units in debt)", d.Admitted, err)
				}
				r := d.Verdicts[0].Result
				if r.Remaining != 0 {
					t.Errorf("in debt: remaining %d, want 0", r.Remaining)
				}
				switch algo {
				case TokenBucket:
					// 21 tokens at 0.6s each.
					if want := ceilMicro(12600 * msec); r.RetryAfter < 12600*msec || r.RetryAfter > want {
						t.Errorf("retry after %s, want 12.6s", r.RetryAfter)
					}
				case FixedWindow:
					if r.RetryAfter != time.Minute {
						t.Errorf("retry after %s, want the end of the window", r.RetryAfter)
					}
				}
				// The debt is paid back: a token bucket after 12.6s, a
				// GCRA bucket as well, windows once their units expire.
				wait := r.RetryAfter
				clk.Advance(wait - time.Millisecond)
				if err := d.Decide(bgCtx, s, items); err != nil || d.Admitted {
					t.Fatalf("1ms before the debt is paid: admitted %v, %v", d.Admitted, err)
				}
				clk.Advance(time.Millisecond)
				if err := d.Decide(bgCtx, s, items); err != nil || !d.Admitted {
					t.Fatalf("once the debt is paid (after %s): admitted %v, %v", wait, d.Admitted, err)
				}
			})
		}
	}
}

// TestSettleGivesBack: a real cost below the up-front cost gives the
// difference back to token buckets and GCRA buckets; windows and logs
// keep the up-front units.
func TestSettleGivesBack(t *testing.T) {
	for _, target := range conformanceTargets(t) {
		for _, tc := range []struct {
			algo Algorithm
			want int64
		}{{TokenBucket, 97}, {GCRA, 97}, {FixedWindow, 90}, {SlidingWindow, 90}, {SlidingLog, 90}} {
			t.Run(target.name+"/"+tc.algo.String(), func(t *testing.T) {
				s, _ := target.new(t)
				p := meteredPolicy("tokens", tc.algo)
				items := []Item{{Policy: p, Tenant: "t", Cost: 10}}
				var d Decision
				if err := d.Decide(bgCtx, s, items); err != nil || !d.Admitted {
					t.Fatal(d.Admitted, err)
				}
				if err := d.Settle(bgCtx, Fallback{}, []int64{3}); err != nil {
					t.Fatal(err)
				}
				c := Check{Algorithm: tc.algo, Tenant: "t", Policy: "tokens", Rate: p.Limit.Rate}
				if r := mustPeek(t, s, c); r[0].Remaining != tc.want {
					t.Errorf("remaining %d, want %d", r[0].Remaining, tc.want)
				}
			})
		}
	}
}

// TestSettleOnlyMetered: of two policies, only the one with a real cost
// is settled; a NotMetered item keeps its up-front charge, and a shadow
// item that allowed is settled like an enforced one.
func TestSettleOnlyMetered(t *testing.T) {
	for _, target := range conformanceTargets(t) {
		t.Run(target.name, func(t *testing.T) {
			s, _ := target.new(t)
			reqs := meteredPolicy("requests", FixedWindow)
			toks := meteredPolicy("tokens", TokenBucket)
			shadow := &Policy{Name: "shadow", Algorithm: TokenBucket, Limit: Limit{Rate: Rate{Limit: 1000, Window: time.Minute}, Shadow: true}}
			items := []Item{{Policy: reqs, Tenant: "t", Cost: 1}, {Policy: toks, Tenant: "t", Cost: 1}, {Policy: shadow, Tenant: "t", Cost: 1}}
			var d Decision
			for range 2 {
				if err := d.Decide(bgCtx, s, items); err != nil || !d.Admitted {
					t.Fatal(d.Admitted, err)
				}
				if err := d.Settle(bgCtx, Fallback{}, []int64{NotMetered, 40, 40}); err != nil {
					t.Fatal(err)
				}
			}
			peek := mustPeek(t, s,
				Check{Algorithm: FixedWindow, Tenant: "t", Policy: "requests", Rate: reqs.Limit.Rate},
				Check{Algorithm: TokenBucket, Tenant: "t", Policy: "tokens", Rate: toks.Limit.Rate},
				Check{Algorithm: TokenBucket, Tenant: "t", Policy: "shadow", Rate: shadow.Limit.Rate})
			if peek[0].Remaining != 98 || peek[1].Remaining != 20 || peek[2].Remaining != 920 {
				t.Errorf("remaining %d/%d/%d, want 98 requests, 20 tokens, 920 shadow tokens", peek[0].Remaining, peek[1].Remaining, peek[2].Remaining)
			}
			// A request that was denied is never settled.
			if err := d.Decide(bgCtx, s, []Item{{Policy: toks, Tenant: "t", Cost: 50}}); err != nil || d.Admitted {
				t.Fatal(d.Admitted, err)
			}
			if err := d.Settle(bgCtx, Fallback{}, []int64{1000}); err != nil {
				t.Fatal(err)
			}
			if r := mustPeek(t, s, Check{Algorithm: TokenBucket, Tenant: "t", Policy: "tokens", Rate: toks.Limit.Rate}); r[0].Remaining != 20 {
				t.Errorf("after a denied request's settle: remaining %d, want 20", r[0].Remaining)
			}
		})
	}
}

// TestSettleDebtBounded: a real cost far beyond anything (clamped to
// MaxCount) leaves a bounded debt: a token bucket pays it back within
// MaxWindow plus its own refill, a window at its end; Redis keys keep a
// finite TTL.
func TestSettleDebtBounded(t *testing.T) {
	for _, target := range conformanceTargets(t) {
		for _, algo := range []Algorithm{TokenBucket, GCRA, FixedWindow, SlidingWindow, SlidingLog} {
			// 100 a minute, and 10 million a second (an interval below
			// a microsecond, which Redis rounds up for GCRA).
			for _, rate := range []Rate{{Limit: 100, Window: time.Minute}, {Limit: 10_000_000, Window: time.Second}} {
				t.Run(fmt.Sprintf("%s/%s/%d", target.name, algo, rate.Limit), func(t *testing.T) {
					s, _ := target.new(t)
					p := &Policy{Name: "tokens", Algorithm: algo, Limit: Limit{Rate: rate}}
					items := []Item{{Policy: p, Tenant: "t", Cost: 1}}
					var d Decision
					if err := d.Decide(bgCtx, s, items); err != nil || !d.Admitted {
						t.Fatal(d.Admitted, err)
					}
					if err := d.Settle(bgCtx, Fallback{}, []int64{1 << 62}); err != nil {
						t.Fatal(err)
					}
					if err := d.Decide(bgCtx, s, items); err != nil || d.Admitted {
						t.Fatalf("after a huge cost: admitted %v, %v", d.Admitted, err)
					}
					r := d.Verdicts[0].Result
					limit := MaxWindow + rate.Window + time.Second
					if r.Remaining != 0 || r.RetryAfter <= 0 || r.RetryAfter > limit {
						t.Errorf("%+v: want remaining 0 and a retry within %s", r, limit)
					}
				})
			}
		}
	}
}

// TestSettleKeysExpire: on Redis, the key a settlement leaves in debt
// expires when the debt is paid back, at most MaxWindow away, and keeps a
// sliding log's min_interval.
func TestSettleKeysExpire(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	s := NewRedisStore(RedisOptions{Client: client, Prefix: "ttl", Timeout: 5 * time.Second})
	for _, tc := range []struct {
		algo        Algorithm
		rate        Rate
		real        int64
		least, most time.Duration
	}{
		{GCRA, Rate{Limit: 10_000_000, Window: time.Second}, 1 << 62, MaxWindow - time.Hour, MaxWindow + time.Hour},
		{TokenBucket, Rate{Limit: 10_000_000, Window: time.Second}, 1 << 62, MaxWindow - time.Hour, MaxWindow + time.Hour},
		{SlidingLog, Rate{Limit: 100, Window: time.Second, MinInterval: 10 * time.Second}, 5, 9 * time.Second, 11 * time.Second},
	} {
		p := &Policy{Name: "p", Algorithm: tc.algo, Limit: Limit{Rate: tc.rate}}
		var d Decision
		if err := d.Decide(bgCtx, s, []Item{{Policy: p, Tenant: "ttl-" + tc.algo.String(), Cost: 1}}); err != nil || !d.Admitted {
			t.Fatal(d.Admitted, err)
		}
		if err := d.Settle(bgCtx, Fallback{}, []int64{tc.real}); err != nil {
			t.Fatal(err)
		}
		key := string(AppendKey(nil, "ttl", tc.algo, "ttl-"+tc.algo.String(), "p", ""))
		ttl, err := client.PTTL(bgCtx, key).Result()
		if err != nil || ttl < tc.least || ttl > tc.most {
			t.Errorf("%s: key %s TTL %s (%v), want %s to %s", tc.algo, key, ttl, err, tc.least, tc.most)
		}
	}
}

// TestSettleKeepsMinInterval: a settlement does not lose a sliding log's
// min_interval: the next request still waits for it.
func TestSettleKeepsMinInterval(t *testing.T) {
	m, clk := newTestStore(t, MemoryOptions{})
	p := &Policy{Name: "p", Algorithm: SlidingLog, Limit: Limit{Rate: Rate{Limit: 100, Window: time.Second, MinInterval: 10 * time.Second}}}
	items := []Item{{Policy: p, Tenant: "t", Cost: 1}}
	var d Decision
	if err := d.Decide(bgCtx, m, items); err != nil || !d.Admitted {
		t.Fatal(d.Admitted, err)
	}
	if err := d.Settle(bgCtx, Fallback{}, []int64{5}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Second)
	if err := d.Decide(bgCtx, m, items); err != nil || d.Admitted {
		t.Errorf("2s after a settled request: admitted %v (%v), want min_interval (10s) to deny", d.Admitted, err)
	}
}

// TestSettleAfterRelease: Settle after Release is an error, not a panic.
func TestSettleAfterRelease(t *testing.T) {
	m, _ := newTestStore(t, MemoryOptions{})
	tok := meteredPolicy("tokens", TokenBucket)
	conc := &Policy{Name: "c", Algorithm: Concurrency, Limit: Limit{Rate: Rate{Limit: 5}}}
	var d Decision
	if err := d.Decide(bgCtx, m, []Item{{Policy: tok, Tenant: "t", Cost: 1}, {Policy: conc, Tenant: "t", Cost: 1}}); err != nil || !d.Admitted {
		t.Fatal(d.Admitted, err)
	}
	if err := d.Release(bgCtx, Fallback{}); err != nil {
		t.Fatal(err)
	}
	if err := d.Settle(bgCtx, Fallback{}, []int64{30, NotMetered}); err == nil {
		t.Error("Settle after Release: no error")
	}
}

// TestSettleFallback: a request the fallback decided is settled on the
// fallback store and its extra units recorded; a settle the primary store
// fails goes to the fallback store too.
func TestSettleFallback(t *testing.T) {
	fbStore, _ := newTestStore(t, MemoryOptions{})
	rec := NewRecorder(RecorderOptions{})
	fb := Fallback{Store: fbStore, Scale: 1, Recorder: rec}
	p := meteredPolicy("tokens", TokenBucket)
	items := []Item{{Policy: p, Tenant: "t", Cost: 1}}
	var d Decision
	if err := d.DecideOrFallback(bgCtx, brokenStore{}, fb, items); !errors.Is(err, errUnreachable) || !d.Admitted {
		t.Fatal(d.Admitted, err)
	}
	if err := d.Settle(bgCtx, fb, []int64{30}); err != nil {
		t.Fatalf("settle on the fallback store: %v", err)
	}
	c := Check{Algorithm: TokenBucket, Tenant: "t", Policy: "tokens", Rate: p.Limit.Rate}
	if r := mustPeek(t, fbStore, c); r[0].Remaining != 70 {
		t.Errorf("fallback bucket: remaining %d, want 70", r[0].Remaining)
	}
	// 1 unit for the admission and 29 for the settlement are recorded.
	charger := &chargeCounter{}
	if _, err := rec.Flush(bgCtx, charger); err != nil {
		t.Fatal(err)
	}
	if charger.units != 30 {
		t.Errorf("recorded %d units, want 30", charger.units)
	}

	// Decided by the primary store, settled when it has gone away.
	m, _ := newTestStore(t, MemoryOptions{})
	if err := d.Decide(bgCtx, m, items); err != nil || !d.Admitted {
		t.Fatal(d.Admitted, err)
	}
	d.decidedBy = failingCharger{m}
	if err := d.Settle(bgCtx, fb, []int64{11}); !errors.Is(err, errUnreachable) {
		t.Fatalf("settle with the primary gone: %v, want its error", err)
	}
	if r := mustPeek(t, fbStore, c); r[0].Remaining != 60 {
		t.Errorf("fallback bucket after the primary failed: remaining %d, want 60", r[0].Remaining)
	}
	charger.units = 0
	if _, err := rec.Flush(bgCtx, charger); err != nil || charger.units != 10 {
		t.Errorf("recorded %d units (%v), want 10", charger.units, err)
	}
}

// chargeCounter is a Charger that adds up what it is charged.
type chargeCounter struct {
	brokenStore
	units int64
}

func (c *chargeCounter) Charge(_ context.Context, _ string, checks []Check, charged []int64) error {
	for i := range checks {
		c.units += checks[i].Cost
		charged[i] = checks[i].Cost
	}
	return nil
}

// failingCharger is a store whose charges fail.
type failingCharger struct{ *MemoryStore }

func (failingCharger) Charge(context.Context, string, []Check, []int64) error { return errUnreachable }

// TestSettleLease: a settlement is paid from leased units first, so the
// shared bucket ends exactly where strict decisions would leave it, and
// the lease stops serving once it is used up by the debt.
func TestSettleLease(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	f := newLeaseFixture(t, srv, true, 1)
	p := &Policy{Name: "p", Algorithm: TokenBucket, Lease: Lease{Max: 20, TTL: time.Hour},
		Limit: Limit{Rate: Rate{Limit: 100, Window: time.Hour}}}
	items := []Item{{Policy: p, Tenant: "lease-settle", Cost: 1}}
	var d Decision
	admitted := 0
	for i := range 10 {
		if err := d.Decide(bgCtx, f.lease, items); err != nil {
			t.Fatal(err)
		}
		if !d.Admitted {
			break
		}
		admitted++
		if err := d.Settle(bgCtx, Fallback{}, []int64{30}); err != nil {
			t.Fatalf("settle %d: %v", i, err)
		}
	}
	if admitted != 4 {
		t.Errorf("%d requests admitted, want 4 (100 tokens, 30 each)", admitted)
	}
	if err := f.lease.Close(); err != nil {
		t.Fatal(err)
	}
	// Everything leased was given back or spent: the shared bucket holds
	// the debt of 4 x 30 - 100 = 20 tokens.
	c := Check{Algorithm: TokenBucket, Tenant: "lease-settle", Policy: "p", Rate: p.Limit.Rate}
	res := mustPeek(t, f.redis, c)
	if want := 21 * 36 * time.Second; res[0].Remaining != 0 || res[0].Reset < want-time.Second || res[0].Reset > want {
		t.Errorf("shared bucket %+v, want 0 remaining and the 21st token in %s", res[0], want)
	}
}

// TestSettlePaidFromLease: a settlement the lease covers takes leased
// units and makes no Redis call; the shared bucket ends exactly where
// strict decisions would leave it.
func TestSettlePaidFromLease(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	f := newLeaseFixture(t, srv, true, 1)
	p := &Policy{Name: "p", Algorithm: TokenBucket, Lease: Lease{Max: 20, TTL: time.Hour},
		Limit: Limit{Rate: Rate{Limit: 1000, Window: time.Hour}}}
	items := []Item{{Policy: p, Tenant: "paid-from-lease", Cost: 1}}
	var d Decision
	for range 12 {
		// Real cost 1: nothing to settle; the lease grows with demand.
		if err := d.Decide(bgCtx, f.lease, items); err != nil || !d.Admitted {
			t.Fatal(d.Admitted, err)
		}
	}
	if err := d.Settle(bgCtx, Fallback{}, []int64{4}); err != nil {
		t.Fatal(err)
	}
	if n := f.calls.get("force"); n != 0 {
		t.Errorf("%d forced charges: want the 3 extra units taken from the lease", n)
	}
	if err := f.lease.Close(); err != nil {
		t.Fatal(err)
	}
	c := Check{Algorithm: TokenBucket, Tenant: "paid-from-lease", Policy: "p", Rate: p.Limit.Rate}
	if r := mustPeek(t, f.redis, c); r[0].Remaining != 1000-12-3 {
		t.Errorf("shared bucket: remaining %d, want %d (12 requests, 3 settled)", r[0].Remaining, 1000-12-3)
	}
}

// TestSettleDebtDelays: a bucket in debt makes a request wait for its
// turn when the turn comes within the policy's delay, and denies it
// otherwise.
func TestSettleDebtDelays(t *testing.T) {
	for _, tc := range []struct {
		delay time.Duration
		wait  time.Duration // 0: denied
	}{{10 * time.Second, 0}, {15 * time.Second, 12600 * msec}} {
		m, _ := newTestStore(t, MemoryOptions{})
		p := &Policy{Name: "tokens", Algorithm: TokenBucket, Limit: Limit{Rate: Rate{Limit: 100, Window: time.Minute, Delay: tc.delay}}}
		items := []Item{{Policy: p, Tenant: "t", Cost: 1}}
		var d Decision
		for range 4 {
			if err := d.Decide(bgCtx, m, items); err != nil || !d.Admitted || d.Wait() != 0 {
				t.Fatal(d.Admitted, d.Wait(), err)
			}
			if err := d.Settle(bgCtx, Fallback{}, []int64{30}); err != nil {
				t.Fatal(err)
			}
		}
		// 20 tokens of debt: the next token is 21 tokens away, 12.6s.
		if err := d.Decide(bgCtx, m, items); err != nil {
			t.Fatal(err)
		}
		if got := d.Wait(); d.Admitted != (tc.wait > 0) || got != tc.wait {
			t.Errorf("delay %s: admitted %v, wait %s; want wait %s (0: denied)", tc.delay, d.Admitted, got, tc.wait)
		}
	}
}

// idCharger is a store whose charges fail with err, recording their ids.
type idCharger struct {
	*MemoryStore
	err error
	ids []string
}

func (c *idCharger) Charge(_ context.Context, id string, _ []Check, _ []int64) error {
	c.ids = append(c.ids, id)
	return c.err
}

// TestSettleRetriesWithItsID: a settlement whose call fails and may have
// run (a timeout) is kept with the id it was sent with, and recovery sends
// it again with that id, into debt; one the breaker refused (never sent)
// is recorded as units and charged under a new id. Both are settled on the
// fallback store meanwhile.
func TestSettleRetriesWithItsID(t *testing.T) {
	for _, c := range []struct {
		name    string
		err     error
		sameID  bool
		pending int
	}{
		{"timeout", fmt.Errorf("limiter: redis force: %w", context.DeadlineExceeded), true, 1},
		{"breaker open", ErrBreakerOpen, false, 1},
		{"queue shed", fmt.Errorf("limiter: redis force: %w", ErrQueueTimeout), false, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			fbStore, _ := newTestStore(t, MemoryOptions{})
			rec := NewRecorder(RecorderOptions{})
			fb := Fallback{Store: fbStore, Scale: 1, Recorder: rec}
			p := meteredPolicy("tokens", TokenBucket)
			m, _ := newTestStore(t, MemoryOptions{})
			var d Decision
			if err := d.Decide(bgCtx, m, []Item{{Policy: p, Tenant: "t", Cost: 1}}); err != nil || !d.Admitted {
				t.Fatal(d.Admitted, err)
			}
			primary := &idCharger{MemoryStore: m, err: c.err}
			d.decidedBy = primary
			if err := d.Settle(bgCtx, fb, []int64{250}); !errors.Is(err, c.err) {
				t.Fatalf("settle: %v, want %v", err, c.err)
			}
			if rec.Pending() != c.pending {
				t.Fatalf("Pending %d, want %d", rec.Pending(), c.pending)
			}
			chk := Check{Algorithm: TokenBucket, Tenant: "t", Policy: "tokens", Rate: p.Limit.Rate}
			if r := mustPeek(t, fbStore, chk); r[0].Remaining != 0 {
				t.Errorf("fallback bucket: remaining %d, want 0 (settled there too)", r[0].Remaining)
			}
			var sent []Check
			var ids []string
			if _, err := rec.Flush(bgCtx, chargeFunc(func(id string, checks []Check, charged []int64) error {
				ids = append(ids, id)
				sent = append(sent, checks...)
				return nil
			})); err != nil {
				t.Fatal(err)
			}
			want := Check{Algorithm: TokenBucket, Tenant: "t", Policy: "tokens", Rate: debtRate(TokenBucket, p.Limit.Rate), Cost: 249}
			if len(sent) != 1 || sent[0] != want {
				t.Fatalf("recovery sent %+v, want %+v", sent, want)
			}
			if same := ids[0] == primary.ids[0]; same != c.sameID || ids[0] == "" {
				t.Fatalf("recovery id %q, first attempt's %q: same %v, want %v", ids[0], primary.ids[0], same, c.sameID)
			}
		})
	}
}

// TestSettleFallbackKeepsWindowUnits: a lower real cost of a request the
// fallback decided is taken off what recovery charges only where it is
// given back (token bucket, GCRA): a window keeps its up-front units, on
// the fallback store and in what Redis is charged.
func TestSettleFallbackKeepsWindowUnits(t *testing.T) {
	for _, c := range []struct {
		algo Algorithm
		want int64
	}{{FixedWindow, 10}, {TokenBucket, 2}} {
		t.Run(c.algo.String(), func(t *testing.T) {
			fbStore, _ := newTestStore(t, MemoryOptions{})
			rec := NewRecorder(RecorderOptions{})
			fb := Fallback{Store: fbStore, Scale: 1, Recorder: rec}
			p := meteredPolicy("tokens", c.algo)
			var d Decision
			if err := d.DecideOrFallback(bgCtx, brokenStore{}, fb, []Item{{Policy: p, Tenant: "t", Cost: 10}}); !errors.Is(err, errUnreachable) || !d.Admitted {
				t.Fatal(d.Admitted, err)
			}
			if err := d.Settle(bgCtx, fb, []int64{2}); err != nil {
				t.Fatal(err)
			}
			var charged int64
			if _, err := rec.Flush(bgCtx, chargeFunc(func(_ string, checks []Check, _ []int64) error {
				for _, ch := range checks {
					charged += ch.Cost
				}
				return nil
			})); err != nil {
				t.Fatal(err)
			}
			if charged != c.want {
				t.Fatalf("recovery charged %d, want %d", charged, c.want)
			}
		})
	}
}

// flushTotal flushes rec into a store that answers every call, and
// returns the units the calls moved (charges positive, give-backs
// negative).
func flushTotal(t *testing.T, rec *Recorder) int64 {
	t.Helper()
	var moved int64
	if _, err := rec.Flush(bgCtx, chargeFunc(func(_ string, checks []Check, charged []int64) error {
		for i, c := range checks {
			moved += c.Cost
			charged[i] = c.Cost
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	return moved
}

// TestSettleNotSentGivesBackOnce: a request Redis decided settles with a
// lower real cost while the breaker is open, beside another request of
// the bucket that the fallback decided and recorded. The give-back goes
// to Redis once, as a call, and does not also come off the other
// request's recorded units. (It did both: Redis ended up 900 units
// short.)
func TestSettleNotSentGivesBackOnce(t *testing.T) {
	fbStore, _ := newTestStore(t, MemoryOptions{})
	rec := NewRecorder(RecorderOptions{})
	fb := Fallback{Store: fbStore, Scale: 1, Recorder: rec}
	p := &Policy{Name: "tokens", Algorithm: TokenBucket, FailMode: FailLocal, Limit: Limit{Rate: Rate{Limit: 100000, Window: time.Minute}}}
	m, _ := newTestStore(t, MemoryOptions{})
	var a, b Decision
	if err := a.Decide(bgCtx, m, []Item{{Policy: p, Tenant: "t", Cost: 1000}}); err != nil || !a.Admitted {
		t.Fatal(a.Admitted, err)
	}
	if err := b.DecideOrFallback(bgCtx, brokenStore{}, fb, []Item{{Policy: p, Tenant: "t", Cost: 1000}}); !errors.Is(err, errUnreachable) || !b.Admitted {
		t.Fatal(b.Admitted, err)
	}
	a.decidedBy = &idCharger{MemoryStore: m, err: ErrBreakerOpen}
	if err := a.Settle(bgCtx, fb, []int64{100}); !errors.Is(err, ErrBreakerOpen) {
		t.Fatal(err)
	}
	// Redis holds A's 1000: it gets B's 1000 and A's 900 back, once.
	if got := flushTotal(t, rec); got != 100 {
		t.Fatalf("recovery moved %d units, want +100 (B's 1000, less the 900 A gives back)", got)
	}
}

// TestSettleFallbackAfterFlush: a request the fallback decided during an
// outage settles with a lower real cost after its up-front units were
// sent to Redis (Redis answered meanwhile): the difference goes back to
// Redis, under an id. (It was taken off the recorded units only, which
// were gone: Redis kept 1000 for a request that cost 100.)
func TestSettleFallbackAfterFlush(t *testing.T) {
	fbStore, _ := newTestStore(t, MemoryOptions{})
	rec := NewRecorder(RecorderOptions{})
	fb := Fallback{Store: fbStore, Scale: 1, Recorder: rec}
	p := &Policy{Name: "tokens", Algorithm: TokenBucket, FailMode: FailLocal, Limit: Limit{Rate: Rate{Limit: 100000, Window: time.Minute}}}
	var d Decision
	if err := d.DecideOrFallback(bgCtx, brokenStore{}, fb, []Item{{Policy: p, Tenant: "t", Cost: 1000}}); !errors.Is(err, errUnreachable) || !d.Admitted {
		t.Fatal(d.Admitted, err)
	}
	moved := flushTotal(t, rec)
	if err := d.Settle(bgCtx, fb, []int64{100}); err != nil {
		t.Fatal(err)
	}
	moved += flushTotal(t, rec)
	if moved != 100 {
		t.Fatalf("Redis was moved %d units in all, want 100 (the real cost)", moved)
	}
	// Recorded units still there are taken off instead: no call.
	var e Decision
	if err := e.DecideOrFallback(bgCtx, brokenStore{}, fb, []Item{{Policy: p, Tenant: "t", Cost: 1000}}); !errors.Is(err, errUnreachable) || !e.Admitted {
		t.Fatal(e.Admitted, err)
	}
	if err := e.Settle(bgCtx, fb, []int64{300}); err != nil {
		t.Fatal(err)
	}
	if got := flushTotal(t, rec); got != 300 {
		t.Fatalf("recovery moved %d units, want 300", got)
	}
}
