package limiter

// fixedWindow decides one request with a fixed window counter.
//
// Time is cut into windows of length W = Window aligned to the Unix epoch
// (a window starts at now - now mod W), so every instance agrees on them.
// A request of cost n is admitted when count + n <= Limit; the count starts
// from zero in every window. Cheap and exact per window, but up to
// 2 x Limit can pass around a boundary (Limit at its end, Limit right after).
//
//   - Remaining: Limit - count, after the request when admitted.
//   - RetryAfter (denied): time until the window ends.
//   - Reset: time until the window ends; 0 when the window is empty.
//   - n > Limit never fits: denied with RetryAfter = Window.
//
// State: At = start of the window, N = its count.
func fixedWindow(s bucketState, now int64, r Rate, cost int64) (Result, bucketState) {
	W := int64(r.Window)
	t := max(now, s.At)
	cur := bucketState{At: windowStart(t, W)}
	if cur.At == s.At {
		cur.N = s.N
	}
	end := cur.At + W - now
	peek := fwResult(cur, end, r)
	switch {
	case cost == 0:
		return peek, cur
	case cost > r.Limit:
		return nothingFits(peek, r), cur
	case cur.N+cost > r.Limit:
		return deniedResult(peek, end), cur
	}
	cur.N += cost
	res := fwResult(cur, end, r)
	res.Allowed = true
	return res, cur
}

// fwResult reports Remaining and Reset of cur, whose window ends in end ns.
func fwResult(cur bucketState, end int64, r Rate) Result {
	if cur.N == 0 {
		return Result{Allowed: true, Remaining: r.Limit}
	}
	return Result{Allowed: true, Remaining: max(r.Limit-cur.N, 0), Reset: nsDuration(end)}
}
