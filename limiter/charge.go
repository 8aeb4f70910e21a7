package limiter

import "context"

var _ Charger = (*MemoryStore)(nil)

// Charge implements Charger with the semantics of RedisStore.Charge:
// each check moves its units, in order, whatever the others do (two
// checks of one bucket are chained); min_interval (except for the
// bucket's expiry), delays and shadow flags are ignored and concurrency
// checks are never charged. A negative cost with ChargedAt gives units
// back to window and log buckets too (see refundAt). charged[i] receives the units moved, or
// ChargeRefused for an invalid check, which is skipped. id is ignored: a
// call in process never loses its answer, so it is never retried.
func (m *MemoryStore) Charge(_ context.Context, _ string, checks []Check, charged []int64) error {
	if len(charged) < len(checks) {
		return errShortResults
	}
	forced := make([]Check, 0, len(checks))
	idx := make([]int, 0, len(checks))
	for i := range checks {
		if chargeable(&checks[i]) != nil {
			charged[i] = ChargeRefused
			continue
		}
		c := checks[i]
		c.Shadow, c.Rate.Delay = false, 0
		forced = append(forced, c)
		idx = append(idx, i)
	}
	if len(forced) == 0 {
		return nil
	}
	now := m.now()
	sc := m.prepare(forced)
	m.lock(sc)
	for i := range forced {
		c := &forced[i]
		f := sc.first[i]
		base, log := m.current(sc, c, i, now)
		// Decided without min_interval; the bucket keeps it (its TTL).
		r := c.Rate
		r.MinInterval = 0
		sc.charge[i] = false
		sc.cur[f] = base
		var units int64
		switch {
		case c.Cost < 0:
			// A bucket that is not there has nothing to give back.
			e := sc.ent[f]
			switch {
			case e == nil:
			case givesBack(c.Algorithm):
				units = c.Cost
				next := refundUnits(c.Algorithm, base, r, -c.Cost)
				sc.charge[i], sc.next[i], sc.cur[f] = true, next, next
			case c.ChargedAt <= 0 || c.Algorithm == Concurrency:
			case c.Algorithm == SlidingLog:
				// Its units are in its log, changed here (charge adds
				// nothing for a negative cost).
				units = -e.log.remove(c.ChargedAt, -c.Cost)
				sc.charge[i], sc.next[i] = true, base
			default:
				units = c.Cost
				next := refundAt(c.Algorithm, base, r, -c.Cost, c.ChargedAt)
				sc.charge[i], sc.next[i], sc.cur[f] = true, next, next
			}
		case c.Algorithm != Concurrency:
			peek, _ := evalAlgorithm(c.Algorithm, base, log, now, r, 0)
			units = min(c.Cost, peek.Remaining)
			if units <= 0 {
				units = 0
				break
			}
			if res, next := evalAlgorithm(c.Algorithm, base, log, now, r, units); res.Allowed {
				sc.charge[i], sc.next[i], sc.cur[f] = true, next, next
			} else {
				units = 0
			}
		}
		c.Cost = units
		charged[idx[i]] = units
	}
	m.charge(sc, forced, now)
	m.unlock(sc)
	m.putScratch(sc)
	return nil
}
