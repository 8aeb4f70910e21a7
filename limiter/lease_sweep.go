package limiter

import (
	"context"
	"errors"
	"time"
)

// Reset implements Store: it forgets this instance's leases and cached
// denials of tenant in policies, then resets the inner store. Other
// instances keep theirs until told (see Forget).
func (s *LeaseStore) Reset(ctx context.Context, tenant string, policies []string) error {
	for _, p := range policies {
		s.Forget(tenant, p)
	}
	return s.inner.Reset(ctx, tenant, policies)
}

// Forget drops this instance's leases (their units count as expired) and
// cached denials of tenant, of policy only when it is not empty, without
// asking the store: for instances told that another one reset the tenant.
func (s *LeaseStore) Forget(tenant, policy string) {
	s.forget(func(checks []Check) bool {
		for i := range checks {
			if checks[i].Tenant == tenant && (policy == "" || checks[i].Policy == policy) {
				return true
			}
		}
		return false
	})
}

// forget drops the entries match selects, without giving anything back.
// A call of theirs on the wire, and a first sight's, will find that they
// were forgotten (leaseEntry.resets, leaseFlight.forgotten): its answer
// predates the reset, so it is not cached, and only its own request is
// served from it.
func (s *LeaseStore) forget(match func([]Check) bool) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, f := range sh.firsts {
			if match(f.checks) {
				f.forgotten = true
			}
		}
		for k, e := range sh.m {
			if !match(e.checks) {
				continue
			}
			e.mu.Lock()
			e.resets++
			if e.flight == nil {
				s.count(e, LeaseExpired, e.units)
				e.units, e.deniedUntil, e.reserveUntil, e.dead = 0, 0, 0, true
				delete(sh.m, k)
			} else {
				// Refilling: keep the entry, lose what it holds.
				s.count(e, LeaseExpired, e.units)
				e.units, e.deniedUntil, e.reserveUntil = 0, 0, 0
			}
			e.mu.Unlock()
		}
		sh.mu.Unlock()
	}
}

// giveBackJob is a lease to give back.
type giveBackJob struct {
	e     *leaseEntry
	units int64
	at    int64
}

// Sweep gives back the leases that expired unused, and forgets the
// entries idle for more than a lease TTL among 1/leaseIdleRounds of the
// shards (each entry is looked at once every leaseIdleRounds calls). The
// sweeper calls it; tests may too. What it costs follows the leases that
// ended since the last call and the entries of the shards it looks at for
// idleness, not every entry on every call.
func (s *LeaseStore) Sweep(ctx context.Context) {
	now := s.clock.Now().UnixNano()
	round := s.sweeps.Add(1)
	var jobs []giveBackJob
	var due []leaseExpiry
	for i := range s.shards {
		sh := &s.shards[i]
		due = sh.expiring.popDue(now, due[:0])
		for _, x := range due {
			e := x.e
			e.mu.Lock()
			if x.at != e.queued {
				// Superseded by an earlier end (watch).
				e.mu.Unlock()
				continue
			}
			e.queued = 0
			switch {
			case e.dead || e.units == 0:
				// Spent or forgotten.
			case now < e.expires:
				// Extended by a later grant: watch its end.
				e.watch(e.expires)
			case e.flight != nil:
				// A refill gives the units back itself; a prefetch may
				// extend the lease. Look again at the next sweep.
				e.watch(now)
			default:
				jobs = append(jobs, giveBackJob{e, e.units, e.at})
				e.units = 0
			}
			e.mu.Unlock()
		}
		if (uint64(i)+round)%leaseIdleRounds == 0 {
			forgetIdle(sh, now)
		}
	}
	clear(due)
	s.giveBackAll(ctx, jobs)
}

// watch has the sweeper visit e at at: when its lease ends, or at the
// next sweep. An entry has one item in its shard's heap at a time, so the
// heap holds at most one per entry however often a busy entry is
// refilled: a later end
// is left to the item already there, which the sweeper moves on when it
// comes due (a lease of 2 units with a one-hour ttl, refilled 100 000
// times a second, would otherwise leave an item per refill for an hour).
// An earlier end (a window's lease, cut at the window's end) gets an item
// of its own; the one it supersedes is skipped when it comes due. Called
// with e.mu held.
func (e *leaseEntry) watch(at int64) {
	if e.queued != 0 && e.queued <= at {
		return
	}
	e.queued = at
	e.shard.expiring.push(at, e)
}

