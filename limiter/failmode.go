package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// FailMode says how a policy decides when its store cannot answer.
type FailMode uint8

// The fail modes. FailLocal is the zero value because it is the default.
const (
	// FailLocal decides on an in-process fallback store with the limit
	// scaled down (see Decision.DecideOrFallback).
	FailLocal FailMode = iota
	// FailOpen admits.
	FailOpen
	// FailClosed denies.
	FailClosed
)

// FailModeNames lists the valid fail mode names, for error messages.
const FailModeNames = "open, closed, local"

var failModeNames = [...]string{FailLocal: "local", FailOpen: "open", FailClosed: "closed"}

// String returns the configuration name of m.
func (m FailMode) String() string {
	if int(m) < len(failModeNames) {
		return failModeNames[m]
	}
	return fmt.Sprintf("failmode(%d)", uint8(m))
}

// ParseFailMode turns a configuration name into a FailMode; "" is
// FailLocal.
func ParseFailMode(name string) (FailMode, error) {
	if name == "" {
		return FailLocal, nil
	}
	for i, n := range failModeNames {
		if n == name {
			return FailMode(i), nil
		}
	}
	return 0, fmt.Errorf("unknown fail mode %q (allowed: %s)", name, FailModeNames)
}

// Path says how a verdict was reached.
type Path uint8

// Paths of a verdict.
const (
	// PathStore: the store answered.
	PathStore Path = iota
	// PathFailedOpen: the store failed and the policy admits (FailOpen).
	PathFailedOpen
	// PathFailedClosed: the store failed and the policy denies (FailClosed).
	PathFailedClosed
	// PathFallback: the store failed and the fallback store answered
	// (FailLocal).
	PathFallback
	// PathPenalty: the bucket is in its policy's penalty box; the store
	// was not asked (see Penalty).
	PathPenalty
	// PathSkipped: not decided, as another item's penalty box refused the
	// request first; the store was not asked. Not counted.
	PathSkipped
)

// FailedClosedRetryAfter is the RetryAfter of a FailClosed denial: the
// store is expected back soon, and nothing better is known.
const FailedClosedRetryAfter = time.Second

// Fallback is the in-process store FailLocal policies use while the
// primary store fails, and the share of each limit it grants.
type Fallback struct {
	// Store keeps the fallback buckets; keep it apart from any store that
	// holds real buckets.
	Store Store
	// Scale multiplies every limit and burst (at least 1 unit remains),
	// e.g. 0.7 / live instances.
	Scale float64
	// Recorder, when not nil, records every unit the fallback store
	// charged, with the unscaled rate, to be charged to the primary store
	// when it is back (see Recorder).
	Recorder *Recorder
}

// scaled returns r with Limit and Burst multiplied by f, at least 1.
func (r Rate) scaled(f float64) Rate {
	r.Limit = max(1, int64(math.Floor(float64(r.Limit)*f)))
	if r.Burst > 0 {
		r.Burst = max(1, int64(math.Floor(float64(r.Burst)*f)))
	}
	return r
}

// CallerLeft reports whether a store call that returned err ended with
// its caller gone: ctx was cancelled (a client that disconnected) or ran
// out of the caller's own deadline. That says nothing about the store: no
// fail mode decides in its place and the breaker counts it neither way
// (RedisStore does not report a cancelled call to Observe either).
func CallerLeft(ctx context.Context, err error) bool {
	return err != nil && ctx.Err() != nil
}

