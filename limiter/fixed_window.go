package limiter

// fixedWindow decides one request with a fixed window counter.
//
// Time is cut into windows of length W = Window aligned to the Unix epoch
// (a window starts at now - now mod W), so every instance agrees on them;
// with a Calendar, into the calendar's periods instead (days, ISO weeks or
// months of a time zone; see Calendar). A request of cost n is admitted
// when count + n <= Limit; the count starts from zero in every window.
// Cheap and exact per window, but up to 2 x Limit can pass around a
// boundary (Limit at its end, Limit right after).
//
//   - Remaining: Limit - count, after the request when admitted.
//   - RetryAfter (denied): time until the window ends.
//   - Reset: time until the window ends; 0 when the window is empty.
//   - n > Limit never fits: denied with RetryAfter = the window's length
//     (Window; with a Calendar, the current period's).
//
// State: At = start of the window, N = its count.
func fixedWindow(s bucketState, now int64, r Rate, cost int64) (Result, bucketState) {
	t := max(now, s.At)
	start, stop := fixedWindowAt(t, r)
	cur := bucketState{At: start}
	if cur.At == s.At {
		cur.N = s.N
	}
	end := stop - now
	peek := fwResult(cur, end, r)
	switch {
	case cost == 0:
		return peek, cur
	case cost > r.Limit:
		return Result{Remaining: peek.Remaining, RetryAfter: nsDuration(stop - start), Reset: peek.Reset}, cur
	case cur.N+cost > r.Limit:
		return deniedResult(peek, end), cur
	}
	cur.N += cost
	res := fwResult(cur, end, r)
	res.Allowed = true
	return res, cur
}

// fixedWindowAt returns the start and end of the window of r that holds t.
func fixedWindowAt(t int64, r Rate) (start, end int64) {
	if r.Calendar != nil {
		return r.Calendar.Period(t)
	}
	W := int64(r.Window)
	start = windowStart(t, W)
	return start, satAdd(start, W)
}

// fixedWindowEnd returns the end of the window of r that starts at start.
func fixedWindowEnd(start int64, r Rate) int64 {
	if r.Calendar != nil {
		_, end := r.Calendar.Period(start)
		return end
	}
	return satAdd(start, int64(r.Window))
}

// fwResult reports Remaining and Reset of cur, whose window ends in end ns.
func fwResult(cur bucketState, end int64, r Rate) Result {
	if cur.N == 0 {
		return Result{Allowed: true, Remaining: r.Limit}
	}
	return Result{Allowed: true, Remaining: max(r.Limit-cur.N, 0), Reset: nsDuration(end)}
}
