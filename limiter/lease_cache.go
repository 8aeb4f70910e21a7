package limiter

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// LeaseOptions configures NewLeaseStore.
type LeaseOptions struct {
	// Store decides what cannot be leased, and answers Peek, Release and
	// Reset. Required.
	Store Store
	// Taker takes and gives back leases; typically the same store (a
	// BreakerStore around a RedisStore). Required.
	Taker LeaseTaker
	// Instances returns the number of live instances sharing the budget;
	// nil means 1.
	Instances func() int
	// Clock tells the time; nil means SystemClock.
	Clock Clock
	// SweepInterval is how often expired leases are given back; 0 means
	// 100ms, negative disables the sweeper (tests call Sweep). Entries
	// idle for a lease TTL are forgotten within leaseIdleRounds sweeps.
	SweepInterval time.Duration
	// GiveBackTimeout bounds the give-backs of Close; 0 means 2s.
	GiveBackTimeout time.Duration
	// Observe, when not nil, counts units by policy and event. It is
	// called on the request path for LeaseSpent: keep it cheap. Safe for
	// concurrent use.
	Observe func(policy string, event LeaseEvent, units int64)
	// OnGiveBackError, when not nil, hears about give-backs that failed
	// (their units count as expired).
	OnGiveBackError func(error)
	// Recorder, when not nil, keeps the give-backs that failed and may
	// have run (each carries an id), to be retried until the store
	// answers (Recorder.RetryGiveBack): their units then go back once.
	Recorder *Recorder
}

// LeaseStore is a Store that serves requests from units leased ahead of
// demand, so most decisions of a busy tenant cost no store
// call at all.
//
// A request is leased when every one of its checks has Lease enabled, an
// algorithm that can lease, is not shadow and the checks have at least one
// positive cost; any other request goes to the inner Store as it is. The
// checks of a request (buckets, rates and costs) form one lease entry:
//
//   - First sight: checks not seen within the last ttl get no entry;
//     their request is decided by the inner store and only a hash of the
//     checks is kept for a ttl (see lookup). The second sight makes the
//     entry.
//   - Served from the lease: while the entry holds units that have not
//     expired, a request takes one request's worth locally: no store call,
//     no lock held across I/O.
//   - Refill: otherwise one Taker.Lease call gives back what is left of an
//     expired lease and takes up to Lease.Max requests' worth, sized to the
//     entry's recent demand (requests over the last TTL); the store caps
//     it at remaining/(2 x instances). Concurrent requests of the entry
//     wait for that one call (no stampede), then take from it. When the
//     demand is one request and nothing is left to give back, the request
//     is decided by the inner store instead (a lease of one unit is a
//     decision, and a cheaper one).
//   - Denial cache: when a refill is denied, the entry answers every
//     request locally with the store's results (Retry-After counting down)
//     until Retry-After has passed; the next request asks the store again.
//   - Turns (a check with Rate.Delay): a request is never served a turn
//     from a lease. When a refill is denied, that request and the next
//     ones until the buckets hold a unit again are decided by the inner
//     store, which hands out turns; a turn further than the delay is
//     cached as a denial until it could come within the delay.
//   - Give back: the sweeper gives back the units of leases that expired
//     unused; Close gives back every lease. Only a crash strands units: at
//     most Lease.Max requests' worth per entry and instance.
//
// Leased units are charged in the shared store when taken, so a fleet of
// instances never admits more than the limit. What leasing costs is
// fairness near the limit (units sit on the instance that leased them)
// and slightly stale headers: Remaining is the store's last answer plus
// the units still leased here, Reset counts down from that answer.
//
// A Result served from a lease has From OriginLease; one from the denial
// cache OriginDenialCache.
type LeaseStore struct {
	inner     Store
	taker     LeaseTaker
	instances func() int
	clock     Clock
	observe   func(string, LeaseEvent, int64)
	onError   func(error)
	giveBack  time.Duration
	rec       *Recorder

	seed   maphash.Seed
	shards [leaseShards]leaseShard
	keys   sync.Pool // *[]byte

	statsMu sync.Mutex
	stats   map[string]*leaseCounters

	closed    atomic.Bool
	sweeps    atomic.Uint64 // Sweep calls, for the shards' turns
	closeOnce sync.Once
	stop      chan struct{}
	done      chan struct{}
}

