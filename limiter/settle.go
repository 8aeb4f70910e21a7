package limiter

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"time"
)

// Metered costs. Some requests cost what their response says: LLM tokens,
// credits, bytes. Such a request is decided with an up-front cost (the
// Check's Cost), and once its response is complete Decision.Settle charges
// the difference between its real cost and the up-front cost to the same
// buckets: more units when it cost more, units given back when it cost
// less.
//
// A settlement never refuses: it may drive a bucket below empty, into
// debt. A bucket in debt reports Remaining 0 and denies (or, with a delay,
// makes wait) every request until its refill or the next window has paid
// the debt back. The debt is bounded so that arithmetic stays exact and
// every key keeps a finite TTL: a token bucket or GCRA bucket owes at most
// what it refills in MaxWindow (and never more than MaxCount units), a
// window or log counts at most MaxCount units.
//
// What is given back: token bucket and GCRA units, whenever (their units
// mean the same whenever they were charged, as for Refunder). Window and
// log algorithms keep the up-front units: they belong to the instant or
// window of the admission, which the settlement does not know.

// NotMetered is the real cost of an item that Decision.Settle leaves alone.
const NotMetered int64 = -1

// noDelta marks a check that a settlement leaves alone.
const noDelta = -1 << 63

// debtRate returns r with room for the debt a settlement may leave (see
// above): a settlement is a forced charge (Charger) against this rate, and
// a forced charge drives a bucket at most down to its empty (ignoring
// min_interval, which still sets the TTL). Only the capacity changes,
// never the refill rate or the window, so the bucket's state and TTL mean
// the same under both rates.
func debtRate(a Algorithm, r Rate) Rate {
	r.Delay = 0
	switch a {
	case TokenBucket:
		r.Burst = min(MaxCount, r.Capacity()+debtUnits(r, int64(r.Window)/r.Limit))
	case GCRA:
		// Redis counts GCRA's interval in whole microseconds: a debt
		// sized by that interval is repaid within MaxWindow there too.
		us := int64(time.Microsecond)
		r.Burst = min(MaxCount, r.Capacity()+debtUnits(r, (gcraInterval(r)+us-1)/us*us))
	default:
		r.Limit = MaxCount
	}
	return r
}

// debtUnits is how many units a bucket of r refills in MaxWindow, one per
// interval ns (at most MaxCount).
func debtUnits(r Rate, interval int64) int64 {
	if interval <= 0 {
		return MaxCount
	}
	return min(int64(MaxWindow)/interval, MaxCount)
}

// Settle charges the real costs of an admitted request whose response is
// complete: real[i] is the real cost of Verdicts[i], or NotMetered (any
// negative value) for an item that is not metered. Each metered item that
// was charged is charged real[i] minus its up-front cost more (see
// debtRate), or given the difference back; a real cost above MaxCount
// counts as MaxCount. Unlimited, failed-open and concurrency items are
// left alone. Call it before Release, at most once.
//
// The settlement goes to the store that decided the request, as one
// Charge call with an id of its own (NewChargeID), so that it lands once.
// When that store fails, the settlement is made on fb.Store with the rate
// scaled as the fallback decides (so this instance holds the tenant to
// it meanwhile), and fb.Recorder keeps it for the primary store: a call
// that may have run (a timeout, a broken connection) is kept with its id
// and sent again until the store answers it (Recorder.Retry); one that
// never left (the breaker was open) is recorded as units (Record).
// Either way it is charged into debt once the store is back, never twice;
// the primary store's error is returned. A request the fallback decided is
// settled there and recorded the same way.
func (d *Decision) Settle(ctx context.Context, fb Fallback, real []int64) error {
	if !d.Admitted || d.decidedBy == nil {
		return nil
	}
	if len(d.checks) != len(d.counted) {
		return errSettleAfterRelease
	}
	d.settleDeltas = d.settleDeltas[:0]
	metered := false
	for j, i := range d.counted {
		delta := int64(noDelta)
		c := &d.checks[j]
		if i < len(real) && real[i] >= 0 && d.results[j].Allowed && c.Algorithm != Concurrency {
			delta = min(real[i], MaxCount) - min(c.Cost, MaxCount)
			metered = metered || delta != 0
		}
		d.settleDeltas = append(d.settleDeltas, delta)
	}
	if !metered {
		return nil
	}
	if fb.Store != nil && d.decidedBy == fb.Store {
		d.recordDebt(fb, true)
		return settleOn(ctx, fb.Store, "", d.checks, d.settleDeltas)
	}
	id := NewChargeID()
	// settleOn zeroes the deltas it settled: what is left failed.
	err := settleOn(ctx, d.decidedBy, id, d.checks, d.settleDeltas)
	if err == nil || errors.Is(err, ErrInvalidCheck) || fb.Store == nil {
		return err
	}
	if fb.Recorder != nil {
		if NotSent(err) {
			// Never ran: what it charges is units used; what it gives
			// back was charged by the store, not recorded, so it stays a
			// call.
			d.recordDebt(fb, false)
			d.retrySettle(fb.Recorder, id, false)
		} else {
			d.retrySettle(fb.Recorder, id, true)
		}
	}
	local := append(d.settleChecks[:0], d.checks...)
	for k := range local {
		local[k].Rate = local[k].Rate.scaled(fb.Scale)
	}
	d.settleChecks = local
	ferr := settleOn(ctx, fb.Store, "", local, d.settleDeltas)
	if ferr != nil {
		return fmt.Errorf("%w (and the fallback store failed: %v)", err, ferr)
	}
	return err
}

