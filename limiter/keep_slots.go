package limiter

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Keeping the slots of long requests. A concurrency counter in Redis
// expires RedisConcurrencyTTL after its last acquire, so that the slots of
// an instance that died are forgotten. A request that holds its slot
// longer than that while no other request acquires in its bucket (a
// websocket, a long stream) would be forgotten too: the bucket would
// admit more than its limit, and the request's release would then take a
// slot off a counter created since. So a request holding slots on Redis
// sets its counters' TTL again every KeepSlotsEvery while it runs: one
// PEXPIRE per counter, per request still running, every 5 minutes;
// nothing for shorter requests, nothing for the embedded store, and no
// work over the keyspace.

// KeepSlotsEvery is how often a request holding concurrency slots on
// Redis sets their counters' TTL again: half the TTL.
const KeepSlotsEvery = RedisConcurrencyTTL / 2

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

// keepSlots sets the TTL of the concurrency counters of checks again, in
// one pipeline, within the store's timeout. A counter that is gone stays
// gone (PEXPIRE of a missing key does nothing).
func (s *RedisStore) keepSlots(ctx context.Context, checks []Check) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range checks {
			c := &checks[i]
			p.PExpire(ctx, string(AppendKey(nil, s.prefix, Concurrency, c.Tenant, c.Policy, c.Part)), RedisConcurrencyTTL)
		}
		return nil
	})
	return err
}
