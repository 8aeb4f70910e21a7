package limiter

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// This file holds what every algorithm shares. Each algorithm lives in its
// own file as a pure function
//
//	func(s bucketState, now int64, r Rate, cost int64) (Result, bucketState)
//
// (sliding_log also reads its log). They take the instant now in Unix
// nanoseconds, use no maps, locks or clocks, and return the answer together
// with the state the bucket has if the request is charged. The memory store
// keeps that state per key; the Redis scripts mirror the same arithmetic.
//
// Rules common to every algorithm:
//
//   - The zero state is a fresh bucket: full token bucket, empty windows,
//     empty log, nothing in flight. A store that has no state for a key, or
//     whose state has expired (see expiresAt), evaluates the zero state.
//   - cost 0 is a peek: always allowed, charges nothing, reports the current
//     Remaining and Reset.
//   - A cost that can never fit (more than the capacity, or than Limit for
//     the window algorithms) is denied with RetryAfter = Window (1s for
//     concurrency); the bucket is left untouched.
//   - Remaining is the number of whole units left after the request when it
//     is allowed (and charged), or left now when it is denied; never
//     negative, even after a limit was lowered.
//   - RetryAfter (denied only) is the exact time until the same request
//     would be admitted if nothing else happened; where float math is
//     involved it is rounded up to the nanosecond and then checked against
//     the admission test itself, so it is never earlier than the quota
//     actually frees.
//   - Reset is the time until the bucket has more quota than Remaining,
//     computed like RetryAfter for a request of Remaining+1 units; 0 when
//     the bucket is full.
//   - A clock that goes backwards never refills or rolls a bucket: the state
//     is evaluated at the latest instant it has seen.

// bucketState is the O(1) state of one bucket. Each algorithm gives the fields
// its own meaning (documented in its file):
//
//	token_bucket    At = instant of the last update, F = tokens missing from a full bucket
//	gcra            At = theoretical arrival time (TAT)
//	sliding_window  At = start of the current window, N = its count, Prev = previous window's count
//	fixed_window    At = start of the window, N = its count
//	sliding_log     At = instant of the last admission (0 = never), N = units admitted at At not yet in the log
//	concurrency     N = units in flight
type bucketState struct {
	At   int64
	N    int64
	Prev int64
	F    float64
}

// maxTolerance bounds GCRA's burst tolerance (about 73 years in
// nanoseconds) so that TAT arithmetic cannot overflow an int64.
const maxTolerance = 1 << 61

// concurrencyRetry is the RetryAfter of a denied concurrency check: nothing
// tells when a request in flight will finish.
const concurrencyRetry = time.Second

// ErrInvalidCheck wraps every error of a store that refused its input
// (Check.validate): a bug of the caller, never a failure of the store, so
// it is neither a reason for a fail mode nor counted by a circuit breaker.
var ErrInvalidCheck = errors.New("limiter: invalid check")

// validate reports why c cannot be evaluated, or nil. Policies are
// validated when configured; this guards the arithmetic against runtime
// overrides and library users. A cost above MaxCount is valid: such a
// request can never fit (see nothingFits), whatever the store.
func (c *Check) validate() error {
	r := c.Rate
	var err error
	switch {
	case c.Algorithm >= numAlgorithms:
		return fmt.Errorf("%w: unknown algorithm %d", ErrInvalidCheck, c.Algorithm)
	case c.Cost < 0:
		return fmt.Errorf("%w: negative cost %d", ErrInvalidCheck, c.Cost)
	}
	if err = CheckCount(r.Limit, 1); err != nil {
		return fmt.Errorf("%w: limit %w", ErrInvalidCheck, err)
	}
	if c.Algorithm != Concurrency || r.Window != 0 {
		if err = CheckWindow(r.Window); err != nil {
			return fmt.Errorf("%w: window %w", ErrInvalidCheck, err)
		}
	}
	if err = CheckCount(r.Burst, 0); err != nil {
		return fmt.Errorf("%w: burst %w", ErrInvalidCheck, err)
	}
	if err = CheckInterval(r.MinInterval); err != nil {
		return fmt.Errorf("%w: min_interval %w", ErrInvalidCheck, err)
	}
	if err = checkCalendar(r, c.Algorithm); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidCheck, err)
	}
	if err = CheckDelay(r.Delay); err != nil {
		return fmt.Errorf("%w: delay %w", ErrInvalidCheck, err)
	}
	if err = c.Algorithm.CheckDelay(r.Delay); err != nil {
		return fmt.Errorf("%w: delay %w", ErrInvalidCheck, err)
	}
	return nil
}

// neverFitsCost is what a cost above MaxCount is sent to Redis as: larger
// than any capacity, and exact in a Lua number (MaxCount + 1 = 2^53).
const neverFitsCost = MaxCount + 1

