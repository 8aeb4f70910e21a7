package limiter

import (
	"context"
	"errors"
	"time"
)

// decideEntry decides one request of e. retry means e was forgotten
// meanwhile: look it up again.
func (s *LeaseStore) decideEntry(ctx context.Context, e *leaseEntry, checks []Check, results []Result, now int64) (admitted, retry bool, err error) {
	e.mu.Lock()
	e.noteDemand(now)
	for {
		switch {
		case e.dead:
			e.mu.Unlock()
			return false, true, nil
		case e.unleasable:
			e.mu.Unlock()
			admitted, err = s.inner.Decide(ctx, checks, results)
			return admitted, false, err
		case now < e.deniedUntil:
			e.fill(results, now, OriginDenialCache)
			e.mu.Unlock()
			return false, false, nil
		case e.units > 0 && now < e.expires:
			e.units--
			e.fill(results, now, OriginLease)
			if e.prefetchDue(now) && !s.closed.Load() {
				s.prefetch(ctx, e, now) // releases e.mu
			} else {
				e.mu.Unlock()
			}
			s.count(e, LeaseSpent, 1)
			return true, false, nil
		case now < e.reserveUntil:
			e.mu.Unlock()
			admitted, err = s.reserve(ctx, e, checks, results, now)
			return admitted, false, err
		}
		f := e.flight
		if f == nil {
			break
		}
		// Another request of this entry is refilling: wait for it.
		e.mu.Unlock()
		select {
		case <-f.done:
		case <-ctx.Done():
			return false, false, ctx.Err()
		}
		if f.err != nil {
			return false, false, f.err
		}
		now = s.clock.Now().UnixNano()
		e.mu.Lock()
	}
	admitted, reserve, err := s.refill(ctx, e, checks, results, now)
	if reserve {
		admitted, err = s.reserve(ctx, e, checks, results, now)
	}
	return admitted, false, err
}

