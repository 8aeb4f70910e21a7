package fleet

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// Near-limit tenants (near_limit; GET /rate_limit/near_limit): the
// tenants an admitted request left with less than (1 - near_limit) of
// their limit, most recent first.
//
// A NearLimitBoard keeps them in process memory, bounded: per policy the
// NearLimitPerPolicy tenants seen most recently, the one seen least
// recently dropped first. Noting a tenant is a map update under a
// per-policy lock, no I/O, so the request path never waits for Redis.
//
// Fleet-wide view. With Redis, a backend's board also publishes its
// snapshot, at most every nearPublishInterval and only when something
// changed, as one string per instance, <prefix>:near:<instance> (JSON,
// TTL nearMaxAge), indexed by the sorted set <prefix>:near-index
// (instance -> last publication, Unix ms; entries older than nearMaxAge
// are trimmed at each publication). The admin API reads the index and the
// listed instances' snapshots (ZRANGEBYSCORE, then one pipelined GET per
// instance) and merges them with this instance's own board, newest first.
//
// Why not per event: a tenant near its quota is near it on every request
// until the period ends (the last 20% of a million-a-month plan is
// 200,000 requests), so writing events would cost Redis in proportion to
// traffic. A snapshot costs one pipelined round trip (SET, ZADD,
// ZREMRANGEBYSCORE, PEXPIRE) per instance every 5 s while tenants keep
// crossing their threshold, nothing while idle, and never a call on the
// request path. The price: the fleet view lags by up to 5 s; a crash
// loses what the instance had not published yet.

const (
	// NearLimitPerPolicy bounds the tenants a board keeps per policy.
	NearLimitPerPolicy = 256
	// nearPublishInterval is the least time between two publications.
	nearPublishInterval = 5 * time.Second
	// nearMaxAge is how long a tenant stays on a board (and a snapshot in
	// Redis) after it was last seen near its limit.
	nearMaxAge = 24 * time.Hour
	// nearPublishTimeout bounds one publication.
	nearPublishTimeout = 2 * time.Second
)

// NearLimitEntry is one tenant seen near its limit.
type NearLimitEntry struct {
	Policy string `json:"policy"`
	Tenant string `json:"tenant"`
	// Key is the partition, when the handler logs keys (log_key).
	Key string `json:"key,omitempty"`
	// Remaining is the quota left after the request, Limit the limit it
	// is out of (the burst of a token bucket or GCRA).
	Remaining int64 `json:"remaining"`
	Limit     int64 `json:"limit"`
	// At is when the instance last saw the tenant near its limit, ResetAt
	// when its bucket was to have more quota then (Unix ns, the instance's
	// clock).
	At      int64 `json:"at"`
	ResetAt int64 `json:"reset_at"`
	// Instance is the instance that saw it (registry ID), in fleet views.
	Instance string `json:"instance,omitempty"`
}

// NearLimitBoard is one process's (or one backend's) bounded record of the
// tenants seen near their limits. Safe for concurrent use.
type NearLimitBoard struct {
	mu       sync.RWMutex
	policies map[string]*nearPolicy
	// dirty is set when something changed since the last publication.
	dirty atomic.Bool
	// now is the clock (tests replace it).
	now func() time.Time
}

type nearPolicy struct {
	mu sync.Mutex
	m  map[nearKey]*NearLimitEntry
}

type nearKey struct{ tenant, key string }

// NewNearLimitBoard returns an empty board.
func NewNearLimitBoard() *NearLimitBoard {
	return &NearLimitBoard{policies: map[string]*nearPolicy{}, now: time.Now}
}

// Note records that tenant (partition key) of policy was left with
// remaining of limit units, more coming in reset. tenant and key should
// already be bounded in length (the caller's logging bound).
func (b *NearLimitBoard) Note(policy, tenant, key string, remaining, limit int64, reset time.Duration) {
	b.mu.RLock()
	np := b.policies[policy]
	b.mu.RUnlock()
	if np == nil {
		b.mu.Lock()
		if np = b.policies[policy]; np == nil {
			np = &nearPolicy{m: map[nearKey]*NearLimitEntry{}}
			b.policies[policy] = np
		}
		b.mu.Unlock()
	}
	now := b.now()
	at := now.UnixNano()
	np.mu.Lock()
	e := np.m[nearKey{tenant, key}]
	if e == nil {
		if len(np.m) >= NearLimitPerPolicy {
			np.evictOldest()
		}
		// Copies: the request's strings must not be kept alive.
		tenant, key = strings.Clone(tenant), strings.Clone(key)
		e = &NearLimitEntry{Policy: policy, Tenant: tenant, Key: key}
		np.m[nearKey{tenant, key}] = e
	}
	e.Remaining, e.Limit, e.At = remaining, limit, at
	e.ResetAt = now.Add(reset).UnixNano()
	np.mu.Unlock()
	b.dirty.Store(true)
}

// evictOldest drops the entry seen least recently; with np.mu held.
func (np *nearPolicy) evictOldest() {
	var oldest *NearLimitEntry
	for _, e := range np.m {
		if oldest == nil || e.At < oldest.At {
			oldest = e
		}
	}
	if oldest != nil {
		delete(np.m, nearKey{oldest.Tenant, oldest.Key})
	}
}

// Recent returns up to n entries of policy (every policy when empty),
// newest first, seen within nearMaxAge.
func (b *NearLimitBoard) Recent(policy string, n int) []NearLimitEntry {
	out := b.snapshot(policy)
	sortNear(out)
	return out[:min(n, len(out))]
}

