package limiter

// concurrency decides one request against a limit of requests in flight.
//
// The bucket counts units in flight. A request of cost n is admitted when
// inflight + n <= Limit and then holds n units until the store's Release
// gives them back; Window is not used.
//
//   - Remaining: Limit - inflight, after the request when admitted.
//   - RetryAfter (denied): always 1s. Nothing tells when a request in
//     flight will finish, so this is a polite guess, not a promise.
//   - Reset: 1s while anything is in flight (same guess), 0 when idle.
//   - n > Limit never fits: denied with RetryAfter = 1s.
//
// State: N = units in flight.
func concurrency(s bucketState, _ int64, r Rate, cost int64) (Result, bucketState) {
	peek := concurrencyResult(s.N, r)
	if cost == 0 {
		return peek, s
	}
	if cost > r.Limit || s.N > r.Limit-cost {
		return deniedResult(peek, int64(concurrencyRetry)), s
	}
	s.N += cost
	res := concurrencyResult(s.N, r)
	res.Allowed = true
	return res, s
}

// concurrencyRelease gives n units back, never going below zero (a Release
// after Reset, or without a matching Decide, is harmless).
func concurrencyRelease(s bucketState, n int64) bucketState {
	s.N = max(s.N-n, 0)
	return s
}

func concurrencyResult(inflight int64, r Rate) Result {
	res := Result{Allowed: true, Remaining: max(r.Limit-inflight, 0)}
	if inflight > 0 {
		res.Reset = concurrencyRetry
	}
	return res
}
