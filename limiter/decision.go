package limiter

import (
	"context"
	"errors"
)

// Item is one policy that a request matched, with the request's identity
// in that policy.
type Item struct {
	// Policy is the matched policy.
	Policy *Policy
	// Tenant owns the bucket; Tier selects a tier limit of Policy.
	Tenant, Tier string
	// Part partitions the tenant's budget inside Policy; may be empty.
	Part string
	// Cost is the number of units the request takes.
	Cost int64
}

// Verdict is the outcome of one Item.
type Verdict struct {
	// Limit is the limit resolved for the item's tenant, and Source where
	// it came from.
	Limit  Limit
	Source Source
	// Result is the store's answer. For an unlimited item it is an
	// admitting result with Remaining -1, and the store was not asked.
	Result Result
	// Path says whether the store answered or a fail mode decided.
	Path Path
}

// Counted reports whether the item was decided (by the store, a fail mode
// or a penalty box); unlimited items are not, nor items skipped because
// another item's penalty box refused the request.
func (v *Verdict) Counted() bool { return !v.Limit.Unlimited && v.Path != PathSkipped }

// Enforced reports whether the verdict can block the request.
func (v *Verdict) Enforced() bool { return v.Counted() && !v.Limit.Shadow }

// ShadowDenied reports whether a shadow verdict would have denied.
func (v *Verdict) ShadowDenied() bool {
	return !v.Limit.Unlimited && v.Limit.Shadow && !v.Result.Allowed
}

// Decision holds a request's verdicts. Reuse one Decision per request (it
// keeps its slices) to decide without allocating.
type Decision struct {
	// Admitted is false when any enforced item denied the request.
	Admitted bool
	// Verdicts has one entry per Item, in order.
	Verdicts []Verdict
	// Overrides, when set, is asked first for each item's limit: a runtime
	// override wins over Policy.Resolve (SourceRuntimeOverride). Reset
	// keeps it. It runs on the hot path: it must be an in-process lookup.
	Overrides OverrideLookup
	// NoDelay decides every item as if its limit had no Delay: no request
	// waits for a turn (a charge made for a request that is denied
	// anyway). Reset keeps it.
	NoDelay bool
	// Penalties, when set, holds the penalty boxes of the policies that
	// have one (Policy.Penalty): a boxed item is refused without asking
	// the store, and the store's denials of such policies are reported to
	// it. Reset keeps it.
	Penalties Penalties

	checks    []Check
	results   []Result
	counted   []int // index in Verdicts of each check
	decidedBy Store // the store that holds the charges, for Release

	// Settle's scratch: the delta of each check, and the checks rescaled
	// for the fallback store.
	settleDeltas []int64
	settleChecks []Check
}

// Reset empties d for reuse.
func (d *Decision) Reset() {
	d.Admitted = false
	d.Verdicts = d.Verdicts[:0]
	d.checks = d.checks[:0]
	d.results = d.results[:0]
	d.counted = d.counted[:0]
	d.decidedBy = nil
}