// errSettleAfterRelease: Release compacted the checks Settle needs.
var errSettleAfterRelease = errors.New("limiter: Settle called after Release")

// recordDebt records the deltas a settlement has left to make with the
// items' unscaled rates, for the primary store (Recorder.Record): more
// units, and with takeBack (a request the fallback decided, whose
// up-front units the Recorder holds) units given back to token buckets
// and GCRA buckets (window algorithms keep the up-front units, see
// Settle). What the Recorder no longer holds to take back was sent to the
// primary store by a Flush since: that part goes back to the store, as a
// call with an id of its own (Recorder.Retry).
func (d *Decision) recordDebt(fb Fallback, takeBack bool) {
	if fb.Recorder == nil {
		return
	}
	var sent []Check
	for j, i := range d.counted {
		delta, c, rate := d.settleDeltas[j], &d.checks[j], d.Verdicts[i].Limit.Rate
		switch {
		case delta > 0:
			fb.Recorder.Record(c, rate, delta)
		case takeBack && delta < 0 && delta != noDelta && givesBack(c.Algorithm):
			if left := fb.Recorder.Record(c, rate, delta); left < 0 {
				g := *c
				g.Rate, g.Cost, g.Shadow = rate, left, false
				sent = append(sent, g)
			}
		}
	}
	if len(sent) > 0 {
		fb.Recorder.Retry(NewChargeID(), sent)
	}
}

// retrySettle hands the deltas a settlement has left to make, under its
// id, to rec (Recorder.Retry); with charges false, only what it gives back.
func (d *Decision) retrySettle(rec *Recorder, id string, charges bool) {
	checks := make([]Check, 0, len(d.checks))
	for j, i := range d.counted {
		if delta := d.settleDeltas[j]; delta != 0 && delta != noDelta && ((delta > 0 && charges) || (delta < 0 && givesBack(d.checks[j].Algorithm))) {
			c := d.checks[j]
			c.Rate, c.Cost, c.Shadow = d.Verdicts[i].Limit.Rate, delta, false
			checks = append(checks, c)
		}
	}
	rec.Retry(id, checks)
}

