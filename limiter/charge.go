package limiter

import "context"

var _ Charger = (*MemoryStore)(nil)

// Charge implements Charger with the semantics of RedisStore.Charge: each
// check is charged min(Cost, what its bucket holds) units, in order,
// whatever the others do (two checks of one bucket are chained);
// min_interval (except for the bucket's expiry), delays and shadow flags
// are ignored and concurrency
// checks are never charged. charged[i] receives the units charged, or
// ChargeRefused for an invalid check, which is skipped.
func (m *MemoryStore) Charge(_ context.Context, checks []Check, charged []int64) error {
	if len(charged) < len(checks) {
		return errShortResults
	}
	forced := make([]Check, 0, len(checks))
	idx := make([]int, 0, len(checks))
	for i := range checks {
		if checks[i].validate() != nil {
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
		var units int64
		if c.Algorithm != Concurrency {
			peek, _ := evalAlgorithm(c.Algorithm, base, log, now, r, 0)
			units = min(c.Cost, peek.Remaining)
		}
		c.Cost = units
		sc.charge[i] = false
		sc.cur[f] = base
		if units > 0 {
			if res, next := evalAlgorithm(c.Algorithm, base, log, now, r, units); res.Allowed {
				sc.charge[i], sc.next[i], sc.cur[f] = true, next, next
			} else {
				units = 0
			}
		}
		charged[idx[i]] = units
	}
	m.charge(sc, forced, now)
	m.unlock(sc)
	m.putScratch(sc)
	return nil
}
