package limiter

import (
	"context"
	"errors"
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

// givesBack reports whether units charged to a bucket of algorithm a can
// be given back by a charge of negative cost without its instant
// (Charger): see Algorithm.Refills.
func givesBack(a Algorithm) bool { return a.Refills() }

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
// buckets (a Charge of negative costs) and its concurrency slots are
// released. Other algorithms keep their charge, as for any admitted
// request. Call it at most once, instead of Release; it is a no-op when
// nothing was admitted.
//
// The give-back carries an id (NewChargeID): when the store fails, it is
// kept by fb.Recorder and sent again until the store answers, so the
// units go back once. A request the fallback decided gives its units back
// there, and they are taken off what fb.Recorder holds for the primary
// store.
func (d *Decision) Cancel(ctx context.Context, fb Fallback) error {
	if !d.Admitted || d.decidedBy == nil {
		return nil
	}
	// Charged: every non-shadow check, and shadow ones that allowed; only
	// token bucket and GCRA units go back (see above).
	err := d.giveBack(ctx, fb, func(j, _ int) bool { return givesBack(d.checks[j].Algorithm) })
	return errors.Join(err, d.Release(ctx, fb))
}
