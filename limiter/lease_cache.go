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

// leaseCounters are a policy's lease units by event.
type leaseCounters [NumLeaseEvents]atomic.Int64

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