// evalAlgorithm dispatches to the algorithm a. log is the sliding log of the
// bucket (nil when empty, ignored by other algorithms).
func evalAlgorithm(a Algorithm, s bucketState, log *logRing, now int64, r Rate, cost int64) (Result, bucketState) {
	switch a {
	case TokenBucket:
		res, next := tokenBucket(s, now, r, cost)
		return reserveTurn(a, s, now, r, cost, res, next)
	case GCRA:
		res, next := gcra(s, now, r, cost)
		return reserveTurn(a, s, now, r, cost, res, next)
	case FixedWindow:
		return fixedWindow(s, now, r, cost)
	case SlidingLog:
		return slidingLog(s, log, now, r, cost)
	case Concurrency:
		return concurrency(s, now, r, cost)
	default:
		return slidingWindow(s, now, r, cost)
	}
}

// expiresAt returns the instant from which s (with log) equals the zero
// state, so a store may forget it: math.MaxInt64 while a concurrency slot is
// in flight. It may be later than the exact instant, never earlier.
func expiresAt(a Algorithm, s bucketState, log *logRing, r Rate) int64 {
	switch a {
	case TokenBucket:
		return tokenBucketExpiry(s, r)
	case GCRA:
		return s.At
	case FixedWindow:
		if s.N > 0 {
			return fixedWindowEnd(s.At, r)
		}
		return s.At
	case SlidingLog:
		return slidingLogExpiry(s, log, r)
	case Concurrency:
		if s.N > 0 {
			return math.MaxInt64
		}
		return math.MinInt64
	default:
		switch {
		case s.N > 0:
			return satAdd(s.At, 2*int64(r.Window))
		case s.Prev > 0:
			return satAdd(s.At, int64(r.Window))
		}
		return s.At
	}
}

// nothingFits is the answer to a cost that exceeds the bucket's capacity:
// denied, RetryAfter one window, Remaining and Reset as a peek would say.
func nothingFits(peek Result, r Rate) Result {
	return Result{Remaining: peek.Remaining, RetryAfter: r.Window, Reset: peek.Reset}
}

// neverFitsRetry is the RetryAfter of a cost that can never fit: one
// window, or concurrencyRetry for Concurrency (which has none).
func neverFitsRetry(r Rate, a Algorithm) time.Duration {
	if a == Concurrency {
		return concurrencyRetry
	}
	return r.Window
}

// deniedResult turns the peek answer of a bucket into a denial that can be
// retried after wait ns.
func deniedResult(peek Result, wait int64) Result {
	peek.Allowed = false
	peek.RetryAfter = nsDuration(wait)
	return peek
}

// settle returns the smallest wait w' near w for which ok(w') holds. An
// analytic wait computed in float64 can be a few nanoseconds off either
// way; settle checks it against the admission test itself, so a RetryAfter
// is never earlier than the moment the store would really admit, and not
// later either. ok must be monotonic (false, then true for good). Steps grow
// geometrically after a few tries, so it ends quickly even for waits whose
// float64 spacing exceeds a nanosecond.
func settle(w int64, ok func(int64) bool) int64 {
	if ok(w) {
		for i := 0; i < 8 && w > 0 && ok(w-1); i++ {
			w--
		}
		return w
	}
	step := int64(1)
	for i := 0; !ok(w); i++ {
		if w == math.MaxInt64 {
			return w
		}
		w = satAdd(w, step)
		if i >= 4 {
			step = satAdd(step, step)
		}
	}
	return w
}

// ceilNanos rounds a non-negative float number of nanoseconds up,
// saturating at math.MaxInt64.
func ceilNanos(x float64) int64 {
	if x <= 0 || math.IsNaN(x) {
		return 0
	}
	c := math.Ceil(x)
	if c >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(c)
}

// floorUnits clamps a float number of units to [0, max] and rounds it down.
func floorUnits(x float64, max int64) int64 {
	if x <= 0 || math.IsNaN(x) {
		return 0
	}
	if x >= float64(max) {
		return max
	}
	return int64(x)
}

// satAdd adds two int64 values, saturating instead of wrapping.
func satAdd(a, b int64) int64 {
	c := a + b
	if (c > a) == (b > 0) {
		return c
	}
	if b > 0 {
		return math.MaxInt64
	}
	return math.MinInt64
}

// satMul multiplies two non-negative int64 values, saturating at
// math.MaxInt64.
func satMul(a, b int64) int64 {
	if a == 0 || b == 0 {
		return 0
	}
	if a > math.MaxInt64/b {
		return math.MaxInt64
	}
	return a * b
}

// windowStart returns the start of the window of length w that contains t,
// with windows aligned to the Unix epoch so every instance agrees on them.
func windowStart(t, w int64) int64 {
	m := t % w
	if m < 0 {
		m += w
	}
	return t - m
}

// nsDuration converts nanoseconds to a Duration, clamping negatives to 0.
func nsDuration(ns int64) time.Duration {
	if ns < 0 {
		return 0
	}
	return time.Duration(ns)
}
