package limiter

import (
	"context"
	"strconv"
)

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
// <prefix>:once:{<tenant>}:<hold> as "held" with the slot (an acquire
// that finds its own record ran already, sent again by the client
// library: it answers admitted and charges nothing again) and leases the
// slot (lua/held.lua): it lists it, with the instant its lease ends, in
// the bucket's held index (appendHeldKey). A release gives the slot back
// by taking it out of that index, and only then: so only the first
// release of a slot gives anything back, a release after a reset (which
// deletes the index with its counter) takes nothing off the counter made
// since, and a release sent again, or for an acquire whose reply was
// lost (releaseLost), is always safe to send. The request's own release
// (Release) deletes the record; the others record "gone" instead, so
// that an acquire still on its way charges nothing when it runs
// (lua/decide.lua, lua/release.lua). DecideOrFallback and
// Decision.Release keep such releases in the fallback's Recorder
// (RetryRelease), which sends them until the store answers.
//
// A request still running renews its leases every KeepSlotsEvery
// (KeepSlotsAlive), and the next acquire in the bucket after a lease
// ended gives the slot back and takes it out of the index. So the slots
// of an instance that died with requests in flight come back within
// RedisSlotLease, even while other instances keep acquiring, and a late
// release of such a slot (an instance that was only paused) gives nothing
// back twice. The price: a request cut off from Redis for a whole lease
// loses its slot while it still runs, so the bucket may admit one more
// request than its limit for the rest of that request. The index gets
// its counter's TTL whenever the counter does, so it never expires first
// (taking the leases of a dead instance's slots with it).
//
// The cost: an acquire reads and writes one more key, a release deletes
// or writes it; the lease adds to an acquire a ZRANGEBYSCORE of the index
// (nothing more while no lease ended), a ZADD and a PEXPIRE, and to a
// release a ZREM. A record lives until its release, at most 24 hours (the
// records of an instance that died with requests in flight); a "gone" one
// IdempotencyTTL. Releases the Recorder still holds when the instance
// stops are lost with it, as every call it keeps.

// takesSlots reports whether c takes concurrency slots when it allows:
// a concurrency check of positive cost.
func takesSlots(c *Check) bool {
	return c.Algorithm == Concurrency && c.Cost > 0
}

// held reports whether c takes slots under an id.
func held(c *Check) bool {
	return takesSlots(c) && c.Hold != ""
}

// holdsAll reports whether the checks idx hold slots, every one of their
// concurrency checks of positive cost under an id (a check without one
// would not be told apart by the script, which gives a hold key to each).
func holdsAll(checks []Check, idx []int) bool {
	any := false
	for _, i := range idx {
		c := &checks[i]
		if takesSlots(c) {
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

// lostReleaser is a store that can release slots whose acquire may or may
// not have run, or whose release may have run already (RedisStore, and a
// BreakerStore over one): what Recorder.RetryRelease sends.
type lostReleaser interface {
	releaseLost(ctx context.Context, checks []Check) error
}

// releaseLostTo releases checks in store as a lostReleaser does. A store
// that keeps no holds (MemoryStore) releases them by count, as ever.
func releaseLostTo(ctx context.Context, store Store, checks []Check) error {
	if lr, ok := store.(lostReleaser); ok {
		return lr.releaseLost(ctx, checks)
	}
	return store.Release(ctx, checks)
}

// ranError is the error of a call made after the same request's store
// call had run and taken slots or charged units: it is not NotSent
// whatever it wraps, so that the slots are released (DecideOrFallback
// keeps the release of a call that may have run). A cross-slot give-back
// that failed rides along (giveBack, under giveBackID), for
// DecideOrFallback to hand to the recorder; denied says the store did
// decide the request (denied it) and only that compensation failed, so
// the store's verdicts stand rather than the fail mode's.
type ranError struct {
	err        error
	giveBackID string
	giveBack   []Check
	denied     bool
}

func (e ranError) Error() string { return e.err.Error() }

// heldSegment is the second segment of a held index's key.
const heldSegment = "held"

// appendHeldKey appends the key of the held index of the concurrency
// bucket of tenant in policy (and part), <prefix>:held:{<tenant>}:<policy>[:<part>]:
// the bucket's key with the algorithm's segment replaced, which the
// scripts derive from the bucket key (held_index in lua/held.lua).
func appendHeldKey(dst []byte, prefix, tenant, policy, part string) []byte {
	return appendTenantKey(dst, prefix, heldSegment, tenant, policy, part)
}

// appendHeldMember appends c's member in its bucket's held index:
// "<units>|<hold key>" (lua/held.lua).
func appendHeldMember(dst []byte, prefix string, c *Check) []byte {
	dst = strconv.AppendInt(dst, c.Cost, 10)
	dst = append(dst, '|')
	return appendOnceKey(dst, prefix, c.Tenant, c.Hold)
}
