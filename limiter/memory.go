package limiter

import (
	"bytes"
	"context"
	"errors"
	"hash/maphash"
	"math"
	"runtime"
	"strings"
	"sync"
	"time"
)

// MemoryOptions configures NewMemoryStore. The zero value is ready to use.
type MemoryOptions struct {
	// Clock tells the time; nil means SystemClock.
	Clock Clock
	// MaxMemory bounds the memory of the buckets the store keeps, in bytes
	// of Go heap; 0 means DefaultMaxMemory. Each bucket weighs an estimate
	// of what it holds: its key, a fixed 128 bytes for the entry and its
	// map slot (measured, see memEntryOverhead) and its sliding log's
	// buffer. The process's resident memory is larger than the live heap:
	// up to about twice as large between two garbage collections with the
	// default GOGC of 100.
	MaxMemory int64
	// SweepInterval is how often a background goroutine deletes expired
	// buckets; 0 means one minute, a negative value disables the sweeper
	// (expired buckets are then only dropped when the store is full).
	SweepInterval time.Duration
	// Prefix starts every key, as in Redis; "" means "rl".
	Prefix string
}

// Defaults of MemoryOptions.
const (
	// DefaultMaxMemory is 256 MiB: about 1.6 million buckets with 40-byte
	// keys (168 bytes each), more than the 1,048,576 buckets the store used
	// to count, and 1.2 million under a flood of hostile tenants (128-byte
	// values that escape to more than 128 bytes, digested: 216 bytes per
	// bucket). BenchmarkMemoryFlood measures 262 MiB of live heap and a
	// peak RSS of 597 MiB for such a flood with the default GOGC: a size an
	// embedded limiter may take on a small server, and enough buckets for
	// every active tenant of all but the largest sites (which share their
	// counters through Redis anyway).
	DefaultMaxMemory     = 256 << 20
	DefaultSweepInterval = time.Minute
	DefaultPrefix        = "rl"
)

const (
	// maxShards is the number of independently locked maps of a store.
	maxShards = 64
	// minShardBudget keeps shards from getting so small that hashing
	// imbalance matters (about 400 buckets): a store with a small MaxMemory
	// has fewer shards.
	minShardBudget = 64 << 10
	// memEntryOverhead is the heap a bucket holds besides its key bytes and
	// its sliding log: the memEntry (80 bytes), its slot in the shard's map
	// (a string and a pointer, 24 bytes, at the map's load factor) and the
	// rounding of the key to its allocation size class. Measured with
	// BenchmarkMemoryBytesPerKey: 163 bytes per token bucket with a 34-byte
	// key, 147 per GCRA bucket with a 26-byte key.
	memEntryOverhead = 128
	// logRingBytes is the heap of a logRing without its buffer.
	logRingBytes = 48
	// sweepChunk is how many buckets the background sweeper examines per
	// lock hold.
	sweepChunk = 1024
	// pinnedExpiry is the expiry of a concurrency bucket with units in flight.
	pinnedExpiry = math.MaxInt64
)

// errShortResults is returned when results cannot hold one Result per check.
var errShortResults = errors.New("limiter: results is shorter than checks")

