package limiter

import (
	"context"
	"errors"
	"hash/maphash"
	"time"
)

// Waiting for a turn (Rate.Delay). A token bucket or GCRA bucket knows
// when each unit comes back, so instead of denying a request it can hand
// it a turn: the request is charged at once, taking units the bucket does
// not hold yet (a token bucket goes into debt, down to Limit/Window x
// Delay tokens below empty; a GCRA bucket's TAT moves up to Delay past
// now + tolerance), and its Result says how long to Wait before it
// passes. The turn is the instant the bucket would have admitted the
// request: exactly its RetryAfter as a denial. Turns are handed out in the
// order of the decisions, so requests that wait pass in that order, one
// unit time apart once the burst is spent; as the charge is taken at the
// decision, the bucket never admits more than it would have had every
// request come back at its turn. A request whose turn is further than
// Delay away is denied as it would be without Delay, RetryAfter its turn.
//
// A request that gives its turn back (its client went away) is refunded
// (Refunder): its units return to the bucket. Those already waiting keep
// their turns; the next request takes the units given back.

// reserveTurn turns the denial res of a request of cost units (next being
// the algorithm's state for that denial) into an admission with a
// reserved turn, when that turn comes within r.Delay; otherwise it returns
// res and next unchanged. s is the bucket's state before the request.
func reserveTurn(a Algorithm, s bucketState, now int64, r Rate, cost int64, res Result, next bucketState) (Result, bucketState) {
	if res.Allowed || r.Delay <= 0 || cost > r.Capacity() || res.RetryAfter > r.Delay {
		return res, next
	}
	var turn bucketState
	switch a {
	case TokenBucket:
		// The denial's state is the bucket refilled up to now: take the
		// cost from it, beyond empty.
		turn = bucketState{At: next.At, F: next.F + float64(cost)}
	case GCRA:
		// The state the request leaves at its turn: TAT moves by the
		// cost from where it stands now.
		at, t := gcra(s, satAdd(now, int64(res.RetryAfter)), r, cost)
		if !at.Allowed {
			return res, next // a tolerance capped at maxTolerance
		}
		turn = t
	default:
		return res, next
	}
	out, _ := evalAlgorithm(a, turn, nil, now, r, 0)
	out.Wait = res.RetryAfter
	return out, turn
}

// refundUnits gives cost units back to a token bucket or GCRA bucket in
// state s (unchanged for other algorithms); the mirror of refund in
// lua/token_bucket.lua and lua/gcra.lua.
func refundUnits(a Algorithm, s bucketState, r Rate, cost int64) bucketState {
	switch a {
	case TokenBucket:
		s.F = max(s.F-float64(cost), 0)
	case GCRA:
		s.At -= satMul(cost, gcraInterval(r))
	}
	return s
}

// Refunder is a Store that can give back what an admitted Decide charged
// a request that then did not pass: a request that waited for its turn
// and whose client went away.
type Refunder interface {
	// Refund gives Cost units back to each TokenBucket and GCRA check of
	// checks (other algorithms are ignored), never beyond a full bucket. A
	// bucket that expired or was reset meanwhile has nothing to give back.
	// Pass only checks that were charged.
	Refund(ctx context.Context, checks []Check) error
}

var (
	_ Refunder = (*MemoryStore)(nil)
	_ Refunder = (*RedisStore)(nil)
	_ Refunder = (*BreakerStore)(nil)
	_ Refunder = (*LeaseStore)(nil)
)

// refundable reports whether Refund gives c back.
func refundable(c *Check) bool {
	return c.Cost > 0 && (c.Algorithm == TokenBucket || c.Algorithm == GCRA)
}

// Refund implements Refunder.
func (m *MemoryStore) Refund(_ context.Context, checks []Check) error {
	for i := range checks {
		if err := checks[i].validate(); err != nil {
			return err
		}
	}
	sc := m.pool.Get().(*memScratch)
	defer m.pool.Put(sc)
	for i := range checks {
		c := &checks[i]
		if !refundable(c) {
			continue
		}
		sc.key = AppendKey(sc.key[:0], m.prefix, c.Algorithm, c.Tenant, c.Policy, c.Part)
		sh := &m.shards[maphash.Bytes(m.seed, sc.key)&m.mask]
		sh.mu.Lock()
		if e := sh.m[string(sc.key)]; e != nil && m.now() < e.expires {
			e.s = refundUnits(c.Algorithm, e.s, c.Rate, c.Cost)
			e.expires = expiresAt(c.Algorithm, e.s, nil, c.Rate)
		}
		sh.mu.Unlock()
	}
	return nil
}

// Refund implements Refunder. While the breaker is open it fails with
// ErrBreakerOpen, and the units stay charged until the bucket refills.
func (b *BreakerStore) Refund(ctx context.Context, checks []Check) error {
	rf, ok := b.inner.(Refunder)
	if !ok {
		return nil
	}
	t, err := b.before()
	if err != nil {
		return err
	}
	err = rf.Refund(ctx, checks)
	b.after(ctx, t, err)
	return err
}

// Refund implements Refunder: reservations are never served from a
// lease, so what a request was charged goes back to the inner store.
func (s *LeaseStore) Refund(ctx context.Context, checks []Check) error {
	if rf, ok := s.inner.(Refunder); ok {
		return rf.Refund(ctx, checks)
	}
	return nil
}

// Wait is how long an admitted request waits for its turn before it
// passes: the longest Wait of its enforced verdicts. 0 when it passes at
// once or was not admitted. Shadow verdicts never make a request wait.
func (d *Decision) Wait() time.Duration {
	if !d.Admitted {
		return 0
	}
	var w time.Duration
	for i := range d.Verdicts {
		if v := &d.Verdicts[i]; v.Enforced() && v.Result.Wait > w {
			w = v.Result.Wait
		}
	}
	return w
}

// Cancel gives back what an admitted decision holds, for a request that
// will not pass after all (its client went away while it waited for its
// turn): the units of its token_bucket and gcra checks go back to their
// buckets (see Refunder) and its concurrency slots are released. Other
// algorithms keep their charge, as for any admitted request. Call it at
// most once, instead of Release; it is a no-op when nothing was admitted.
func (d *Decision) Cancel(ctx context.Context) error {
	if !d.Admitted || d.decidedBy == nil {
		return nil
	}
	var refund []Check
	for j := range d.checks {
		// Charged: every non-shadow check, and shadow ones that allowed.
		if c := &d.checks[j]; refundable(c) && d.results[j].Allowed {
			refund = append(refund, *c)
		}
	}
	var err error
	if rf, ok := d.decidedBy.(Refunder); ok && len(refund) > 0 {
		err = rf.Refund(ctx, refund)
	}
	return errors.Join(err, d.Release(ctx))
}
