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
// sets its counters' TTL again every KeepSlotsEvery from its decision on
// (a wait for its turn included) until it ends: one script call
// (lua/keep.lua) per request still running (per Cluster slot its tenants
// hash to), every 20 seconds; nothing for shorter requests, nothing for the embedded
// store, and no work over the keyspace.

// KeepSlotsEvery is how often a request holding concurrency slots on
// Redis renews their leases: a third of the lease, so two renewals in a
// row may fail (Redis briefly away) before the slot is lost.
const KeepSlotsEvery = RedisSlotLease / 3

// KeepSlotsAlive starts keeping the concurrency slots d holds on Redis,
// every `every` (KeepSlotsEvery; a duration of 0 or less means that), and
// returns the function that stops it: call it when the request is done,
// before Release. With no slot held in Redis (not admitted, no
// concurrency check, the embedded store or a fallback's decision) it
// starts nothing. A failed renewal is not retried before the next one: a
// lease lasts three renewal periods, so two in a row may fail. While the
// store's breaker is open (Redis is not answering) no renewal is sent:
// each would only wait out its timeout.
func (d *Decision) KeepSlotsAlive(every time.Duration) (stop func()) {
	rs := storeUnder[*RedisStore](d.decidedBy)
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
	if every <= 0 {
		every = KeepSlotsEvery
	}
	breaker := storeUnder[*BreakerStore](d.decidedBy)
	k := &slotKeeping{}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.t = time.AfterFunc(every, func() {
		if breaker == nil || !breaker.Open() {
			_ = rs.keepSlots(context.Background(), held)
		}
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

// storeUnder returns the store of type T that s is or wraps (each
// wrapper says what it wraps: Inner), or the zero T when there is none:
// the Redis store a stack decides with, or its breaker.
func storeUnder[T Store](s Store) T {
	for {
		switch v := s.(type) {
		case T:
			return v
		case interface{ Inner() Store }:
			s = v.Inner()
		default:
			var zero T
			return zero
		}
	}
}

// keepSlots renews the leases of the concurrency slots of checks and sets
// their counters' TTL again (lua/keep.lua), within the store's timeout:
// one call per Cluster slot the checks' keys hash to (one call for one
// tenant's checks, the usual request). A lease that ended and was given
// back stays given back; a counter that is gone stays gone.
func (s *RedisStore) keepSlots(ctx context.Context, checks []Check) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var nowArg any = argZero
	if s.now != nil {
		nowArg = strconv.FormatInt(s.now(), 10)
	}
	sc := s.getScratch()
	defer s.putScratch(sc)
	multiSlot := s.prepare(sc, checks) // the keys, and on a Cluster their slots
	groups := [][]int{sc.all}
	if multiSlot {
		groups = sc.groups()
	}
	var errs []error
	for _, g := range groups {
		keys := make([]string, 0, len(g))
		args := make([]any, 1, 1+len(g))
		args[0] = nowArg
		for _, i := range g {
			member := ""
			if held(&checks[i]) {
				member = string(appendHeldMember(nil, s.prefix, &checks[i]))
			}
			keys, args = append(keys, sc.keys[i]), append(args, member)
		}
		if _, err := s.eval(ctx, sc, scriptKeep, keys, args); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