// MemoryStore is the embedded in-process Store: exact, atomic per Decide,
// bounded in memory. It is safe for concurrent use.
//
// Buckets live in 64 shards (fewer for a small MaxMemory), each a map guarded
// by its own mutex; a Decide locks the shards of its checks in ascending
// order, so multi-check decisions are atomic and cannot deadlock.
//
// Every bucket has an expiry instant from which its state equals a fresh
// bucket (see the algorithm docs): a lookup of an expired bucket starts
// afresh, and a sweeper goroutine deletes expired buckets every
// SweepInterval, one shard and 1024 buckets at a time, so requests never
// wait long for it.
//
// Decide, Peek and Release fail only on invalid input (a short results
// slice, a negative cost, a non-positive limit or window); they never block
// on anything but the shard locks, so ctx is not consulted.
//
// Memory is bounded: every shard has an equal share of MaxMemory, and every
// bucket weighs its key's length, a fixed overhead and its sliding log's
// buffer (16 bytes per admission in its window), so a flood of random or
// hostile tenants (a value adds at most 384 bytes to a key: 128 raw bytes,
// each escaped; longer ones are digested, see AppendEscaped) and a few
// heavy tenants (long logs) share the same
// bound in bytes. When a shard is over its share it first deletes its
// expired buckets (a sweep, at most once per half a share of inserted
// bytes, so the cost is amortized), then the least recently used ones. A
// single log larger than a shard's share is kept all the same (it holds at
// most one entry per admission in its window).
//
// A concurrency bucket with units in flight never expires and is never
// evicted, because forgetting it would let its tenant exceed the limit:
// such buckets may push a shard over its share, by at most the number of
// requests in flight. Reset does delete them; a later Release of a bucket
// that does not exist (or is already at zero) is ignored.
type MemoryStore struct {
	clock  Clock
	prefix string
	seed   maphash.Seed
	shards []memShard
	mask   uint64
	pool   sync.Pool

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

var _ Store = (*MemoryStore)(nil)

// memShard is one independently locked part of a MemoryStore.
type memShard struct {
	mu sync.Mutex
	m  map[string]*memEntry
	// LRU list: head is the most recently used entry.
	head, tail *memEntry
	// weight is the sum of the entries' weights in bytes, budget its
	// bound.
	weight, budget int
	// inserted counts the bytes of the entries inserted since the shard
	// last swept itself.
	inserted int
	_        [64]byte // keep hot shards on separate cache lines
}

// memEntry is one bucket.
type memEntry struct {
	key        string
	s          bucketState
	expires    int64 // from this instant s (and log) equal a fresh bucket
	log        *logRing
	prev, next *memEntry
}

// weight is what e counts against MaxMemory: an estimate of its heap.
func (e *memEntry) weight() int {
	w := memEntryOverhead + len(e.key)
	if e.log != nil {
		w += logRingBytes + e.log.bytes()
	}
	return w
}

// NewMemoryStore returns an empty store and starts its sweeper; Close stops
// it.
func NewMemoryStore(opts MemoryOptions) *MemoryStore {
	if opts.Clock == nil {
		opts.Clock = SystemClock{}
	}
	if opts.MaxMemory <= 0 {
		opts.MaxMemory = DefaultMaxMemory
	}
	if opts.SweepInterval == 0 {
		opts.SweepInterval = DefaultSweepInterval
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	shards := maxShards
	for shards > 1 && opts.MaxMemory/int64(shards) < minShardBudget {
		shards /= 2
	}
	m := &MemoryStore{
		clock:  opts.Clock,
		prefix: opts.Prefix,
		seed:   maphash.MakeSeed(),
		shards: make([]memShard, shards),
		mask:   uint64(shards - 1),
	}
	for i := range m.shards {
		sh := &m.shards[i]
		sh.m = make(map[string]*memEntry)
		sh.budget = int(opts.MaxMemory / int64(shards))
		if int64(i) < opts.MaxMemory%int64(shards) {
			sh.budget++
		}
	}
	m.pool.New = func() any { return new(memScratch) }
	if opts.SweepInterval > 0 {
		m.stop = make(chan struct{})
		m.done = make(chan struct{})
		go m.sweeper(opts.SweepInterval)
	}
	return m
}

// Decide implements Store. Checks are evaluated in order against one
// instant; two checks of the same bucket are chained, the second seeing the
// first as charged when that one allows. When the request is not admitted,
// the allowed checks report the current Remaining and Reset (nothing was
// charged). A bucket that is charged is created if needed; a denied one is
// not. ctx is not used: a decision never blocks on anything but the
// shard locks.
func (m *MemoryStore) Decide(_ context.Context, checks []Check, results []Result) (bool, error) {
	if len(results) < len(checks) {
		return false, errShortResults
	}
	for i := range checks {
		if err := checks[i].validate(); err != nil {
			return false, err
		}
	}
	now := m.now()
	sc := m.prepare(checks)
	m.lock(sc)
	admitted := true
	for i := range checks {
		c := &checks[i]
		f := sc.first[i]
		base, log := m.current(sc, c, i, now)
		res, next := evalAlgorithm(c.Algorithm, base, log, now, c.Rate, c.Cost)
		results[i] = res
		sc.charge[i] = res.Allowed && c.Cost > 0
		sc.next[i] = next
		if sc.charge[i] {
			sc.cur[f] = next
		} else {
			sc.cur[f] = base
		}
		if !res.Allowed && !c.Shadow {
			admitted = false
		}
	}
	if admitted {
		m.charge(sc, checks, now)
		for i := range checks {
			results[i].At = now
		}
	} else {
		m.uncharged(sc, checks, results, now)
	}
	m.unlock(sc)
	m.putScratch(sc)
	return admitted, nil
}

// current returns the state (and log) check i sees, with sc locked: its
// bucket as stored (refreshed at now) when it is the first check of its
// key, else the tentative state the earlier checks of the key left in
// sc.cur.
func (m *MemoryStore) current(sc *memScratch, c *Check, i int, now int64) (bucketState, *logRing) {
	f := sc.first[i]
	var base bucketState
	if f == i {
		sh := &m.shards[sc.shard[i]]
		e := sh.m[string(sc.keyOf(i))]
		if e != nil {
			sh.refresh(e, now, c)
			sh.touch(e)
			base = e.s
		}
		sc.ent[i] = e
	} else {
		base = sc.cur[f]
	}
	var log *logRing
	if e := sc.ent[f]; e != nil {
		log = e.log
	}
	return base, log
}

// charge writes the state of every charged check and makes room in the
// shards that grew.
func (m *MemoryStore) charge(sc *memScratch, checks []Check, now int64) {
	for i := range checks {
		if !sc.charge[i] {
			continue
		}
		c := &checks[i]
		sh := &m.shards[sc.shard[i]]
		f := sc.first[i]
		e := sc.ent[f]
		if e == nil {
			e = sh.insert(string(sc.keyOf(i)))
			sc.ent[f] = e
		}
		w := e.weight()
		if c.Algorithm == SlidingLog {
			if e.log == nil {
				e.log = new(logRing)
			}
			// Trimmed first with this check's window, the log never
			// holds more than Limit units.
			e.log.trim(now - int64(c.Rate.Window))
			e.log.add(now, c.Cost)
			e.s = bucketState{At: sc.next[i].At}
		} else {
			e.s = sc.next[i]
		}
		e.expires = expiresAt(c.Algorithm, e.s, e.log, c.Rate)
		sh.weight += e.weight() - w
	}
	for _, si := range sc.order {
		m.shards[si].makeRoom(now, sc)
	}
}

// uncharged replaces the results of checks that allowed a request which was
// not admitted by what their buckets hold now.
func (m *MemoryStore) uncharged(sc *memScratch, checks []Check, results []Result, now int64) {
	for i := range checks {
		c := &checks[i]
		if !results[i].Allowed || c.Cost == 0 {
			continue
		}
		var s bucketState
		var log *logRing
		if e := sc.ent[sc.first[i]]; e != nil {
			s, log = e.s, e.log
		}
		results[i], _ = evalAlgorithm(c.Algorithm, s, log, now, c.Rate, 0)
	}
}

// Peek implements Store: Allowed and RetryAfter say what Decide would
// answer for each check on its own; Remaining and Reset describe the bucket
// as it is (nothing is charged, so Remaining is not reduced by Cost).
func (m *MemoryStore) Peek(_ context.Context, checks []Check, results []Result) error {
	if len(results) < len(checks) {
		return errShortResults
	}
	for i := range checks {
		if err := checks[i].validate(); err != nil {
			return err
		}
	}
	now := m.now()
	sc := m.prepare(checks)
	m.lock(sc)
	for i := range checks {
		c := &checks[i]
		sh := &m.shards[sc.shard[i]]
		var s bucketState
		var log *logRing
		if e := sh.m[string(sc.keyOf(i))]; e != nil {
			sh.refresh(e, now, c)
			s, log = e.s, e.log
		}
		res, _ := evalAlgorithm(c.Algorithm, s, log, now, c.Rate, c.Cost)
		if res.Allowed && c.Cost > 0 {
			res, _ = evalAlgorithm(c.Algorithm, s, log, now, c.Rate, 0)
		}
		results[i] = res
	}
	m.unlock(sc)
	m.putScratch(sc)
	return nil
}

// Release implements Store: every Concurrency check gives back Cost units
// of its bucket (never going below zero). Pass only the checks that were
// charged: every non-shadow check of an admitted Decide, and the shadow
// checks whose result was Allowed.
func (m *MemoryStore) Release(_ context.Context, checks []Check) error {
	sc := m.pool.Get().(*memScratch)
	defer m.pool.Put(sc)
	for i := range checks {
		c := &checks[i]
		if c.Algorithm != Concurrency {
			continue
		}
		if c.Cost < 0 {
			return c.validate()
		}
		sc.key = AppendKey(sc.key[:0], m.prefix, c.Algorithm, c.Tenant, c.Policy, c.Part)
		sh := &m.shards[maphash.Bytes(m.seed, sc.key)&m.mask]
		sh.mu.Lock()
		if e := sh.m[string(sc.key)]; e != nil {
			e.s = concurrencyRelease(e.s, c.Cost)
			e.expires = expiresAt(Concurrency, e.s, nil, c.Rate)
		}
		sh.mu.Unlock()
	}
	return nil
}

// Reset implements Store. It matches keys on the escaped tenant between the
// hash-tag braces, which cannot contain a brace or a colon, so tenant "a"
// never matches the buckets of tenant "a:b" or "a}".
func (m *MemoryStore) Reset(_ context.Context, tenant string, policies []string) error {
	if len(policies) == 0 {
		return nil
	}
	tag := string(AppendTenantTag(nil, tenant))
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			for _, p := range policies {
				if memKeyMatches(k, m.prefix, tag, p) {
					sh.remove(e)
					break
				}
			}
		}
		sh.mu.Unlock()
	}
	return nil
}

