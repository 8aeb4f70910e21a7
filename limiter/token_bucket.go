package limiter

import "math"

// tokenBucket decides one request against a token bucket.
//
// The bucket holds at most C = Rate.Capacity() tokens (Burst, else Limit)
// and refills continuously at Limit tokens per Window, so after an idle
// period of Window/Limit one more token is available. It starts full. A
// request of cost n is admitted when the bucket holds at least n tokens,
// and then takes them.
//
//   - Remaining: whole tokens left (after the request when admitted).
//   - RetryAfter (denied): time until the bucket holds n tokens,
//     (n - tokens) x Window / Limit, rounded up to the nanosecond.
//   - Reset: time until the next whole token, i.e. until Remaining+1
//     tokens; 0 when the bucket is full.
//   - n > C never fits: denied with RetryAfter = Window.
//
// State: At is the instant of the last update and F the deficit, the
// number of tokens missing from a full bucket (so the zero state is a full
// bucket). Storing the deficit rather than the level also means that raising
// the capacity gives the new tokens at once and lowering it takes effect at
// once.
func tokenBucket(s bucketState, now int64, r Rate, cost int64) (Result, bucketState) {
	c := r.Capacity()
	t := max(now, s.At)
	cur := bucketState{At: t, F: tokenDeficit(s, t, r)}
	peek := tokenResult(s, cur.F, now, r)
	switch {
	case cost == 0:
		return peek, cur
	case cost > c:
		return nothingFits(peek, r), cur
	case float64(c)-cur.F < float64(cost):
		return deniedResult(peek, tokenWait(s, now, r, cost)), cur
	}
	cur.F += float64(cost)
	res := tokenResult(cur, cur.F, now, r)
	res.Allowed = true
	return res, cur
}

// tokenDeficit is the deficit of s refilled up to t (t >= s.At).
func tokenDeficit(s bucketState, t int64, r Rate) float64 {
	d := s.F - float64(t-s.At)*float64(r.Limit)/float64(r.Window)
	if d <= 0 || math.IsNaN(d) {
		return 0
	}
	return d
}

// tokenResult reports Remaining and Reset when the deficit is d at now, as
// an allowed answer; the wait is computed from src, the state as stored, so
// it agrees to the nanosecond with what the store will compute later.
func tokenResult(src bucketState, d float64, now int64, r Rate) Result {
	c := r.Capacity()
	rem := floorUnits(float64(c)-d, c)
	res := Result{Allowed: true, Remaining: rem}
	if rem < c {
		res.Reset = nsDuration(tokenWait(src, now, r, rem+1))
	}
	return res
}

// tokenWait returns how long from now until s, left alone, holds n tokens
// (n <= capacity).
func tokenWait(s bucketState, now int64, r Rate, n int64) int64 {
	c := float64(r.Capacity())
	t := max(now, s.At)
	need := float64(n) - (c - tokenDeficit(s, t, r))
	if need <= 0 {
		return t - now
	}
	w := (t - now) + ceilNanos(need*float64(r.Window)/float64(r.Limit))
	return settle(w, func(w int64) bool {
		return c-tokenDeficit(s, satAdd(now, w), r) >= float64(n)
	})
}

// tokenBucketExpiry is the instant from which s is a full bucket.
func tokenBucketExpiry(s bucketState, r Rate) int64 {
	if s.F <= 0 {
		return s.At
	}
	w := ceilNanos(s.F * float64(r.Window) / float64(r.Limit))
	w = settle(w, func(w int64) bool { return tokenDeficit(s, satAdd(s.At, w), r) == 0 })
	return satAdd(s.At, w)
}
