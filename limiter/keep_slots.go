package limiter

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"
)

// Keeping the slots of long requests. A concurrency slot held on Redis is
// leased for RedisSlotLease (hold.go): the next acquire in its bucket
// after the lease ended gives it back, so that the slots of an instance
// that died are not kept for as long as other acquires keep the counter
// alive. A request that holds its slot longer than a lease (a websocket,
// a long stream) would lose it too: the bucket would admit more than its
// limit. And its counter expires RedisConcurrencyTTL after the bucket's
// last acquire. So a request holding slots on Redis renews its leases and
// sets its counters' TTL again every KeepSlotsEvery while it runs: one
// script call (lua/keep.lua) per request still running (per Cluster slot
// its tenants hash to), every 20 seconds; nothing for shorter requests, nothing for the embedded
// store, and no work over the keyspace.

// KeepSlotsEvery is how often a request holding concurrency slots on
// Redis renews their leases: a third of the lease, so two renewals in a
// row may fail (Redis briefly away) before the slot is lost.
const KeepSlotsEvery = RedisSlotLease / 3

// KeepSlotsAlive starts keeping the concurrency slots d holds on Redis,
// every `every` (KeepSlotsEvery), and returns the function that stops it:
// call it when the request is done, before Release. With no slot held in
// Redis (not admitted, no concurrency check, the embedded store or a
// fallback's decision) it starts nothing. A failed refresh is not
// retried before the next one: the counter's TTL still has half its
// length to run.
func (d *Decision) KeepSlotsAlive(every time.Duration) (stop func()) {
	rs := redisUnder(d.decidedBy)
	if rs == nil || !d.Admitted {
		return keepNothing
	}
	var held []Check
	for j := range d.checks {
		if d.holdsSlot(j) {
			held = append(held, d.checks[j])
		}
	}
	if len(held) == 0 {
		return keepNothing
	}
	k := &slotKeeping{}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.t = time.AfterFunc(every, func() {
		_ = rs.keepSlots(context.Background(), held)
		k.mu.Lock()
		defer k.mu.Unlock()
		if !k.stopped {
			k.t.Reset(every)
		}
	})
	return k.stop
}

func keepNothing() {}

// slotKeeping is the timer of one request's KeepSlotsAlive.
type slotKeeping struct {
	mu      sync.Mutex
	stopped bool
	t       *time.Timer
}

func (k *slotKeeping) stop() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.stopped = true
	k.t.Stop()
}

// redisUnder returns the Redis store s decides with, under the stores
// that wrap it (each says what it wraps: Inner), or nil when s is not
// backed by Redis.
func redisUnder(s Store) *RedisStore {
	for {
		switch v := s.(type) {
		case *RedisStore:
			return v
		case interface{ Inner() Store }:
			s = v.Inner()
		default:
			return nil
		}
	}
}

// keepSlots renews the leases of the concurrency slots of checks and sets
// their counters' TTL again (lua/keep.lua), within the store's timeout:
// one call for all of them when they share a Cluster slot (one tenant's,
// the usual request), else one per check. A lease that ended and was
// given back stays given back; a counter that is gone stays gone.
func (s *RedisStore) keepSlots(ctx context.Context, checks []Check) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var nowArg any = argZero
	if s.now != nil {
		nowArg = strconv.FormatInt(s.now(), 10)
	}
	keys := make([]string, len(checks))
	args := make([]any, 1, 1+len(checks))
	args[0] = nowArg
	oneSlot := true
	for i := range checks {
		c := &checks[i]
		b := AppendKey(nil, s.prefix, Concurrency, c.Tenant, c.Policy, c.Part)
		keys[i] = string(b)
		oneSlot = oneSlot && (s.cluster == nil || keySlot(b) == keySlot([]byte(keys[0])))
		member := ""
		if held(c) {
			member = string(appendHeldMember(nil, s.prefix, c))
		}
		args = append(args, member)
	}
	sc := s.getScratch()
	defer s.putScratch(sc)
	if oneSlot {
		_, err := s.eval(ctx, sc, scriptKeep, keys, args)
		return err
	}
	var errs []error
	for i := range keys {
		if _, err := s.eval(ctx, sc, scriptKeep, keys[i:i+1], []any{nowArg, args[1+i]}); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
