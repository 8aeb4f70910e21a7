package limiter

// slidingWindow decides one request with the sliding window counter.
//
// Time is cut into fixed windows of length W = Window aligned to the Unix
// epoch (a window starts at now - now mod W), so every instance agrees on
// them. The bucket counts units admitted in the current window (cur) and in
// the previous one (prev) and approximates the trailing window by assuming
// the previous window's units were spread evenly:
//
//	weighted = prev x (1 - elapsed/W) + cur     elapsed = now - window start
//
// A request of cost n is admitted when weighted + n <= Limit; then cur += n.
// Unlike fixed_window, a burst of Limit at the end of one window keeps
// counting, fading out linearly, during the next.
//
//   - Remaining: floor(Limit - weighted), after the request when admitted.
//   - RetryAfter (denied): exact time until weighted + n <= Limit, which may
//     lie in the next window (where prev becomes today's cur) or the one
//     after; rounded up to the nanosecond.
//   - Reset: time until the weighted count has dropped enough to free one
//     more whole unit; 0 when both windows are empty.
//   - n > Limit never fits: denied with RetryAfter = Window.
//
// State: At = start of the current window, N = cur, Prev = prev. A window
// that does not follow the stored one (a gap, or a changed Window) starts
// from zero.
func slidingWindow(s bucketState, now int64, r Rate, cost int64) (Result, bucketState) {
	cur, e := swRoll(s, now, r)
	pw := swPrevWeight(cur, e, r)
	peek := swResult(s, cur, pw, now, r)
	switch {
	case cost == 0:
		return peek, cur
	case cost > r.Limit:
		return nothingFits(peek, r), cur
	case !swFits(cur, pw, r, cost):
		return deniedResult(peek, swWait(s, now, r, cost)), cur
	}
	cur.N += cost
	res := swResult(cur, cur, pw, now, r)
	res.Allowed = true
	return res, cur
}

// swRoll moves s to the window that holds now (or the stored window when
// the clock went back) and returns it with the time elapsed in it.
func swRoll(s bucketState, now int64, r Rate) (bucketState, int64) {
	W := int64(r.Window)
	t := max(now, s.At)
	ws := windowStart(t, W)
	switch ws {
	case s.At:
		return s, t - ws
	case s.At + W:
		return bucketState{At: ws, Prev: s.N}, t - ws
	}
	return bucketState{At: ws}, t - ws
}

// swPrevWeight is the weighted part of the previous window's count,
// prev x (W - elapsed) / W, of a rolled state.
func swPrevWeight(cur bucketState, elapsed int64, r Rate) float64 {
	if cur.Prev <= 0 {
		return 0
	}
	return float64(cur.Prev) * float64(int64(r.Window)-elapsed) / float64(r.Window)
}

// swFits reports whether n more units fit in a rolled state whose previous
// window weighs pw: prev x (W - elapsed) / W + cur + n <= Limit, compared
// as pw <= Limit - cur - n so that a tiny pw is never absorbed by a large
// count in float64.
func swFits(cur bucketState, pw float64, r Rate, n int64) bool {
	room := r.Limit - cur.N - n
	return room >= 0 && pw <= float64(room)
}

// swResult reports Remaining and Reset of the rolled state cur whose
// previous window weighs pw, as an allowed answer; waits are computed from
// src, the state as stored. Remaining is Limit - cur - ceil(pw), the
// largest n for which swFits holds.
func swResult(src, cur bucketState, pw float64, now int64, r Rate) Result {
	rem := r.Limit - cur.N - ceilNanos(pw)
	rem = min(max(rem, 0), r.Limit)
	res := Result{Allowed: true, Remaining: rem}
	if rem < r.Limit {
		res.Reset = nsDuration(swWait(src, now, r, rem+1))
	}
	return res
}

// swWait returns how long from now until s, left alone, admits n units
// (n <= Limit).
func swWait(s bucketState, now int64, r Rate, n int64) int64 {
	W := int64(r.Window)
	L := r.Limit
	cur, e := swRoll(s, now, r)
	base := cur.At + e - now // > 0 only when the clock went back
	var w int64
	switch {
	case cur.N+n <= L:
		// Within the current window, once prev has faded enough:
		// prev x (W - e') / W <= L - cur - n.
		if cur.Prev > 0 {
			need := float64(W) - float64(L-cur.N-n)*float64(W)/float64(cur.Prev)
			if en := ceilNanos(need); en > e {
				w = en - e
			}
		}
	default:
		// Not before the next window, where prev' = cur and cur' = 0:
		// cur x (W - e') / W <= L - n.
		w = W - e
		if cur.N > L-n {
			w += ceilNanos(float64(W) - float64(L-n)*float64(W)/float64(cur.N))
		}
	}
	w = satAdd(w, base)
	return settle(w, func(w int64) bool {
		c, e := swRoll(s, satAdd(now, w), r)
		return swFits(c, swPrevWeight(c, e, r), r, n)
	})
}
