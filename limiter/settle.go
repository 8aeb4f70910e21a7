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
// The settlement goes to the store that decided the request. When that
// store fails, it goes to fb.Store with the rate scaled as the fallback
// decides, and the units it charged there are recorded by fb.Recorder, to
// be charged to the primary store once it is back (as for a fallback
// admission, down to empty, never into debt); the primary store's error is
// returned. A request the fallback decided is settled there and recorded
// the same way.
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
		d.record(fb, d.checks)
		return settleOn(ctx, fb.Store, d.checks, d.settleDeltas)
	}
	// settleOn zeroes the deltas it settled: what is left failed.
	err := settleOn(ctx, d.decidedBy, d.checks, d.settleDeltas)
	if err == nil || errors.Is(err, ErrInvalidCheck) || fb.Store == nil {
		return err
	}
	local := append(d.settleChecks[:0], d.checks...)
	for k := range local {
		local[k].Rate = local[k].Rate.scaled(fb.Scale)
	}
	d.settleChecks = local
	d.record(fb, local)
	ferr := settleOn(ctx, fb.Store, local, d.settleDeltas)
	if ferr != nil {
		return fmt.Errorf("%w (and the fallback store failed: %v)", err, ferr)
	}
	return err
}

// errSettleAfterRelease: Release compacted the checks Settle needs.
var errSettleAfterRelease = errors.New("limiter: Settle called after Release")

// record records the positive deltas a settlement charges to fb.Store.
func (d *Decision) record(fb Fallback, checks []Check) {
	if fb.Recorder == nil {
		return
	}
	for j, i := range d.counted {
		if delta := d.settleDeltas[j]; delta > 0 {
			fb.Recorder.Record(&checks[j], d.Verdicts[i].Limit.Rate, delta)
		}
	}
}

// settleOn settles on store the checks whose delta is not noDelta:
// positive deltas are forced charges against debtRate (Charger), negative
// ones refunds (Refunder). A LeaseStore takes what it can from its leases
// first. The deltas it settled are set to 0: on error, what is not 0 is
// what failed.
func settleOn(ctx context.Context, store Store, checks []Check, deltas []int64) error {
	if ls, ok := store.(*LeaseStore); ok {
		return ls.settle(ctx, checks, deltas)
	}
	sc := settleScratches.Get().(*settleScratch)
	defer sc.put()
	for i := range checks {
		switch c, delta := checks[i], deltas[i]; {
		case delta == noDelta || delta == 0:
		case delta > 0:
			c.Rate = debtRate(c.Algorithm, c.Rate)
			c.Cost, c.Shadow = delta, false
			sc.debit = append(sc.debit, c)
		default:
			c.Cost = -delta
			if refundable(&c) {
				sc.refund = append(sc.refund, c)
			}
		}
	}
	var derr, rerr error
	if len(sc.debit) > 0 {
		ch, ok := store.(Charger)
		if !ok {
			return ErrNoCharge
		}
		sc.charged = resizeSlice(sc.charged, len(sc.debit))
		derr = ch.Charge(ctx, sc.debit, sc.charged)
	}
	if len(sc.refund) > 0 {
		if rf, ok := store.(Refunder); ok {
			rerr = rf.Refund(ctx, sc.refund)
		}
	}
	// Mark what was settled, so that a caller falls back with the rest
	// only (a charge must not be made twice).
	for i, delta := range deltas {
		if (delta > 0 && derr == nil) || (delta < 0 && delta != noDelta && rerr == nil) {
			deltas[i] = 0
		}
	}
	return errors.Join(derr, rerr)
}

// settleScratch is settleOn's working memory, pooled.
type settleScratch struct {
	debit, refund []Check
	charged       []int64
}

var settleScratches = sync.Pool{New: func() any { return new(settleScratch) }}

// put returns sc to the pool without keeping the checks' strings alive.
func (sc *settleScratch) put() {
	clear(sc.debit)
	clear(sc.refund)
	sc.debit, sc.refund = sc.debit[:0], sc.refund[:0]
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
func (s *LeaseStore) settle(ctx context.Context, checks []Check, deltas []int64) error {
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
	return settleOn(ctx, s.inner, checks, deltas)
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