// settleOn settles on store the checks whose delta is not noDelta, in one
// Charge call with id: positive deltas are charged against debtRate,
// negative ones given back (token bucket and GCRA only; other algorithms
// keep their units). A LeaseStore takes what it can from its leases
// first. The deltas it settled are set to 0: on error, what is not 0 is
// what failed.
func settleOn(ctx context.Context, store Store, id string, checks []Check, deltas []int64) error {
	if ls, ok := store.(*LeaseStore); ok {
		return ls.settle(ctx, id, checks, deltas)
	}
	sc := settleScratches.Get().(*settleScratch)
	defer sc.put()
	for i := range checks {
		switch c, delta := checks[i], deltas[i]; {
		case delta == noDelta || delta == 0:
		case delta > 0:
			c.Rate = debtRate(c.Algorithm, c.Rate)
			c.Cost, c.Shadow = delta, false
			sc.moves = append(sc.moves, c)
			sc.idx = append(sc.idx, i)
		default:
			c.Cost, c.Shadow = delta, false
			c.Rate.Delay = 0
			if givesBack(c.Algorithm) {
				sc.moves = append(sc.moves, c)
				sc.idx = append(sc.idx, i)
			} else {
				deltas[i] = 0 // kept, by design
			}
		}
	}
	if len(sc.moves) == 0 {
		return nil
	}
	ch, ok := store.(Charger)
	if !ok {
		return ErrNoCharge
	}
	sc.charged = resizeSlice(sc.charged, len(sc.moves))
	for j := range sc.charged {
		sc.charged[j] = ChargeFailed // unless the store says otherwise
	}
	err := ch.Charge(ctx, id, sc.moves, sc.charged)
	// Mark what was settled, so that a caller falls back with the rest
	// only (a charge must not be made twice).
	for j, i := range sc.idx {
		if n := sc.charged[j]; err == nil || (n != ChargeFailed && n != ChargeRefused) {
			deltas[i] = 0
		}
	}
	return err
}

// settleScratch is settleOn's working memory, pooled.
type settleScratch struct {
	moves   []Check
	idx     []int
	charged []int64
}

var settleScratches = sync.Pool{New: func() any { return new(settleScratch) }}

// put returns sc to the pool without keeping the checks' strings alive.
func (sc *settleScratch) put() {
	clear(sc.moves)
	sc.moves, sc.idx = sc.moves[:0], sc.idx[:0]
	settleScratches.Put(sc)
}

// settle implements settleOn for a lease cache. When the request's checks
// are served by a lease and every one of them is metered, a positive
// settlement is first taken from the leased units, which are already
// charged in the shared store: k requests' worth pay k x Cost units of
// every check, for the largest k that pays no check more than it owes.
// The rest goes to the inner store. When some check of the lease is not
// metered, leased units cannot pay (they would charge that check too):
// the settlement goes to the inner store and the lease ends (the sweeper
// gives its units back), so that the instance does not go on serving a
// bucket that is now in debt.
func (s *LeaseStore) settle(ctx context.Context, id string, checks []Check, deltas []int64) error {
	if !s.closed.Load() && leasable(checks) {
		kb := s.keys.Get().(*[]byte)
		*kb = appendLeaseKey((*kb)[:0], checks)
		sh := &s.shards[maphash.Bytes(s.seed, *kb)%leaseShards]
		sh.mu.Lock()
		e := sh.m[string(*kb)]
		sh.mu.Unlock()
		s.keys.Put(kb)
		if e != nil {
			s.count(e, LeaseSpent, s.settleLease(e, checks, deltas))
		}
	}
	return settleOn(ctx, s.inner, id, checks, deltas)
}

// settleLease pays what it can of deltas from e's leased units and
// returns how many requests' worth it took.
func (s *LeaseStore) settleLease(e *leaseEntry, checks []Check, deltas []int64) int64 {
	now := s.clock.Now().UnixNano()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.dead || e.unleasable || e.units <= 0 || now >= e.expires {
		return 0
	}
	k, owes := e.units, false
	for i := range checks {
		delta, cost := deltas[i], checks[i].Cost
		switch {
		case delta == noDelta:
			if cost > 0 {
				k = 0 // a leased unit would charge this check too
			}
		case cost > 0:
			k = min(k, max(delta, 0)/cost)
		}
		owes = owes || delta > 0 // noDelta is negative
	}
	if !owes {
		return 0
	}
	if k == 0 {
		for i := range checks {
			if deltas[i] == noDelta && checks[i].Cost > 0 {
				// Not payable from the lease: end it.
				e.expires = now
				break
			}
		}
		return 0
	}
	e.units -= k
	for i := range checks {
		if deltas[i] != noDelta {
			deltas[i] -= k * checks[i].Cost
		}
	}
	return k
}
