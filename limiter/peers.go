package limiter

import (
	"context"
	"hash/maphash"
	"slices"
	"sync"
	"time"
)

// This file is the engine side of caddy-ratelimit's approximate
// distributed mode: instances share no store, but each one periodically
// publishes how many units it counted in each of its sliding-log buckets
// (and when the oldest of them was admitted), and adds what the others
// published to its own count when it decides. The publishing (storage,
// file format, intervals) lives with the caller; PeerStore only combines.

// PeerUsage is what other instances last reported for one bucket: the
// units they counted inside the bucket's window, and the instant the
// oldest of them was admitted (zero when Count is 0).
type PeerUsage struct {
	Count  int64
	Oldest time.Time
}

// Peers tells a PeerStore what other instances counted. Both methods run
// on the request path and must not block on I/O.
type Peers interface {
	// Usage returns what other instances reported for c's bucket that is
	// still inside c's window at now.
	Usage(c *Check, now time.Time) PeerUsage
	// Charged records that c's bucket was charged locally at now, so the
	// caller can publish its usage.
	Charged(c *Check, now time.Time)
}

// PeerStore decides with an inner store (the local count, exact) plus the
// usage Peers reports (approximate: as old as the last exchange), the
// way caddy-ratelimit's distributed mode does for its sliding logs. A
// sliding_log check of cost n is admitted when
//
//	local + peers + n <= Limit
//
// and then charged to the inner store only; when it is denied because of
// what peers counted, Retry-After is the time until the oldest unit known
// (local or reported) leaves the window. Checks of buckets peers report
// nothing for go to the inner store untouched. It is meant for
// SlidingLog checks: for other algorithms the local count it derives from
// a peek is not a count of units.
//
// Decisions of one bucket that involve peer usage are serialized by a
// process-wide lock stripe, so the local part stays exact across the
// peek and the charge.
type PeerStore struct {
	inner Store
	peers Peers
	clock Clock
}

var _ Store = (*PeerStore)(nil)

// NewPeerStore returns a PeerStore over inner. Closing it does not close
// inner.
func NewPeerStore(inner Store, peers Peers, clock Clock) *PeerStore {
	if clock == nil {
		clock = SystemClock{}
	}
	return &PeerStore{inner: inner, peers: peers, clock: clock}
}

// Inner returns the store the local counts live in.
func (s *PeerStore) Inner() Store { return s.inner }

// peerStripes serialize the decisions of buckets with peer usage, process
// wide (handlers sharing a policy name share its buckets).
var (
	peerStripes [256]sync.Mutex
	peerSeed    = maphash.MakeSeed()
)

func peerStripe(c *Check) int {
	var h maphash.Hash
	h.SetSeed(peerSeed)
	h.WriteByte(byte(c.Algorithm))
	h.WriteString(c.Tenant)
	h.WriteByte(0)
	h.WriteString(c.Policy)
	h.WriteByte(0)
	h.WriteString(c.Part)
	return int(h.Sum64() % uint64(len(peerStripes)))
}

// LocalUsage turns the result of a cost-0 SlidingLog peek at now into the
// usage it describes: Limit - Remaining units, the oldest of which leaves
// the window after Reset.
func LocalUsage(r Rate, res Result, now time.Time) PeerUsage {
	n := r.Limit - res.Remaining
	if n <= 0 {
		return PeerUsage{}
	}
	return PeerUsage{Count: n, Oldest: now.Add(res.Reset - r.Window)}
}

