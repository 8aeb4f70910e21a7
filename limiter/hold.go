package limiter

// Holds: concurrency slots given back once.
//
// A concurrency slot is a unit of a counter, taken by a decision and given
// back by Release when the request ends. A counter alone cannot tell
// whether a given request holds a slot: an acquire whose reply was lost
// (a timeout, a paused Redis, a client gone while the call was on the
// wire) may or may not have run, and a release sent blindly could free
// another request's slot, or a retried release free two. So each
// concurrency check of positive cost carries an id of its own
// (Check.Hold, made by Decision.Decide): RedisStore's acquire records
// <prefix>:once:{<tenant>}:<hold> as "held" with the slot, and its
// release gives the slot back only against that record, deleting it; a
// release that finds no record leaves "gone" in its place, so that an
// acquire still on its way charges nothing when it runs (lua/decide.lua,
// lua/release.lua). A release is then safe to send for an acquire whose
// reply was lost, and to retry: DecideOrFallback and Decision.Release keep
// such releases in the fallback's Recorder (RetryRelease), which sends them
// until the store answers.
//
// The cost: an acquire reads and writes one more key, a release reads and
// deletes it. A record lives until its release (at most HoldTTL); a "gone"
// one IdempotencyTTL.

// held reports whether c takes slots under an id: a concurrency check of
// positive cost with Hold set.
func held(c *Check) bool {
	return c.Algorithm == Concurrency && c.Cost > 0 && c.Hold != ""
}

// holdsAll reports whether the checks idx hold slots, every one of their
// concurrency checks of positive cost under an id (a check without one
// would not be told apart by the script, which gives a hold key to each).
func holdsAll(checks []Check, idx []int) bool {
	any := false
	for _, i := range idx {
		c := &checks[i]
		if c.Algorithm == Concurrency && c.Cost > 0 {
			if c.Hold == "" {
				return false
			}
			any = true
		}
	}
	return any
}

// appendHoldKeys appends to keys the hold key of every check of idx that
// held reports, in order: the layout decide.lua (mode acquire) and
// release.lua read.
func (s *RedisStore) appendHoldKeys(sc *redisScratch, keys []string, checks []Check, idx []int) []string {
	for _, i := range idx {
		if c := &checks[i]; held(c) {
			sc.buf = appendOnceKey(sc.buf[:0], s.prefix, c.Tenant, c.Hold)
			keys = append(keys, string(sc.buf))
		}
	}
	return keys
}