// Decide resolves each item's limit and asks store for one all-or-nothing
// decision over the items that are not unlimited. On error d.Verdicts holds
// the resolved limits but no results.
//
// An item whose bucket is in its policy's penalty box (d.Penalties) is
// refused without asking the store (PathPenalty); when it is enforced,
// the store is not asked at all and the other items are skipped
// (PathSkipped). The store's denials of a policy with a penalty are
// reported to d.Penalties.
func (d *Decision) Decide(ctx context.Context, store Store, items []Item) error {
	d.Reset()
	boxed := false
	for i := range items {
		it := &items[i]
		limit, source := d.resolve(it)
		d.Verdicts = append(d.Verdicts, Verdict{Limit: limit, Source: source})
		if limit.Unlimited {
			d.Verdicts[i].Result = Result{Allowed: true, Remaining: -1}
			continue
		}
		if d.Penalties != nil && it.Policy.Penalty.On() {
			if left, ok := d.Penalties.Boxed(NewPenaltyKey(it.Policy.Name, it.Tenant, it.Part)); ok {
				v := &d.Verdicts[i]
				v.Path = PathPenalty
				v.Result = Result{RetryAfter: left, Reset: left, From: OriginDenialCache}
				boxed = boxed || !limit.Shadow
				continue
			}
		}
		rate := limit.Rate
		if d.NoDelay {
			rate.Delay = 0
		}
		d.checks = append(d.checks, Check{
			Algorithm: it.Policy.Algorithm,
			Tenant:    it.Tenant,
			Policy:    it.Policy.Name,
			Part:      it.Part,
			Rate:      rate,
			Cost:      it.Cost,
			Shadow:    limit.Shadow,
			// A LeaseStore decides which checks it may lease (never
			// shadow ones, nor algorithms that cannot lease).
			Lease: it.Policy.Lease,
		})
		if c := &d.checks[len(d.checks)-1]; takesSlots(c) {
			c.Hold = NewChargeID()
		}
		d.counted = append(d.counted, i)
	}
	if boxed {
		d.skip()
		return nil
	}
	if len(d.checks) == 0 {
		d.Admitted = true
		return nil
	}
	d.decidedBy = store
	for range d.checks {
		d.results = append(d.results, Result{})
	}
	admitted, err := store.Decide(ctx, d.checks, d.results)
	if err != nil && !deniedAnyway(err) {
		return err
	}
	d.Admitted = admitted
	for j, i := range d.counted {
		d.Verdicts[i].Result = d.results[j]
		if !d.results[j].Allowed && d.Penalties != nil {
			if pen := items[i].Policy.Penalty; pen.On() {
				it := &items[i]
				d.Penalties.Denied(NewPenaltyKey(it.Policy.Name, it.Tenant, it.Part), pen, d.Verdicts[i].Limit)
			}
		}
	}
	// nil, or the error of a denial whose cross-slot give-back failed:
	// the verdicts are the store's (see DecideOrFallback).
	return err
}

// deniedAnyway reports whether err is that of a request the store denied
// across Cluster slots, of which only giving back what the slots before
// the denying one charged failed.
func deniedAnyway(err error) bool {
	var ran ranError
	return errors.As(err, &ran) && ran.denied
}

// skip completes a decision an enforced penalty box refused: the items
// that would have asked the store are skipped, and nothing is charged.
func (d *Decision) skip() {
	for _, i := range d.counted {
		d.Verdicts[i].Path = PathSkipped
		d.Verdicts[i].Result = Result{Allowed: true, Remaining: -1}
	}
	d.checks, d.counted = d.checks[:0], d.counted[:0]
	d.Admitted = false
}

// OverrideLookup finds the runtime override of tenant in policy p.
type OverrideLookup interface {
	Lookup(p *Policy, tenant string) (Limit, bool)
}

func (d *Decision) resolve(it *Item) (Limit, Source) {
	if d.Overrides != nil {
		if l, ok := d.Overrides.Lookup(it.Policy, it.Tenant); ok {
			return l, SourceRuntimeOverride
		}
	}
	return it.Policy.Resolve(it.Tenant, it.Tier)
}

// Release gives back the concurrency slots an admitted decision took, to
// the store that charged them. Call it once, when the request is done; it
// is a no-op when the decision holds no charged concurrency check. When
// the store fails, slots held under an id (Check.Hold) are kept in
// fb.Recorder, to be released once the store answers again (see hold.go);
// the error is returned all the same.
func (d *Decision) Release(ctx context.Context, fb Fallback) error {
	if !d.Admitted {
		return nil
	}
	n := 0
	for j := range d.checks {
		if d.holdsSlot(j) {
			d.checks[n] = d.checks[j]
			n++
		}
	}
	if n == 0 {
		return nil
	}
	d.checks = d.checks[:n]
	err := d.decidedBy.Release(ctx, d.checks)
	if err != nil && fb.Recorder != nil && !errors.Is(err, ErrInvalidCheck) {
		fb.Recorder.RetryRelease(d.checks, NotSent(err))
	}
	return err
}

// HoldsSlots reports whether Release has work to do.
func (d *Decision) HoldsSlots() bool {
	if !d.Admitted {
		return false
	}
	for j := range d.checks {
		if d.holdsSlot(j) {
			return true
		}
	}
	return false
}

// holdsSlot reports whether d's check j took concurrency slots.
func (d *Decision) holdsSlot(j int) bool {
	return takesSlots(&d.checks[j]) && d.results[j].Allowed
}
