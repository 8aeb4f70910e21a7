package limiter

// gcra decides one request with the generic cell rate algorithm, a token
// bucket kept as a single number.
//
// The emission interval T = ceil(Window / Limit) nanoseconds is the time one
// unit takes to come back (rounded up, so GCRA never admits faster than
// Limit per Window; with a Window not divisible by Limit it is slower by at
// most 1ns per unit). The tolerance is tau = C x T with C = Rate.Capacity().
// The state is the theoretical arrival time TAT: the instant at which the
// bucket would be full again. At instant now the bucket "owes"
// used = max(TAT, now) - now nanoseconds and holds floor((tau - used) / T)
// whole units. A request of cost n is admitted when used + n x T <= tau;
// then TAT = max(TAT, now) + n x T.
//
// It behaves like tokenBucket (same Remaining, RetryAfter and Reset up to
// the rounding of T) with integer arithmetic only:
//
//   - RetryAfter (denied): used + n x T - tau, exact.
//   - Reset: time until one more whole unit, T - ((tau - used) mod T); 0
//     when full (used = 0).
//   - n > C never fits: denied with RetryAfter = Window.
//
// State: At = TAT; the zero state (TAT in the past) is a full bucket.
func gcra(s bucketState, now int64, r Rate, cost int64) (Result, bucketState) {
	c := r.Capacity()
	T := gcraInterval(r)
	tau := min(satMul(c, T), maxTolerance)
	tat := max(s.At, now)
	used := tat - now
	peek := gcraResult(used, T, tau, c)
	switch {
	case cost == 0:
		return peek, s
	case cost > c:
		return nothingFits(peek, r), s
	}
	need := satMul(cost, T)
	if used > tau || need > tau-used {
		// used + need - tau, computed without overflow.
		return deniedResult(peek, satAdd(need, used-tau)), s
	}
	used += need
	res := gcraResult(used, T, tau, c)
	res.Allowed = true
	return res, bucketState{At: now + used}
}

// gcraInterval is the emission interval: nanoseconds per unit, rounded up.
func gcraInterval(r Rate) int64 {
	w := int64(r.Window)
	T := w / r.Limit
	if T*r.Limit < w || T == 0 {
		T++
	}
	return T
}

// gcraResult reports Remaining and Reset when the bucket owes used
// nanoseconds, as an allowed answer.
func gcraResult(used, T, tau, c int64) Result {
	if used <= 0 {
		return Result{Allowed: true, Remaining: c}
	}
	if used >= tau {
		// Empty (or over-full after a lowered capacity): the next unit
		// comes back when used drops to tau - T.
		return Result{Allowed: true, Reset: nsDuration(used - tau + T)}
	}
	free := tau - used
	return Result{Allowed: true, Remaining: min(free/T, c), Reset: nsDuration(T - free%T)}
}