var _ Store = (*LeaseStore)(nil)

const leaseShards = 32

type leaseShard struct {
	mu sync.Mutex
	m  map[string]*leaseEntry
	// seen holds the sets of checks seen once and not yet given an entry:
	// the hash of their lease key, and the instant (local ns) until which
	// that first sight counts toward their demand (it plus the ttl). See
	// lookup.
	seen map[uint64]int64
	// firsts holds the decisions of first sights on the wire, by the same
	// hash, so that concurrent requests of the same checks wait for them
	// instead of making calls of their own.
	firsts map[uint64]*leaseFlight
	// expiring holds the ends of the shard's leases, for the sweeper.
	expiring leaseExpiries
}

// leaseIdleRounds is how many sweeps it takes to look at every entry for
// idleness: each sweep looks at the entries of 1/leaseIdleRounds of the
// shards, so an idle entry is forgotten within that many sweeps of being
// idle for a ttl (and a first sight within that many of ceasing to count).
const leaseIdleRounds = 8

// leaseFlight is a refill in progress; waiters block on done.
type leaseFlight struct {
	done chan struct{}
	err  error
	// A first sight's flight (see lookup) keeps its request's checks, so
	// that forget can find it; forgotten (guarded by the shard's mu) is
	// set when it does: the decision on the wire predates a reset and is
	// not cached.
	checks    []Check
	forgotten bool
}

// leaseEntry is the lease state of one set of checks. Every field below
// mu is guarded by it.
type leaseEntry struct {
	key      string
	shard    *leaseShard
	checks   []Check // a copy, for refills and give-backs
	counters []*leaseCounters
	max      int64
	ttl      int64 // ns

	mu    sync.Mutex
	units int64 // requests' worth leased and not yet served
	// expires (local ns) ends the lease; at is the store instant of the
	// grant, for the give back.
	expires int64
	at      int64
	// base holds the store's last results and baseAt (local ns) when they
	// arrived; deniedUntil (local ns) ends the denial cache.
	base        []Result
	baseAt      int64
	deniedUntil int64
	flight      *leaseFlight
	// Demand: requests in the current and previous ttl-long periods, and
	// the instants of the last few (recent, a ring; recentNext is where
	// the next goes), which count a thin entry's demand exactly.
	demandStart, demandCur, demandPrev int64
	lastSeen                           int64
	recent                             [leaseRecent]int64
	recentNext                         uint8
	// queued is the end (local ns) the shard's expiring heap holds for
	// this entry, 0 for none: one item per entry (see watch).
	queued int64
	// unleasable: the taker refused these checks; decide them directly.
	unleasable bool
	// delay: some check may wait for a turn (Rate.Delay). reserveUntil
	// (local ns) ends the span in which the buckets hold nothing to lease
	// and requests go to the inner store for turns.
	delay        bool
	reserveUntil int64
	// dead: forgotten by the store; look the checks up again.
	dead bool
	// resets counts forget's visits: a call made before one answers for
	// buckets a reset has emptied since, and is neither cached (a denial)
	// nor served beyond its own request (a grant). See forget.
	resets uint32

	// Prefetch (see prefetchable): lastGrant is the size of the last
	// grant; prefetched is set while a grant was prefetched for it (or the
	// store refused one), so a lease prefetches at most once.
	prefetchable bool
	lastGrant    int64
	prefetched   bool
	scratch      []Result // the prefetch call's results
}