// Decide implements Store.
func (s *PeerStore) Decide(ctx context.Context, checks []Check, results []Result) (bool, error) {
	now := s.clock.Now()
	usage := make([]PeerUsage, len(checks))
	any := false
	for i := range checks {
		if checks[i].Cost > 0 {
			usage[i] = s.peers.Usage(&checks[i], now)
			any = any || usage[i].Count > 0
		}
	}
	if !any {
		admitted, err := s.inner.Decide(ctx, checks, results)
		if err == nil {
			s.charged(checks, results, admitted, nil, now)
		}
		return admitted, err
	}

	var stripes []int
	for i := range checks {
		if usage[i].Count > 0 {
			stripes = append(stripes, peerStripe(&checks[i]))
		}
	}
	slices.Sort(stripes)
	stripes = slices.Compact(stripes)
	for _, i := range stripes {
		peerStripes[i].Lock()
	}
	defer func() {
		for _, i := range stripes {
			peerStripes[i].Unlock()
		}
	}()

	// The local count of each bucket with peer usage, from a cost-0 peek.
	peek := slices.Clone(checks)
	for i := range peek {
		peek[i].Cost = 0
	}
	if err := s.inner.Peek(ctx, peek, results); err != nil {
		return false, err
	}
	denied := make([]Result, len(checks))
	peerDenied := make([]bool, len(checks))
	enforcedDenied, shadowDenied := false, false
	for i := range checks {
		c, u := &checks[i], usage[i]
		if u.Count == 0 {
			continue
		}
		local := LocalUsage(c.Rate, results[i], now)
		if local.Count+u.Count+c.Cost <= c.Rate.Limit {
			continue
		}
		peerDenied[i] = true
		if c.Shadow {
			shadowDenied = true
		} else {
			enforcedDenied = true
		}
		wait := c.Rate.Window
		if c.Cost <= c.Rate.Limit {
			oldest := u.Oldest
			if local.Count > 0 && (oldest.IsZero() || local.Oldest.Before(oldest)) {
				oldest = local.Oldest
			}
			wait = max(oldest.Add(c.Rate.Window).Sub(now), time.Millisecond)
		}
		denied[i] = Result{Remaining: max(c.Rate.Limit-local.Count-u.Count, 0), RetryAfter: wait, Reset: wait}
	}

	var admitted bool
	if enforcedDenied {
		// Nothing is charged; the other checks say what they would do.
		if err := s.inner.Peek(ctx, checks, results); err != nil {
			return false, err
		}
	} else {
		call := checks
		if shadowDenied {
			call = slices.Clone(checks)
			for i := range call {
				if peerDenied[i] {
					call[i].Cost = 0
				}
			}
		}
		var err error
		if admitted, err = s.inner.Decide(ctx, call, results); err != nil {
			return false, err
		}
		s.charged(checks, results, admitted, peerDenied, now)
	}
	for i := range checks {
		switch {
		case peerDenied[i]:
			results[i] = denied[i]
		case usage[i].Count > 0:
			results[i].Remaining = max(results[i].Remaining-usage[i].Count, 0)
		}
	}
	return admitted, nil
}

// charged reports the buckets an admitted decision charged.
func (s *PeerStore) charged(checks []Check, results []Result, admitted bool, skip []bool, now time.Time) {
	if !admitted {
		return
	}
	for i := range checks {
		c := &checks[i]
		if c.Cost == 0 || (skip != nil && skip[i]) || (c.Shadow && !results[i].Allowed) {
			continue
		}
		s.peers.Charged(c, now)
	}
}

// Peek implements Store: the inner store's answer, with what peers
// counted taken off Remaining.
func (s *PeerStore) Peek(ctx context.Context, checks []Check, results []Result) error {
	if err := s.inner.Peek(ctx, checks, results); err != nil {
		return err
	}
	now := s.clock.Now()
	for i := range checks {
		if u := s.peers.Usage(&checks[i], now); u.Count > 0 {
			results[i].Remaining = max(results[i].Remaining-u.Count, 0)
		}
	}
	return nil
}

// Release implements Store.
func (s *PeerStore) Release(ctx context.Context, checks []Check) error {
	return s.inner.Release(ctx, checks)
}

// releaseLost implements lostReleaser (see releaseLostTo).
func (s *PeerStore) releaseLost(ctx context.Context, checks []Check) error {
	return releaseLostTo(ctx, s.inner, checks)
}

// Reset implements Store: it resets the local buckets; what peers counted
// goes when they next publish.
func (s *PeerStore) Reset(ctx context.Context, tenant string, policies []string) error {
	return s.inner.Reset(ctx, tenant, policies)
}

// Close implements Store. The inner store is not closed: its owner does.
func (s *PeerStore) Close() error { return nil }