// memKeyMatches reports whether key, built by AppendKey with prefix, belongs to
// the tenant whose escaped form is tag and, when policy is not empty, to
// that policy.
func memKeyMatches(key, prefix, tag, policy string) bool {
	rest, ok := strings.CutPrefix(key, prefix+":")
	if !ok {
		return false
	}
	// Skip the algorithm name, then expect "{" tag "}:".
	i := strings.IndexByte(rest, ':')
	if i < 0 {
		return false
	}
	rest, ok = strings.CutPrefix(rest[i+1:], "{"+tag+"}:")
	if !ok {
		return false
	}
	if policy == "" {
		return true
	}
	rest, ok = strings.CutPrefix(rest, policy)
	return ok && (rest == "" || rest[0] == ':')
}

// Len returns the number of buckets stored, including expired ones the
// sweeper has not deleted yet.
func (m *MemoryStore) Len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Close stops the sweeper. The store still answers afterwards, without
// background sweeping. Close may be called more than once.
func (m *MemoryStore) Close() error {
	m.closeOnce.Do(func() {
		if m.stop != nil {
			close(m.stop)
			<-m.done
		}
	})
	return nil
}

func (m *MemoryStore) now() int64 { return m.clock.Now().UnixNano() }

func (m *MemoryStore) sweeper(every time.Duration) {
	defer close(m.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.sweep()
		}
	}
}