// NewLeaseStore returns a lease cache in front of opts.Store and starts
// its sweeper. Close it to give every lease back.
func NewLeaseStore(opts LeaseOptions) *LeaseStore {
	if opts.Clock == nil {
		opts.Clock = SystemClock{}
	}
	if opts.Instances == nil {
		opts.Instances = func() int { return 1 }
	}
	if opts.SweepInterval == 0 {
		opts.SweepInterval = 100 * time.Millisecond
	}
	if opts.GiveBackTimeout <= 0 {
		opts.GiveBackTimeout = 2 * time.Second
	}
	s := &LeaseStore{
		inner:     opts.Store,
		taker:     opts.Taker,
		instances: opts.Instances,
		clock:     opts.Clock,
		observe:   opts.Observe,
		onError:   opts.OnGiveBackError,
		rec:       opts.Recorder,
		giveBack:  opts.GiveBackTimeout,
		seed:      maphash.MakeSeed(),
		stats:     map[string]*leaseCounters{},
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	for i := range s.shards {
		s.shards[i].m = map[string]*leaseEntry{}
	}
	s.keys.New = func() any { b := make([]byte, 0, 128); return &b }
	if opts.SweepInterval > 0 {
		go s.sweepLoop(opts.SweepInterval)
	} else {
		close(s.done)
	}
	return s
}

// leasable reports whether the request of checks is served by leases.
func leasable(checks []Check) bool {
	if len(checks) == 0 {
		return false
	}
	costly := false
	for i := range checks {
		c := &checks[i]
		// A cost beyond MaxCount/2 leaves no room for a lease and a give
		// back in one call; such a request is decided by the store.
		if !c.Lease.Enabled() || !c.Algorithm.SupportsLease() || c.Shadow || c.Cost < 0 || c.Cost > MaxCount/2 {
			return false
		}
		costly = costly || c.Cost > 0
	}
	return costly
}

// appendLeaseKey appends the identity of a lease entry: every check's
// bucket, rate and cost, length-prefixed so no two differ only in how
// their fields are split.
func appendLeaseKey(b []byte, checks []Check) []byte {
	for i := range checks {
		c := &checks[i]
		b = append(b, byte(c.Algorithm))
		for _, f := range [...]string{c.Tenant, c.Policy, c.Part} {
			b = binary.AppendUvarint(b, uint64(len(f)))
			b = append(b, f...)
		}
		b = binary.AppendVarint(b, c.Cost)
		b = binary.AppendVarint(b, c.Rate.Limit)
		b = binary.AppendVarint(b, int64(c.Rate.Window))
		b = binary.AppendVarint(b, c.Rate.Burst)
		b = binary.AppendVarint(b, int64(c.Rate.Delay))
		var cal string
		if c.Rate.Calendar != nil {
			cal = c.Rate.Calendar.name
		}
		b = binary.AppendUvarint(b, uint64(len(cal)))
		b = append(b, cal...)
	}
	return b
}

// Decide implements Store: from the lease when it can, else with one
// refill, else (not leasable) by the inner store.
func (s *LeaseStore) Decide(ctx context.Context, checks []Check, results []Result) (bool, error) {
	if s.closed.Load() || !leasable(checks) || len(results) < len(checks) {
		return s.inner.Decide(ctx, checks, results)
	}
	for {
		now := s.clock.Now().UnixNano()
		e, first, wait := s.lookup(checks, now)
		if e == nil && first.f == nil && wait == nil {
			// Closed since the check above.
			return s.inner.Decide(ctx, checks, results)
		}
		if first.f != nil {
			return s.decideFirst(ctx, first, checks, results, now)
		}
		if wait != nil {
			select {
			case <-wait.done:
			case <-ctx.Done():
				return false, ctx.Err()
			}
			if wait.err != nil {
				return false, wait.err
			}
			continue
		}
		admitted, retry, err := s.decideEntry(ctx, e, checks, results, now)
		if !retry {
			return admitted, err
		}
		if s.closed.Load() {
			return s.inner.Decide(ctx, checks, results)
		}
	}
}

// lookup finds the entry of checks, or creates it when they were seen once
// within the last ttl. A first sight gets no entry: it is only noted, in
// the shard's seen table (16 bytes and the map's overhead instead of an
// entry's ~700), and its request is decided by the inner store (first is
// set: see decideFirst), as an entry's first request is anyway (its demand
// is one request: see want). So the long tail of a large tenant
// population, each tenant seen once a ttl or less often, costs an
// instance a table of hashes, not a table of entries. The entry made at
// the second sight counts the first in its demand, so leases grow as they
// would have. While a first sight's decision is on the wire, the checks'
// other requests get it as wait: one call, not a stampede. Checks with a
// delay always get an entry (their refills hand out turns).
//
// Once the store is closed, lookup returns nothing: Close may have
// emptied the shard already, and nothing would give back what a new
// entry leased. (Close marks the store closed before it takes a shard's
// lock, so a lookup under that lock either sees closed or made its entry
// before Close took the shard's entries.)
func (s *LeaseStore) lookup(checks []Check, now int64) (e *leaseEntry, first firstSight, wait *leaseFlight) {
	kb := s.keys.Get().(*[]byte)
	*kb = appendLeaseKey((*kb)[:0], checks)
	h := maphash.Bytes(s.seed, *kb)
	sh := &s.shards[h%leaseShards]
	sh.mu.Lock()
	if e = sh.m[string(*kb)]; e == nil && !s.closed.Load() {
		wait = sh.firsts[h]
		until, seen := sh.seen[h]
		switch {
		case wait != nil:
		case seen && now < until:
			delete(sh.seen, h)
			e = s.addEntry(sh, string(*kb), checks)
			e.noteDemand(until - e.ttl)
		case hasDelay(checks):
			e = s.addEntry(sh, string(*kb), checks)
		default:
			if sh.seen == nil {
				sh.seen, sh.firsts = make(map[uint64]int64), make(map[uint64]*leaseFlight)
			}
			sh.seen[h] = now + int64(leaseTTL(checks))
			first = firstSight{sh: sh, hash: h, f: &leaseFlight{done: make(chan struct{}), checks: checks}}
			sh.firsts[h] = first.f
		}
	}
	sh.mu.Unlock()
	s.keys.Put(kb)
	return e, first, wait
}

// firstSight is the decision of a first sight on the wire (see lookup).
type firstSight struct {
	sh   *leaseShard
	hash uint64
	f    *leaseFlight
}

// decideFirst decides the first request of checks seen within a ttl (see
// lookup) with the inner store. A denial makes an entry, which answers
// the checks' next requests until Retry-After; the requests waiting for
// this decision share its error, or look again.
func (s *LeaseStore) decideFirst(ctx context.Context, first firstSight, checks []Check, results []Result, now int64) (admitted bool, err error) {
	// Deferred, so that a panic in the store (recovered by net/http)
	// cannot leave the checks' later requests waiting for this flight.
	panicked := true
	defer func() {
		if panicked {
			first.f.err = errStorePanicked
		} else if err != nil && ctx.Err() == nil {
			first.f.err = err
		}
		first.sh.mu.Lock()
		delete(first.sh.firsts, first.hash)
		first.sh.mu.Unlock()
		close(first.f.done)
	}()
	admitted, err = s.inner.Decide(ctx, checks, results)
	panicked = false
	if err != nil || admitted {
		return admitted, err
	}
	if e := s.entryUnless(checks, first.f); e != nil {
		e.mu.Lock()
		if !e.dead && e.flight == nil && e.units == 0 {
			e.noteDemand(now)
			e.cacheDenial(results, now)
		}
		e.mu.Unlock()
	}
	return admitted, err
}

// errStorePanicked is the error of the requests that waited for a call
// whose store panicked (net/http recovers the panic of the request that
// made it). Each call on the wire clears its flight in a deferred
// function, so that such a panic cannot leave the entry's later requests
// waiting for it.
var errStorePanicked = errors.New("limiter: the store panicked deciding this request")

// abandon ends e's flight f after its store panicked: the waiters wake
// with err (nil: they look again). Called without e.mu.
func (e *leaseEntry) abandon(f *leaseFlight, err error) {
	e.mu.Lock()
	if e.flight == f {
		e.flight = nil
	}
	f.err = err
	e.mu.Unlock()
	close(f.done)
}

// hasDelay reports whether a check of checks has a delay.
func hasDelay(checks []Check) bool {
	for i := range checks {
		if checks[i].Rate.Delay > 0 {
			return true
		}
	}
	return false
}

// leaseTTL is the ttl of an entry of checks: the shortest of theirs.
func leaseTTL(checks []Check) time.Duration {
	ttl := checks[0].Lease.TTLFor(checks[0].Rate.Window)
	for i := 1; i < len(checks); i++ {
		ttl = min(ttl, checks[i].Lease.TTLFor(checks[i].Rate.Window))
	}
	return ttl
}

// entry finds or creates the entry of checks; nil once the store is
// closed (see lookup).
func (s *LeaseStore) entry(checks []Check) *leaseEntry {
	return s.entryUnless(checks, nil)
}

// entryUnless is entry, except that it makes no entry when first (the
// checks' first sight, or nil) was forgotten by a reset meanwhile.
func (s *LeaseStore) entryUnless(checks []Check, first *leaseFlight) *leaseEntry {
	kb := s.keys.Get().(*[]byte)
	*kb = appendLeaseKey((*kb)[:0], checks)
	sh := &s.shards[maphash.Bytes(s.seed, *kb)%leaseShards]
	sh.mu.Lock()
	e := sh.m[string(*kb)]
	if e == nil && !s.closed.Load() && (first == nil || !first.forgotten) {
		e = s.addEntry(sh, string(*kb), checks)
	}
	sh.mu.Unlock()
	s.keys.Put(kb)
	return e
}

// addEntry makes the entry of checks under key in sh. Called with sh.mu
// held.
func (s *LeaseStore) addEntry(sh *leaseShard, key string, checks []Check) *leaseEntry {
	e := s.newEntry(key, checks)
	e.shard = sh
	sh.m[key] = e
	return e
}

func (s *LeaseStore) newEntry(key string, checks []Check) *leaseEntry {
	e := &leaseEntry{
		key:      key,
		checks:   append([]Check(nil), checks...),
		counters: make([]*leaseCounters, len(checks)),
		base:     make([]Result, len(checks)),
		max:      checks[0].Lease.Max,
		ttl:      int64(leaseTTL(checks)),
	}
	for i := range checks {
		e.max = min(e.max, checks[i].Lease.Max)
		if c := checks[i].Cost; c > 0 {
			// A lease and the give back of the previous one share one
			// call: both must stay within MaxCount units.
			e.max = max(1, min(e.max, MaxCount/(2*c)))
		}
		e.counters[i] = s.counters(checks[i].Policy)
		e.delay = e.delay || checks[i].Rate.Delay > 0
	}
	e.prefetchable = prefetchOn && prefetchable(checks)
	return e
}

// Peek implements Store: the inner store's view, without the units
// leased here.
func (s *LeaseStore) Peek(ctx context.Context, checks []Check, results []Result) error {
	return s.inner.Peek(ctx, checks, results)
}

// Release implements Store. Leased requests hold no slots.
func (s *LeaseStore) Release(ctx context.Context, checks []Check) error {
	return s.inner.Release(ctx, checks)
}

// Inner returns the store leases are taken from.
func (s *LeaseStore) Inner() Store { return s.inner }

// releaseLost implements lostReleaser (see releaseLostTo).
func (s *LeaseStore) releaseLost(ctx context.Context, checks []Check) error {
	return releaseLostTo(ctx, s.inner, checks)
}

// Charge implements Charger: units move in the inner store (settlements
// and refunds are never served from a lease; see Decision.Settle for
// metered costs paid from leased units).
func (s *LeaseStore) Charge(ctx context.Context, id string, checks []Check, charged []int64) error {
	ch, ok := s.inner.(Charger)
	if !ok {
		return ErrNoCharge
	}
	return ch.Charge(ctx, id, checks, charged)
}