// reserve decides a request of an entry with a delay whose buckets hold
// nothing to lease: by the inner store, which may hand it a turn. A turn
// too far away is cached as a denial until the moment it could come
// within the delay (until then the store would deny it too).
func (s *LeaseStore) reserve(ctx context.Context, e *leaseEntry, checks []Check, results []Result, now int64) (bool, error) {
	// No flight: a reset meanwhile drops e (see forget), and what this
	// sets goes with it.
	admitted, err := s.inner.Decide(ctx, checks, results)
	if err != nil {
		return false, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if admitted {
		var wait time.Duration
		for i := range checks {
			wait = max(wait, results[i].Wait)
		}
		e.reserveUntil = max(e.reserveUntil, now+int64(wait))
		return true, nil
	}
	var until time.Duration
	for i := range checks {
		if r := &results[i]; !r.Allowed && !checks[i].Shadow {
			until = max(until, r.RetryAfter-checks[i].Rate.Delay)
		}
	}
	copy(e.base, results[:len(checks)])
	e.baseAt = now
	e.deniedUntil = now + int64(until)
	return false, nil
}

// prefetch tops up e's lease while units are left, so that a busy entry's
// requests keep being served from it during the round trip instead of
// all waiting for a refill once it is empty. The request that crossed the
// low-water mark makes the call after its own result is written; requests
// that find the lease empty meanwhile wait for it as for a refill. Called
// with e.mu held; returns with it released.
func (s *LeaseStore) prefetch(ctx context.Context, e *leaseEntry, now int64) {
	f := &leaseFlight{done: make(chan struct{})}
	e.flight, e.prefetched = f, true
	if cap(e.scratch) < len(e.checks) {
		e.scratch = make([]Result, len(e.checks))
	}
	results := e.scratch[:len(e.checks)]
	// The units left are still served: the top-up brings the lease to
	// the demand of a ttl, not past it (prefetchDue checked it is short).
	req := LeaseRequest{
		Checks:    e.checks,
		Want:      e.want(now) - e.units,
		Instances: s.instances(),
		TTL:       time.Duration(e.ttl),
	}
	resets := e.resets
	e.mu.Unlock()

	panicked := true
	defer func() {
		if panicked {
			// The units left still serve; the waiters look again.
			e.abandon(f, nil)
		}
	}()
	g, err := s.taker.Lease(context.WithoutCancel(ctx), &req, results)
	panicked = false

	e.mu.Lock()
	defer e.mu.Unlock()
	e.flight = nil
	defer close(f.done)
	switch {
	case err != nil:
		if mayHaveRun(err) {
			s.count(e, LeaseLost, req.Want)
		}
		// The units left still serve; the waiters, if any, refill.
	case e.resets != resets:
		// Reset meanwhile: the units were charged in buckets the reset
		// emptied. Serving them would admit that many more than the
		// fresh limit, and giving them back would credit the new buckets.
		s.count(e, LeaseExpired, g.Requests)
		e.prefetched = false
	case g.Requests > 0:
		at := s.clock.Now().UnixNano()
		s.count(e, LeaseAcquired, g.Requests)
		e.units += g.Requests
		// The next top-up comes at a quarter of what the lease now holds:
		// counted from a small top-up alone, the mark would sit below one
		// unit and the lease would run dry before the next.
		e.lastGrant, e.prefetched = e.units, false
		e.at = g.At
		if end := at + int64(g.Expires); end > e.expires {
			e.expires = end
			e.watch(e.expires)
		}
		copy(e.base, results)
		e.baseAt = at
	}
	// A refusal (the buckets have no share left for this instance) keeps
	// prefetched set: the lease runs out and is refilled as usual.
}

// refill takes a new lease for e and serves the calling request from it.
// Called with e.mu held; returns with it released. reserve means the
// refill was denied and e has a delay: decide the request with reserve.
func (s *LeaseStore) refill(ctx context.Context, e *leaseEntry, checks []Check, results []Result, now int64) (admitted, reserve bool, err error) {
	want := e.want(now)
	if want == 1 && e.units == 0 && !e.delay {
		admitted, err = s.decideOne(ctx, e, checks, results, now)
		return admitted, false, err
	}
	f := &leaseFlight{done: make(chan struct{})}
	e.flight = f
	req := LeaseRequest{
		Checks:    checks,
		Want:      want,
		Instances: s.instances(),
		TTL:       time.Duration(e.ttl),
	}
	if e.units > 0 {
		// An expired lease: its units go back in the same call, which
		// then carries an id so that they go back once.
		req.GiveBack, req.GiveBackAt, req.ID = e.units, e.at, NewChargeID()
		e.units = 0
	}
	resets := e.resets
	e.mu.Unlock()

	panicked := true
	defer func() {
		if panicked {
			// The units being given back are owed all the same; under
			// its id, the give-back can be sent again whether or not
			// this call ran.
			s.count(e, LeaseExpired, req.GiveBack)
			s.retryGiveBack(&req, errStorePanicked)
			e.abandon(f, errStorePanicked)
		}
	}()
	// The refill serves the waiters too: the caller going away must not
	// cancel it (the store's own timeout bounds it).
	g, err := s.taker.Lease(context.WithoutCancel(ctx), &req, results)
	panicked = false

	e.mu.Lock()
	e.flight = nil
	defer close(f.done)
	defer e.mu.Unlock()
	if err != nil {
		s.count(e, LeaseExpired, req.GiveBack)
		s.retryGiveBack(&req, err)
		if errors.Is(err, ErrLeaseUnsupported) {
			e.unleasable = true
			e.mu.Unlock()
			admitted, err := s.inner.Decide(ctx, checks, results)
			e.mu.Lock()
			return admitted, false, err
		}
		if mayHaveRun(err) && req.ID == "" {
			// The store may have run the call: what it took is lost.
			s.count(e, LeaseLost, req.Want)
		}
		f.err = err
		return false, false, err
	}
	s.count(e, LeaseReturned, req.GiveBack)
	if e.resets != resets {
		// Reset meanwhile (see prefetch): the answer is this request's
		// alone; nothing of it is cached or kept.
		for i := range results[:len(checks)] {
			results[i].From = OriginStore
			if g.Requests > 0 {
				results[i].At = g.At * int64(time.Microsecond)
			}
		}
		if g.Requests <= 0 {
			return false, false, nil
		}
		s.count(e, LeaseAcquired, g.Requests)
		s.count(e, LeaseSpent, 1)
		s.count(e, LeaseExpired, g.Requests-1)
		return true, false, nil
	}
	copy(e.base, results[:len(checks)])
	e.baseAt = now
	if g.Requests <= 0 {
		wait := e.baseRetryAfter()
		for i := range results[:len(checks)] {
			results[i].From = OriginStore
		}
		if e.delay {
			// The request may get a turn from the store, and so may the
			// next ones until the buckets hold a unit again.
			e.reserveUntil = now + int64(wait)
			return false, true, nil
		}
		e.deniedUntil = now + int64(wait)
		return false, false, nil
	}
	s.count(e, LeaseAcquired, g.Requests)
	s.count(e, LeaseSpent, 1)
	e.units = g.Requests - 1
	e.lastGrant, e.prefetched = g.Requests, false
	e.at = g.At
	e.expires = now + int64(g.Expires)
	e.watch(e.expires)
	for i := range results[:len(checks)] {
		results[i].Remaining += e.units * checks[i].Cost
		results[i].From = OriginStore
		// Charged with the lease, at its instant (a give-back needs it).
		results[i].At = g.At * int64(time.Microsecond)
	}
	return true, false, nil
}

// decideOne decides the request of an entry whose next lease would be one
// request's worth (an entry seen about once a ttl: the thin tail of a
// large tenant population, or an entry's first request) with one plain
// decision instead: a lease of one unit is a decision, and the decide
// script costs Redis less than the lease script (no give-back, no share
// of the instances). A denial is cached as a refused lease's is. Other
// requests of the entry that wait for it share a store error, as a
// refill's waiters do (so an unreachable Redis costs them one timeout,
// not two); otherwise they decide for themselves after it (it took
// nothing for them), and its caller's context, which it runs with, ends
// only its own call. Called with e.mu held; returns with it released;
// the error is the store's, for the fail modes.
func (s *LeaseStore) decideOne(ctx context.Context, e *leaseEntry, checks []Check, results []Result, now int64) (admitted bool, err error) {
	f := &leaseFlight{done: make(chan struct{})}
	e.flight = f
	resets := e.resets
	e.mu.Unlock()
	panicked := true
	defer func() {
		if panicked {
			e.abandon(f, errStorePanicked)
		}
	}()
	admitted, err = s.inner.Decide(ctx, checks, results)
	panicked = false
	e.mu.Lock()
	defer e.mu.Unlock()
	e.flight = nil
	if err != nil && ctx.Err() == nil {
		f.err = err
	}
	close(f.done)
	if err != nil {
		return false, err
	}
	if !admitted && e.resets == resets {
		e.cacheDenial(results, now)
	}
	return admitted, nil
}

// cacheDenial keeps the store's denial of e's checks (results) at now and
// answers them from it until its Retry-After. Called with e.mu held.
func (e *leaseEntry) cacheDenial(results []Result, now int64) {
	copy(e.base, results[:len(e.base)])
	e.baseAt = now
	e.deniedUntil = now + int64(e.baseRetryAfter())
}

// baseRetryAfter is the longest Retry-After of the store's last answer
// (e.base) among its denying checks.
func (e *leaseEntry) baseRetryAfter() time.Duration {
	var wait time.Duration
	for i := range e.base {
		if !e.base[i].Allowed {
			wait = max(wait, e.base[i].RetryAfter)
		}
	}
	return wait
}

// fill writes the results of a request served locally.
func (e *leaseEntry) fill(results []Result, now int64, from Origin) {
	elapsed := time.Duration(now - e.baseAt)
	for i := range e.base {
		b := &e.base[i]
		r := Result{Allowed: b.Allowed, Remaining: b.Remaining, From: from}
		r.Reset = max(b.Reset-elapsed, 0)
		if from == OriginLease {
			r.At = e.at * int64(time.Microsecond)
			r.Remaining += e.units * e.checks[i].Cost
		} else if !b.Allowed {
			r.RetryAfter = max(b.RetryAfter-elapsed, 1)
		}
		results[i] = r
	}
}

// leaseRecent is how many request instants an entry keeps: below this
// many requests per ttl, its demand is counted exactly (see want).
const leaseRecent = 8

// noteDemand counts one request at now.
func (e *leaseEntry) noteDemand(now int64) {
	if e.lastSeen != 0 && now-e.lastSeen >= e.ttl {
		// Nothing counted is within the last ttl: start afresh, as a new
		// entry would (so forgetting an idle entry changes nothing).
		e.demandCur, e.demandPrev = 0, 0
	}
	e.lastSeen = now
	e.recent[e.recentNext%leaseRecent] = now
	e.recentNext++
	if d := now - e.demandStart; d >= e.ttl {
		if d >= 2*e.ttl {
			e.demandPrev = 0
		} else {
			e.demandPrev = e.demandCur
		}
		e.demandCur = 0
		e.demandStart = now - d%e.ttl
	}
	e.demandCur++
}

// want is the size of the next lease: the requests seen over the last
// ttl, from 1 to max. Fewer than leaseRecent are counted exactly, from
// their instants; more are estimated from the two ttl-long periods (the
// previous one weighted by its overlap with the last ttl).
//
// The exact count is what keeps a thin entry's leases from expiring: at
// a request every 0.65 ttl, the last ttl holds two requests (this one
// and the one before), and a lease of two is spent before it expires.
// The estimate would say up to three just after a period with two began
// (all of the previous period still counts), and a lease of three would
// expire with a unit left, which costs a give-back: one more call, with
// an id.
func (e *leaseEntry) want(now int64) int64 {
	n := int64(0)
	for _, at := range e.recent {
		if at != 0 && now-at < e.ttl {
			n++
		}
	}
	if n < leaseRecent {
		return min(max(n, 1), e.max)
	}
	d := float64(e.demandCur)
	if e.demandPrev > 0 {
		frac := float64(now-e.demandStart) / float64(e.ttl)
		d += float64(e.demandPrev) * max(1-frac, 0)
	}
	n = int64(d + 0.999)
	return min(max(n, 1), e.max)
}

// prefetchOn lets benchmarks compare prefetching with refills only.
var prefetchOn = true

// prefetchable reports whether a lease of checks may be topped up before
// it runs out. Token bucket and GCRA units mean the same whenever they are
// served (a give back ignores when they were charged), so a grant can join
// the units left; a window's units belong to their window, so window
// leases are refilled only once empty or expired.
func prefetchable(checks []Check) bool {
	for i := range checks {
		if a := checks[i].Algorithm; a != TokenBucket && a != GCRA {
			return false
		}
	}
	return true
}

// prefetchDue reports whether the request that just took a unit of e
// should top the lease up: a quarter of the last grant is left, nothing is
// in flight, no prefetch was made for this grant, and the units left are
// fewer than the entry's demand over a ttl (a top-up only brings the
// lease up to that demand, see prefetch). Called with e.mu held.
func (e *leaseEntry) prefetchDue(now int64) bool {
	return e.prefetchable && !e.prefetched && e.flight == nil && e.units > 0 && e.units*4 <= e.lastGrant &&
		e.want(now) > e.units
}