// sweep deletes every expired bucket and returns how many it deleted. It
// holds a shard's lock for at most sweepChunk buckets at a time, so
// requests wait for it no longer than for a fraction of a millisecond.
func (m *MemoryStore) sweep() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		now := m.now()
		seen := 0
		// Go maps may be modified during a range loop: entries deleted
		// meanwhile are skipped, entries added may or may not be seen.
		for _, e := range sh.m {
			if now >= e.expires {
				sh.remove(e)
				n++
			}
			if seen++; seen%sweepChunk == 0 {
				sh.mu.Unlock()
				runtime.Gosched()
				sh.mu.Lock()
				now = m.now()
			}
		}
		sh.inserted = 0
		sh.mu.Unlock()
	}
	return n
}

// lock locks the shards of sc in ascending order.
func (m *MemoryStore) lock(sc *memScratch) {
	for _, i := range sc.order {
		m.shards[i].mu.Lock()
	}
}

func (m *MemoryStore) unlock(sc *memScratch) {
	for j := len(sc.order) - 1; j >= 0; j-- {
		m.shards[sc.order[j]].mu.Unlock()
	}
}

// prepare builds the keys of checks into a pooled scratch, finds their
// shards, the distinct shards in ascending order, and which checks share a
// bucket.
func (m *MemoryStore) prepare(checks []Check) *memScratch {
	sc := m.pool.Get().(*memScratch)
	sc.reset(len(checks))
	for i := range checks {
		c := &checks[i]
		start := len(sc.key)
		sc.key = AppendKey(sc.key, m.prefix, c.Algorithm, c.Tenant, c.Policy, c.Part)
		sc.end[i] = len(sc.key)
		si := int(maphash.Bytes(m.seed, sc.key[start:]) & m.mask)
		sc.shard[i] = si
		sc.first[i] = i
		for j := 0; j < i; j++ {
			if sc.first[j] == j && sc.shard[j] == si && bytes.Equal(sc.keyOf(j), sc.keyOf(i)) {
				sc.first[i] = j
				break
			}
		}
		sc.addShard(si)
	}
	return sc
}

// putScratch returns sc to the pool without keeping buckets alive.
func (m *MemoryStore) putScratch(sc *memScratch) {
	clear(sc.ent)
	m.pool.Put(sc)
}