// snapshot copies the entries of policy (all when empty) seen within
// nearMaxAge, dropping the older ones.
func (b *NearLimitBoard) snapshot(policy string) []NearLimitEntry {
	cutoff := b.now().Add(-nearMaxAge).UnixNano()
	b.mu.RLock()
	defer b.mu.RUnlock()
	var out []NearLimitEntry
	for name, np := range b.policies {
		if policy != "" && name != policy {
			continue
		}
		np.mu.Lock()
		for k, e := range np.m {
			if e.At < cutoff {
				delete(np.m, k)
				continue
			}
			out = append(out, *e)
		}
		np.mu.Unlock()
	}
	return out
}

// sortNear sorts entries newest first (ties by policy, tenant, key).
func sortNear(es []NearLimitEntry) {
	slices.SortFunc(es, func(a, b NearLimitEntry) int {
		return cmp.Or(cmp.Compare(b.At, a.At), cmp.Compare(a.Policy, b.Policy), cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Key, b.Key))
	})
}

// nearPublisher publishes a backend's board to Redis (see the top of this
// file).
type nearPublisher struct {
	board    *NearLimitBoard
	client   redis.UniversalClient
	key      string // <prefix>:near:<instance>
	index    string // <prefix>:near-index
	instance string
	breaker  *limiter.BreakerStore
	logger   *zap.Logger

	stop chan struct{}
	done chan struct{}
}

func newNearPublisher(board *NearLimitBoard, client redis.UniversalClient, prefix, instance string, breaker *limiter.BreakerStore, logger *zap.Logger) *nearPublisher {
	p := &nearPublisher{
		board:    board,
		client:   client,
		key:      prefix + ":near:" + instance,
		index:    prefix + ":near-index",
		instance: instance,
		breaker:  breaker,
		logger:   logger,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	go p.run()
	return p
}

func (p *nearPublisher) run() {
	defer close(p.done)
	t := time.NewTicker(nearPublishInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			err := p.publish()
			switch {
			case err != nil && !failing:
				failing = true
				p.logger.Warn("near-limit list: publishing to Redis failed; the fleet view misses this instance until it works again", causeField(err), zap.Error(err))
			case err == nil && failing:
				failing = false
				p.logger.Info("near-limit list: publishing to Redis again")
			}
		}
	}
}

// close stops the publisher after a last publication of what changed.
func (p *nearPublisher) close() {
	close(p.stop)
	<-p.done
	_ = p.publish()
}

// publish writes the board's snapshot when it changed since the last
// publication: one pipelined round trip.
func (p *nearPublisher) publish() error {
	if !p.board.dirty.Swap(false) {
		return nil
	}
	if p.breaker.Open() {
		p.board.dirty.Store(true) // try again once Redis is back
		return nil
	}
	entries := p.board.snapshot("")
	sortNear(entries)
	raw, err := json.Marshal(entries)
	if err != nil {
		return err
	}
	now := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), nearPublishTimeout)
	defer cancel()
	_, err = p.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Set(ctx, p.key, raw, nearMaxAge)
		pipe.ZAdd(ctx, p.index, redis.Z{Score: float64(now.UnixMilli()), Member: p.instance})
		pipe.ZRemRangeByScore(ctx, p.index, "-inf", "("+strconv.FormatInt(now.Add(-nearMaxAge).UnixMilli(), 10))
		pipe.PExpire(ctx, p.index, nearMaxAge)
		return nil
	})
	if err != nil {
		p.board.dirty.Store(true)
	}
	return err
}

// NearLimit is the backend's near-limit board: this instance's record,
// published for the fleet.
func (b *Backend) NearLimit() *NearLimitBoard { return b.near }

// NearLimitFleet returns up to n entries of policy (all when empty),
// newest first, from every instance on the backend's prefix: this
// instance's board and the other instances' published snapshots. A tenant
// seen by several instances is listed once, as the instance that saw it
// last saw it. On a Redis error it returns this instance's entries and
// the error.
func (b *Backend) NearLimitFleet(ctx context.Context, policy string, n int) ([]NearLimitEntry, error) {
	own := b.near.snapshot(policy)
	for i := range own {
		own[i].Instance = b.reg.ID()
	}
	others, err := b.nearPublished(ctx, policy)
	all := append(own, others...)
	sortNear(all)
	type id struct{ policy, tenant, key string }
	seen := map[id]bool{}
	out := all[:0]
	for _, e := range all {
		k := id{e.Policy, e.Tenant, e.Key}
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, e)
	}
	return out[:min(n, len(out))], err
}

// nearPublished reads the other instances' snapshots.
func (b *Backend) nearPublished(ctx context.Context, policy string) ([]NearLimitEntry, error) {
	p := b.nearPub
	cutoff := time.Now().Add(-nearMaxAge)
	ids, err := b.client.ZRangeByScore(ctx, p.index, &redis.ZRangeBy{Min: strconv.FormatInt(cutoff.UnixMilli(), 10), Max: "+inf"}).Result()
	if err != nil {
		return nil, err
	}
	ids = slices.DeleteFunc(ids, func(id string) bool { return id == b.reg.ID() })
	if len(ids) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.StringCmd, len(ids))
	prefix := strings.TrimSuffix(p.key, p.instance)
	_, err = b.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = pipe.Get(ctx, prefix+id)
		}
		return nil
	})
	if err != nil && err != redis.Nil {
		return nil, err
	}
	var out []NearLimitEntry
	for i, c := range cmds {
		raw, err := c.Bytes()
		if err != nil {
			continue // expired meanwhile
		}
		var es []NearLimitEntry
		if json.Unmarshal(raw, &es) != nil {
			continue
		}
		for _, e := range es {
			if (policy == "" || e.Policy == policy) && e.At >= cutoff.UnixNano() {
				e.Instance = ids[i]
				out = append(out, e)
			}
		}
	}
	return out, nil
}
