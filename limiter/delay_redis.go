package limiter

// Delays on Redis. A check whose request may wait for its turn keeps its
// layout (CHECK_ARGS): its algorithm argument becomes "token_bucket_delay"
// or "gcra_delay" (lua/delay.lua), and its min_interval argument, which
// those algorithms never use, the longest wait in µs. Only the decide
// script in its decide, dry and peek modes is sent such checks; force
// and lease calls send the check as it is (they never hand out turns).
// The reply of an allowed check that must wait carries the wait in its
// retry_after field, which run moves to Result.Wait.

// argDelay is the Lua algorithm name of a check that may wait, boxed once.
var argDelay = [numAlgorithms]any{TokenBucket: "token_bucket_delay", GCRA: "gcra_delay"}

// handsOutTurns reports whether script may reserve turns.
func handsOutTurns(script *redisScript) bool {
	return script == scriptDecide || script == scriptDry || script == scriptPeek
}

// setDelayArgs turns the checks idx that may wait, whose arguments
// appendCheckArgs has just appended to sc.args, into checks of their
// delay algorithm. It must run before anything else is appended.
func (sc *redisScratch) setDelayArgs(checks []Check, idx []int) {
	base := len(sc.args) - checkArgs*len(idx)
	for j, i := range idx {
		c := &checks[i]
		if c.Rate.Delay <= 0 || argDelay[c.Algorithm] == nil {
			continue
		}
		sc.args[base+checkArgs*j] = argDelay[c.Algorithm]
		sc.nums[checkNums*j+3] = micros(c.Rate.Delay)
	}
}

// takeWaits moves the wait of every allowed check of idx from RetryAfter,
// where the reply carries it, to Wait.
func takeWaits(idx []int, results []Result) {
	for _, i := range idx {
		if r := &results[i]; r.Allowed && r.RetryAfter > 0 {
			r.Wait, r.RetryAfter = r.RetryAfter, 0
		}
	}
}