// memScratch is the per-call working memory of a MemoryStore, pooled so that
// a decision on existing buckets allocates nothing.
type memScratch struct {
	key    []byte        // the keys of all checks, back to back
	end    []int         // end offset of check i's key in key
	shard  []int         // shard index of check i
	order  []int         // distinct shard indices, ascending
	first  []int         // index of the first check with the same key as check i
	ent    []*memEntry   // bucket of check i when it is the first of its key
	cur    []bucketState // tentative state of the bucket first seen at check i
	next   []bucketState // state of check i's bucket if check i is charged
	charge []bool        // check i is charged if the request is admitted
}

func (sc *memScratch) reset(n int) {
	sc.key = sc.key[:0]
	sc.order = sc.order[:0]
	sc.end = resizeSlice(sc.end, n)
	sc.shard = resizeSlice(sc.shard, n)
	sc.first = resizeSlice(sc.first, n)
	sc.ent = resizeSlice(sc.ent, n)
	clear(sc.ent)
	sc.cur = resizeSlice(sc.cur, n)
	sc.next = resizeSlice(sc.next, n)
	sc.charge = resizeSlice(sc.charge, n)
}

func resizeSlice[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

func (sc *memScratch) keyOf(i int) []byte {
	start := 0
	if i > 0 {
		start = sc.end[i-1]
	}
	return sc.key[start:sc.end[i]]
}

// addShard inserts si into the ascending set order.
func (sc *memScratch) addShard(si int) {
	j := len(sc.order)
	for j > 0 && sc.order[j-1] >= si {
		if sc.order[j-1] == si {
			return
		}
		j--
	}
	sc.order = append(sc.order, 0)
	copy(sc.order[j+1:], sc.order[j:])
	sc.order[j] = si
}

// uses reports whether e is a bucket of the current call.
func (sc *memScratch) uses(e *memEntry) bool {
	for _, x := range sc.ent {
		if x == e {
			return true
		}
	}
	return false
}

// refresh makes an expired entry a fresh bucket in place and drops the
// sliding-log units that left the window; neither changes what the entry
// means, only how it is stored.
func (sh *memShard) refresh(e *memEntry, now int64, c *Check) {
	if e.log == nil && now < e.expires {
		return
	}
	w := e.weight()
	if now >= e.expires {
		e.s = bucketState{}
		if e.log != nil {
			e.log.reset()
		}
	} else {
		e.log.trim(now - int64(c.Rate.Window))
	}
	sh.weight += e.weight() - w
}

// insert adds a fresh bucket for key at the head of the LRU list.
func (sh *memShard) insert(key string) *memEntry {
	e := &memEntry{key: key, expires: math.MinInt64}
	sh.m[key] = e
	sh.pushFront(e)
	sh.weight += e.weight()
	sh.inserted += e.weight()
	return e
}

// remove deletes e from the shard.
func (sh *memShard) remove(e *memEntry) {
	delete(sh.m, e.key)
	sh.unlink(e)
	sh.weight -= e.weight()
}

// sweep deletes the expired entries of the shard and returns how many.
func (sh *memShard) sweep(now int64) int {
	n := 0
	for _, e := range sh.m {
		if now >= e.expires {
			sh.remove(e)
			n++
		}
	}
	sh.inserted = 0
	return n
}

// makeRoom brings the shard back within its budget: expired entries first,
// then least recently used ones, skipping buckets in flight and stopping at
// the buckets of the current call (which sit at the head of the list).
func (sh *memShard) makeRoom(now int64, sc *memScratch) {
	if sh.weight <= sh.budget {
		return
	}
	if sh.inserted >= max(sh.budget/2, 1) {
		sh.sweep(now)
	}
	for e := sh.tail; e != nil && sh.weight > sh.budget; {
		prev := e.prev
		if sc.uses(e) {
			return
		}
		if e.expires != pinnedExpiry {
			sh.remove(e)
		}
		e = prev
	}
}

func (sh *memShard) pushFront(e *memEntry) {
	e.prev, e.next = nil, sh.head
	if sh.head != nil {
		sh.head.prev = e
	} else {
		sh.tail = e
	}
	sh.head = e
}

func (sh *memShard) unlink(e *memEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		sh.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		sh.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

// touch moves e to the head of the LRU list.
func (sh *memShard) touch(e *memEntry) {
	if sh.head == e {
		return
	}
	sh.unlink(e)
	sh.pushFront(e)
}
