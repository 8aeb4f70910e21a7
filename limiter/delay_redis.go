package limiter

import "context"

// Delays on Redis. A check whose request may wait for its turn keeps its
// layout (CHECK_ARGS): its algorithm argument becomes "token_bucket_delay"
// or "gcra_delay" (lua/delay.lua), and its min_interval argument, which
// those algorithms never use, the longest wait in µs. Only the decide
// script in its decide, dry and peek modes is sent such checks; force,
// refund and lease calls send the check as it is (they never hand out
// turns). The reply of an allowed check that must wait carries the wait
// in its retry_after field, which run moves to Result.Wait.

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

// Refund implements Refunder with the refund script (lua.Refund), one
// call per cluster slot, each with the store's Timeout.
func (s *RedisStore) Refund(ctx context.Context, checks []Check) error {
	var refund []Check
	for i := range checks {
		c := &checks[i]
		if err := c.validate(); err != nil {
			return err
		}
		if refundable(c) {
			refund = append(refund, *c)
		}
	}
	if len(refund) == 0 {
		return nil
	}
	sc := s.getScratch()
	defer s.putScratch(sc)
	multi := s.prepare(sc, refund)
	groups := [][]int{sc.all}
	if multi {
		groups = sc.groups()
	}
	sc.results = resizeSlice(sc.results, len(refund))
	results := sc.results
	ctx, cancel := s.withTimeout(ctx, sc)
	defer cancel()
	for _, g := range groups {
		// Token bucket and GCRA refunds do not depend on the instant of
		// the charge.
		if _, _, err := s.run(ctx, sc, scriptRefund, 0, refund, g, results); err != nil {
			return err
		}
	}
	return nil
}
