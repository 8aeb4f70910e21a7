package limiter

import "sync/atomic"

// LeaseEvent names what happened to leased units, for
// LeaseOptions.Observe and LeaseStats.
type LeaseEvent uint8

// Lease events. Every acquired unit ends up spent, returned or expired.
const (
	// LeaseAcquired: units taken from the shared store.
	LeaseAcquired LeaseEvent = iota
	// LeaseSpent: units served to a request.
	LeaseSpent
	// LeaseReturned: unused units given back to the shared store (lease
	// expired, config reload, shutdown).
	LeaseReturned
	// LeaseExpired: unused units that could not be given back: the give
	// back failed, the store was reset, or the store was not asked.
	LeaseExpired
	// LeaseLost: units a lease call whose reply was lost (a timeout, a
	// broken connection) may have taken from the shared store (it counts
	// what the call asked for: an upper bound). They were never acquired
	// here and cannot be served; the store gets them back when the window
	// ends or the bucket refills. (A call that also gave units back
	// carries an id, and its retry gives such units back: they are not
	// counted here.)
	LeaseLost
	// NumLeaseEvents is the number of lease events.
	NumLeaseEvents
)

var leaseEventNames = [NumLeaseEvents]string{"acquired", "spent", "returned", "expired", "lost"}

// String returns the event's metric label.
func (e LeaseEvent) String() string {
	if e < NumLeaseEvents {
		return leaseEventNames[e]
	}
	return "unknown"
}

// leaseCounters are a policy's lease units by event.
type leaseCounters [NumLeaseEvents]atomic.Int64

// counters returns the counters of policy.
func (s *LeaseStore) counters(policy string) *leaseCounters {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	c := s.stats[policy]
	if c == nil {
		c = new(leaseCounters)
		s.stats[policy] = c
	}
	return c
}

// count records n requests' worth of ev on every check of e.
func (s *LeaseStore) count(e *leaseEntry, ev LeaseEvent, n int64) {
	if n <= 0 {
		return
	}
	for i := range e.checks {
		units := n * e.checks[i].Cost
		if units <= 0 {
			continue
		}
		e.counters[i][ev].Add(units)
		if s.observe != nil {
			s.observe(e.checks[i].Policy, ev, units)
		}
	}
}

// LeaseStats is a policy's lease activity on one LeaseStore.
type LeaseStats struct {
	// Entries is the number of lease entries (sets of buckets) holding
	// units; Units the units they hold.
	Entries int64 `json:"entries"`
	Units   int64 `json:"units"`
	// DeniedEntries is the number of entries answering from the denial
	// cache right now.
	DeniedEntries int64 `json:"denied_entries"`
	// Acquired, Spent, Returned, Expired and Lost count units since the
	// store started (see LeaseEvent).
	Acquired int64 `json:"acquired"`
	Spent    int64 `json:"spent"`
	Returned int64 `json:"returned"`
	Expired  int64 `json:"expired"`
	Lost     int64 `json:"lost"`
}

// Stats returns the lease activity of every policy that leased.
func (s *LeaseStore) Stats() map[string]LeaseStats {
	out := map[string]LeaseStats{}
	s.statsMu.Lock()
	for p, c := range s.stats {
		out[p] = LeaseStats{
			Acquired: c[LeaseAcquired].Load(),
			Spent:    c[LeaseSpent].Load(),
			Returned: c[LeaseReturned].Load(),
			Expired:  c[LeaseExpired].Load(),
			Lost:     c[LeaseLost].Load(),
		}
	}
	s.statsMu.Unlock()
	now := s.clock.Now().UnixNano()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, e := range sh.m {
			e.mu.Lock()
			for j := range e.checks {
				st := out[e.checks[j].Policy]
				if e.units > 0 && now < e.expires {
					st.Entries++
					st.Units += e.units * e.checks[j].Cost
				}
				if now < e.deniedUntil {
					st.DeniedEntries++
				}
				out[e.checks[j].Policy] = st
			}
			e.mu.Unlock()
		}
		sh.mu.Unlock()
	}
	return out
}