// forgetIdle drops the entries of sh that hold nothing and were not seen
// for more than a lease ttl, and the first sights that no longer count.
// Such an entry has no request within the last ttl, so its demand is one
// request, as a new entry's: forgetting it changes no decision.
func forgetIdle(sh *leaseShard, now int64) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for h, until := range sh.seen {
		if now >= until {
			delete(sh.seen, h)
		}
	}
	for k, e := range sh.m {
		e.mu.Lock()
		if e.flight == nil && e.units == 0 && now >= e.deniedUntil && now >= e.reserveUntil && now-e.lastSeen > e.ttl {
			e.dead = true
			delete(sh.m, k)
		}
		e.mu.Unlock()
	}
}

// giveBackAll returns the units of jobs to the store, one call each.
func (s *LeaseStore) giveBackAll(ctx context.Context, jobs []giveBackJob) {
	var results []Result
	for _, j := range jobs {
		if ctx.Err() != nil {
			// Out of time (Close): sent by the recorder, when there is
			// one.
			s.count(j.e, LeaseExpired, j.units)
			s.retryGiveBack(&LeaseRequest{Checks: j.e.checks, GiveBack: j.units, GiveBackAt: j.at, ID: NewChargeID()}, ctx.Err())
			continue
		}
		if cap(results) < len(j.e.checks) {
			results = make([]Result, len(j.e.checks))
		}
		req := LeaseRequest{
			Checks:     j.e.checks,
			Instances:  s.instances(),
			TTL:        time.Duration(j.e.ttl),
			GiveBack:   j.units,
			GiveBackAt: j.at,
			ID:         NewChargeID(),
		}
		if _, err := s.taker.Lease(ctx, &req, results[:len(j.e.checks)]); err != nil {
			s.count(j.e, LeaseExpired, j.units)
			s.retryGiveBack(&req, err)
			if s.onError != nil {
				s.onError(err)
			}
			continue
		}
		s.count(j.e, LeaseReturned, j.units)
	}
}

// retryGiveBack hands a give-back whose call failed with err to the
// recorder, to be sent again under its id. A call that never reached the
// store (the breaker refused it) is retried too: its id makes that
// harmless, and its units are owed back all the same.
func (s *LeaseStore) retryGiveBack(req *LeaseRequest, err error) {
	if s.rec == nil || req.ID == "" || req.GiveBack <= 0 || errors.Is(err, ErrInvalidCheck) || errors.Is(err, ErrLeaseUnsupported) {
		return
	}
	s.rec.RetryGiveBack(req)
}

func (s *LeaseStore) sweepLoop(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sweep(context.Background())
		}
	}
}

// Close stops the sweeper and gives back every lease (waiting for refills
// in flight), within GiveBackTimeout. Requests decided after Close go to
// the inner store. It does not close the inner store.
func (s *LeaseStore) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		close(s.stop)
		<-s.done
		ctx, cancel := context.WithTimeout(context.Background(), s.giveBack)
		defer cancel()
		var jobs []giveBackJob
		for i := range s.shards {
			sh := &s.shards[i]
			sh.mu.Lock()
			entries := make([]*leaseEntry, 0, len(sh.m))
			for k, e := range sh.m {
				entries = append(entries, e)
				delete(sh.m, k)
			}
			sh.mu.Unlock()
			for _, e := range entries {
				e.mu.Lock()
				for e.flight != nil {
					f := e.flight
					e.mu.Unlock()
					select {
					case <-f.done:
					case <-ctx.Done():
					}
					e.mu.Lock()
					if ctx.Err() != nil {
						break
					}
				}
				if e.units > 0 {
					jobs = append(jobs, giveBackJob{e, e.units, e.at})
					e.units = 0
				}
				e.dead = true
				e.mu.Unlock()
			}
		}
		s.giveBackAll(ctx, jobs)
	})
	return nil
}