// DecideOrFallback is Decide, and when the store fails it decides each
// counted item by its policy's FailMode instead: FailOpen admits, FailClosed
// denies (RetryAfter FailedClosedRetryAfter), FailLocal asks fb.Store with
// the rate scaled by fb.Scale, all-or-nothing among those items. The
// request is admitted when no enforced item denies. It returns the
// primary store's error, nil when the store answered; d is complete
// either way. With fb.Recorder set, the units the fallback store charged
// are recorded for recovery accounting.
//
// Bad input is never a store failure: when the store refused the checks as
// invalid (ErrInvalidCheck) no fail mode applies and the error is returned
// with d holding no results. Nor is a caller that went away (CallerLeft):
// its error is returned and nothing is decided, so a client that
// disconnects while its call waits for the store is neither admitted by a
// fail mode nor charged by the recorder for it (the call itself, if it
// was sent, may still run: the request is then charged once, by it). And
// a fail mode never admits what the store could never admit: an item
// whose cost exceeds its bucket's capacity (a cost beyond MaxCount
// included) is denied whatever its FailMode.
func (d *Decision) DecideOrFallback(ctx context.Context, store Store, fb Fallback, items []Item) error {
	err := d.Decide(ctx, store, items)
	if err == nil || errors.Is(err, ErrInvalidCheck) {
		return err
	}
	if mayHaveRun(err) && fb.Recorder != nil {
		// Slots the lost call may have taken: released once the store
		// answers (a release that comes first keeps the call from taking
		// them, see hold.go).
		fb.Recorder.RetryRelease(d.checks, false)
		// A cross-slot give-back that failed: sent again under its id.
		var ran ranError
		if errors.As(err, &ran) && ran.giveBack != nil {
			fb.Recorder.Retry(ran.giveBackID, ran.giveBack)
		}
	}
	if deniedAnyway(err) {
		// The store denied the request; what failed is the give-back of
		// the other slots' charges, which the recorder lands. The denial
		// stands: a fail mode must not admit a request over its limit.
		return err
	}
	if CallerLeft(ctx, err) {
		return err
	}
	d.decidedBy = fb.Store
	localDenies := false
	local := d.checks[:0]
	localIdx := d.counted[:0]
	for j, i := range d.counted {
		v := &d.Verdicts[i]
		switch mode := items[i].Policy.FailMode; {
		case d.checks[j].Cost > d.checks[j].Rate.Capacity():
			// Never fits, in any store and whatever the bucket holds
			// (a cost beyond MaxCount included): denied as the store
			// would deny it.
			v.Path = PathStore
			v.Result = Result{RetryAfter: neverFitsRetry(d.checks[j].Rate, d.checks[j].Algorithm)}
			localDenies = localDenies || v.Enforced()
		case mode == FailOpen:
			v.Path = PathFailedOpen
			v.Result = Result{Allowed: true, Remaining: -1}
		case mode == FailClosed:
			v.Path = PathFailedClosed
			v.Result = Result{RetryAfter: FailedClosedRetryAfter, Reset: FailedClosedRetryAfter}
			localDenies = localDenies || v.Enforced()
		default:
			v.Path = PathFallback
			c := d.checks[j]
			c.Rate = c.Rate.scaled(fb.Scale)
			local = append(local, c)
			localIdx = append(localIdx, i)
		}
	}
	d.checks, d.counted = local, localIdx
	d.results = d.results[:len(local)]
	admitted := true
	if len(local) > 0 {
		var ferr error
		if localDenies {
			ferr = fb.Store.Peek(ctx, local, d.results)
		} else {
			admitted, ferr = fb.Store.Decide(ctx, local, d.results)
		}
		if ferr != nil {
			return fmt.Errorf("%w (and the fallback store failed: %v)", err, ferr)
		}
		for j, i := range localIdx {
			d.Verdicts[i].Result = d.results[j]
		}
		if admitted && !localDenies && fb.Recorder != nil {
			for j, i := range localIdx {
				// Charged: every non-shadow check, and shadow ones that
				// allowed.
				if c := &local[j]; c.Cost > 0 && (!c.Shadow || d.results[j].Allowed) {
					fb.Recorder.Record(c, d.Verdicts[i].Limit.Rate, c.Cost)
				}
			}
		}
	}
	d.Admitted = admitted && !localDenies
	return err
}
