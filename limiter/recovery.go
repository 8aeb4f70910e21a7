package limiter

import (
	"cmp"
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"
)

// Charger is a store that can move units into and out of buckets without
// deciding: settlements, recovery charges and the refunds of turns given
// back. RedisStore, MemoryStore, BreakerStore and LeaseStore (over a
// Charger) are Chargers.
type Charger interface {
	// Charge moves units, check by check, whatever the others do (two
	// checks of one bucket are chained): a positive Cost charges
	// min(Cost, what the bucket holds under its Rate) units, so a
	// bucket goes at most down to its empty (pass a rate with room for
	// debt to charge into debt; min_interval, delays and shadow flags
	// are ignored, concurrency buckets are never charged); a negative
	// Cost gives -Cost units back to a token bucket or GCRA bucket, never
	// beyond full (a bucket that expired or was reset has nothing to give
	// back; other algorithms keep their units). charged[i] receives the
	// units moved (negative for a give-back), ChargeFailed when its call
	// failed or was not made, or ChargeRefused when the check is invalid
	// and was not sent (the others are moved all the same).
	//
	// id, when not empty, makes the call idempotent: whatever the number
	// of attempts with the same id, the store applies the call once and
	// answers every attempt the same (within IdempotencyTTL). Pass a
	// NewChargeID and retry a failed call with it; "" for a call that is
	// never retried.
	Charge(ctx context.Context, id string, checks []Check, charged []int64) error
}

// The charged[i] of a check that Charge did not move.
const (
	// ChargeFailed: the check's call failed or was not made. A call that
	// timed out may still have run.
	ChargeFailed = math.MinInt64
	// ChargeRefused: the check is invalid input and was not sent; retrying
	// it cannot help.
	ChargeRefused = math.MinInt64 + 1
)

// chargeable validates a check of Charge: as Decide would, with the
// magnitude of its cost.
func chargeable(c *Check) error {
	if c.Cost >= 0 {
		return c.validate()
	}
	cc := *c
	cc.Cost = -cc.Cost
	return cc.validate()
}

var _ Charger = (*RedisStore)(nil)

// ErrNoCharge is returned by BreakerStore.Charge when its inner store is
// not a Charger.
var ErrNoCharge = errors.New("limiter: the store cannot charge units (not a Charger)")

// Defaults of RecorderOptions.
const (
	DefaultRecorderEntries = 100_000
	DefaultRecorderBatch   = 256
)

// RecorderOptions configures NewRecorder. The zero value is ready to use.
type RecorderOptions struct {
	// MaxEntries bounds how many buckets and calls the recorder keeps; 0
	// means 100000 (a few hundred bytes each plus the strings). Units of
	// new buckets and calls beyond it are dropped and counted (Dropped).
	MaxEntries int
	// Batch is the most checks sent in one Charge call; 0 means 256.
	Batch int
	// Clock tells the time; nil means SystemClock.
	Clock Clock
}

// Recorder keeps what the primary store owes, so that it is charged once
// the store answers again (Flush): a tenant then cannot get a fresh
// budget, or shed a debt, by riding an outage. It keeps two things.
//
// Units used while the store was not asked, per bucket (Record): what the
// local fallback admitted (set the Recorder as Fallback.Recorder and
// DecideOrFallback records every unit the fallback store charged:
// FailLocal items only, FailOpen admissions are not counted, FailClosed
// ones admit nothing, concurrency slots are given back anyway), and the
// settlements and give-backs of requests that never reached the store.
// Flush charges them as what they are, units the tenant used: into debt
// if the bucket holds less (see debtRate), so an outage never erases what
// a tenant used, even one the fallback's own fresh bucket admitted while
// the shared one was empty.
//
// Calls that reached the store, or may have, and failed: a settlement, a
// refund, a lease give-back whose reply was lost (Retry, RetryGiveBack),
// the release of concurrency slots held under ids (RetryRelease: one that
// failed, or one for an acquire whose reply was lost).
// Each keeps its id, and Flush sends it again with that id until the
// store answers, so it is applied once whether or not the first attempt
// ran (see NewChargeID). It is never recorded a second time as units.
//
// Units lose their weight with time as the buckets would. Per bucket the
// recorder keeps the rate (unscaled, as the primary store knows it). A
// token bucket or GCRA bucket's units count until the bucket would have
// refilled them: units used age ago still count min(units, capacity +
// units - age x limit/window) (exact for a bucket that was not in debt
// already). A window or log bucket's units are kept in slots of a tenth of
// its window, and Flush charges the units of the trailing window, rounded
// out to whole slots (so up to a tenth of a window older, never less);
// older units are forgotten, as those algorithms count them no more. A
// call sent again later is charged what still counts of its units in the
// same way. The store charges at the instant of the flush, which errs on
// the strict side: units count a little longer than they would have.
//
// Time is the recorder's clock, the instance's own: the primary store,
// whose clock rules otherwise, is unreachable while units are recorded.
//
// All methods are safe for concurrent use; Record takes a mutex and
// allocates only for a new bucket.
type Recorder struct {
	clock Clock
	max   int
	batch int

	mu      sync.Mutex
	entries map[recKey]*recEntry
	calls   []*pendingCall // oldest first

	pending  atomic.Int64 // len(entries) + len(calls)
	dropped  atomic.Int64
	refused  atomic.Int64
	flushing atomic.Bool
}

type recKey struct {
	algo                 Algorithm
	tenant, policy, part string
}

// recSlots is the number of slots per window; the ring keeps one more, so
// that the slots it sums always cover the whole trailing window.
const recSlots = 10

// recEntry counts a bucket's units. A token bucket or GCRA bucket owes
// units, last recorded at owedAt; a window or log bucket counts them per
// slot of Window/recSlots: slot number k (k = instant / slot length) is
// counts[k % len(counts)], for k in (last - len(counts), last].
type recEntry struct {
	rate   Rate
	last   int64
	counts [recSlots + 1]int64
	owed   int64
	owedAt int64
}

// refills reports whether the recorded units of k are kept as a debt that
// refills (owed) rather than in slots.
func (k *recKey) refills() bool { return k.algo.Refills() }

func newRecEntry(rate Rate, now int64) *recEntry {
	e := &recEntry{rate: rate}
	e.last = e.slot(now)
	return e
}

// slot returns the slot number of instant t.
func (e *recEntry) slot(t int64) int64 {
	return t / max(1, int64(e.rate.Window)/recSlots)
}

// roll advances the ring to slot k, clearing the slots it passes.
func (e *recEntry) roll(k int64) {
	if k <= e.last {
		return
	}
	n := int64(len(e.counts))
	if k-e.last >= n {
		e.counts = [recSlots + 1]int64{}
	} else {
		for j := e.last + 1; j <= k; j++ {
			e.counts[j%n] = 0
		}
	}
	e.last = k
}

// addAt adds units to slot k (the newest slot when k is older than the
// ring, as when the clock went back), saturating at MaxCount. Negative
// units are taken from the newest slots first, down to zero; left is
// what could not be taken (0 or negative).
func (e *recEntry) addAt(k int64, units int64) (left int64) {
	e.roll(k)
	n := int64(len(e.counts))
	if k <= e.last-n {
		k = e.last
	}
	if units >= 0 {
		i := k % n
		e.counts[i] = min(e.counts[i]+min(units, MaxCount), MaxCount)
		return 0
	}
	for j := e.last; j > e.last-n && units < 0; j-- {
		i := j % n
		take := min(e.counts[i], -units)
		e.counts[i] -= take
		units += take
	}
	return units
}

// estimate returns the units that still count at now: those of the slots
// that overlap the trailing window, or what is left of a debt.
func (e *recEntry) estimate(k *recKey, now int64) int64 {
	if k.refills() {
		return stillOwed(k.algo, e.rate, e.owed, now-e.owedAt)
	}
	cur := max(e.slot(now), e.last)
	n := int64(len(e.counts))
	var sum int64
	for j := max(cur-recSlots, e.last-n+1); j <= e.last; j++ {
		sum += e.counts[j%n]
	}
	return min(sum, MaxCount)
}

// stillOwed returns how many of units charged age ns ago to a bucket of
// algorithm a and rate r still count: for a token bucket or GCRA bucket,
// what it has not refilled beyond its capacity (units charged when it was
// not in debt stop counting once it has refilled capacity + units); for
// window and log algorithms, all of them until the windows that count
// them have passed.
func stillOwed(a Algorithm, r Rate, units, age int64) int64 {
	if units <= 0 || age <= 0 || r.Window <= 0 || r.Limit <= 0 {
		return max(units, 0)
	}
	switch a {
	case TokenBucket, GCRA:
		left := float64(r.Capacity()) + float64(units) - float64(age)/float64(r.Window)*float64(r.Limit)
		if left <= 0 {
			return 0
		}
		return min(units, int64(math.Ceil(left)))
	case Concurrency:
		return 0
	case SlidingWindow:
		// A unit weighs on the window after its own.
		if age >= 2*int64(r.Window) {
			return 0
		}
	default:
		if age >= max(int64(r.Window), int64(r.MinInterval)) {
			return 0
		}
	}
	return units
}

// pendingCall is a call that failed and is sent again under its id.
type pendingCall struct {
	id string
	// at is when the call was made (recorder clock): positive costs are
	// charged what still counts of them (stillOwed) when sent.
	at int64
	// checks are the call's checks with their buckets' own rates; a
	// positive Cost is charged (into debt), a negative one given back.
	checks []Check
	// giveBack, when set, is a lease give-back retried (LeaseRequest.Retry)
	// instead of a charge.
	giveBack *LeaseRequest
	// release, when set, are concurrency slots held under ids, released
	// instead of a charge: by the request's own release (releaseSure,
	// Store.Release) until an attempt may have run, then as lost
	// (lostReleaser).
	release     []Check
	releaseSure bool
}

// NewRecorder returns an empty recorder.
func NewRecorder(opts RecorderOptions) *Recorder {
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultRecorderEntries
	}
	if opts.Batch <= 0 {
		opts.Batch = DefaultRecorderBatch
	}
	if opts.Clock == nil {
		opts.Clock = SystemClock{}
	}
	return &Recorder{
		clock:   opts.Clock,
		max:     opts.MaxEntries,
		batch:   opts.Batch,
		entries: make(map[recKey]*recEntry),
	}
}

// Record counts units used of the bucket of c, whose unscaled rate is
// rate, while the primary store was not asked: admitted by the fallback,
// or settled while the store was unreachable. Negative units take back
// units recorded earlier (a request that gave its turn back, a real cost
// lower than the up-front one); left is what the Recorder no longer held
// of them (a Flush sent them to the store since, or they were never
// kept), 0 or negative: the caller gives that back to the store itself.
// Concurrency checks, zero units and rates without a window are ignored.
func (r *Recorder) Record(c *Check, rate Rate, units int64) (left int64) {
	return r.record(recKey{c.Algorithm, c.Tenant, c.Policy, c.Part}, rate, units)
}

func (r *Recorder) record(k recKey, rate Rate, units int64) (left int64) {
	if units == 0 || k.algo == Concurrency || rate.Window <= 0 {
		return 0
	}
	now := r.clock.Now().UnixNano()
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entries[k]
	switch {
	case e == nil:
		if units < 0 {
			return units // nothing recorded to take back
		}
		if !r.room() {
			r.dropped.Add(units)
			return 0
		}
		e = newRecEntry(rate, now)
		r.entries[k] = e
		r.count()
	case e.rate.Window != rate.Window:
		// The window changed (a new config or a runtime override): start over
		// with what still counts.
		est := e.estimate(&k, now)
		*e = *newRecEntry(rate, now)
		e.addAt(e.last, est)
		e.owed, e.owedAt = est, now
	}
	e.rate = rate
	if k.refills() {
		owed := e.owed + units
		e.owed = max(0, min(owed, MaxCount))
		e.owedAt = now
		return min(owed, 0)
	}
	return e.addAt(e.slot(now), units)
}

// Retry keeps a call to a Charger that failed, to be sent again with the
// same id by Flush until the store answers it: the call may have run, so
// it is never recorded as units. checks holds its checks with their
// buckets' own (unscaled) rates; positive costs are charged into debt,
// negative ones given back. The checks are copied.
func (r *Recorder) Retry(id string, checks []Check) {
	c := &pendingCall{id: id, at: r.clock.Now().UnixNano()}
	for i := range checks {
		if checks[i].Cost != 0 && checks[i].Algorithm != Concurrency {
			c.checks = append(c.checks, checks[i])
		}
	}
	if len(c.checks) > 0 {
		r.keep(c, c.checks)
	}
}

// RetryGiveBack keeps a lease give-back that failed (req.ID set), to be
// sent again by Flush as a retry (LeaseRequest.Retry: the units it gives
// back, and those a lost grant of the same call took, go back once).
func (r *Recorder) RetryGiveBack(req *LeaseRequest) {
	if req.ID == "" {
		return
	}
	g := *req
	g.Checks = slices.Clone(req.Checks)
	g.Want, g.Retry = 0, true
	r.keep(&pendingCall{id: g.ID, at: r.clock.Now().UnixNano(), giveBack: &g}, g.Checks)
}

// RetryRelease keeps the release of the concurrency slots of checks held
// under an id (Check.Hold), to be sent by Flush until the store answers:
// a release that failed, or the release of an acquire whose reply was
// lost. Each slot is given back once, whether or not an earlier attempt,
// or the acquire, ran (see hold.go). Checks without a Hold are left out:
// a blind release could free another request's slot. The checks are
// copied.
//
// sure says the release is the request's own, which saw its acquire
// admitted, and was never sent: it is sent as such (a slot whose record
// is gone is still given back) until an attempt may have run.
func (r *Recorder) RetryRelease(checks []Check, sure bool) {
	c := &pendingCall{at: r.clock.Now().UnixNano(), releaseSure: sure}
	for i := range checks {
		if held(&checks[i]) {
			c.release = append(c.release, checks[i])
		}
	}
	if len(c.release) > 0 {
		c.id = c.release[0].Hold
		r.keep(c, c.release)
	}
}

// keep adds c to the calls, or counts its units as dropped when the
// recorder is full.
func (r *Recorder) keep(c *pendingCall, checks []Check) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.room() {
		for i := range checks {
			r.dropped.Add(max(checks[i].Cost, 0))
		}
		return
	}
	r.calls = append(r.calls, c)
	r.count()
}

// room reports whether one more bucket or call fits; with r.mu held.
func (r *Recorder) room() bool { return len(r.entries)+len(r.calls) < r.max }

// count updates pending; with r.mu held.
func (r *Recorder) count() { r.pending.Store(int64(len(r.entries) + len(r.calls))) }

// Pending returns the number of buckets and calls not yet charged. It is
// one atomic load: cheap enough to ask on every request.
func (r *Recorder) Pending() int { return int(r.pending.Load()) }

// Dropped returns the units not recorded because MaxEntries buckets and
// calls were already kept.
func (r *Recorder) Dropped() int64 { return r.dropped.Load() }

// Refused returns the number of checks Flush dropped because the store
// refused them as invalid.
func (r *Recorder) Refused() int64 { return r.refused.Load() }

// FlushStats reports one Flush.
type FlushStats struct {
	// Calls is the number of calls the store answered; Buckets the
	// checks they held; Units the units asked to charge (what still
	// counted) and Charged those the store charged (less when a bucket
	// reached empty, or when the call was a retry of one that had
	// already run and was answered from its record).
	Calls, Buckets, Units, Charged int64
	// Expired is the number of buckets and calls dropped without a call
	// because nothing they held counted any more.
	Expired int64
	// Refused is the number of checks the store refused as invalid
	// (ChargeRefused): they are dropped, not retried.
	Refused int64
}

// Flush charges the primary store (normally a BreakerStore over it, so
// that a store failing again trips the breaker) with what is owed: the
// calls kept by Retry, RetryGiveBack and RetryRelease, oldest first, then the recorded
// units, which become calls of at most Batch checks with ids of their
// own. A call the store answers is forgotten; when a call fails, it and
// the later ones are kept, with their ids, for the next Flush, and the
// error is returned. Call it when the primary store answers: when the
// breaker closes, and whenever Pending is not zero while the store
// answers (short failures that never opened the breaker leave owed units
// too). Only one Flush runs at a time: a concurrent call returns at once
// with zero stats and a nil error.
func (r *Recorder) Flush(ctx context.Context, store Charger) (FlushStats, error) {
	var st FlushStats
	if !r.flushing.CompareAndSwap(false, true) {
		return st, nil
	}
	defer r.flushing.Store(false)
	// Calls kept from earlier flushes first; recorded units become calls
	// only then, so that units recorded meanwhile (or taken back) stay
	// units while the store is failing.
	made := false
	for {
		r.mu.Lock()
		if len(r.calls) == 0 {
			r.mu.Unlock()
			if made {
				return st, nil
			}
			r.callsOf(&st)
			made = true
			continue
		}
		c := r.calls[0]
		r.mu.Unlock()
		if err := r.send(ctx, store, c, &st); err != nil {
			return st, err
		}
		r.mu.Lock()
		r.calls[0] = nil
		r.calls = r.calls[1:]
		r.count()
		r.mu.Unlock()
	}
}

// callsOf turns the recorded units into calls with ids of their own.
func (r *Recorder) callsOf(st *FlushStats) {
	r.mu.Lock()
	snap := r.entries
	r.entries = make(map[recKey]*recEntry)
	r.mu.Unlock()
	if len(snap) == 0 {
		return
	}
	now := r.clock.Now().UnixNano()
	type item struct {
		k     recKey
		units int64
		rate  Rate
	}
	items := make([]item, 0, len(snap))
	for k, e := range snap {
		units := e.estimate(&k, now)
		if units <= 0 {
			st.Expired++
			continue
		}
		items = append(items, item{k, units, e.rate})
	}
	// A tenant's buckets side by side: one cluster slot, fewer calls.
	slices.SortFunc(items, func(a, b item) int {
		return cmp.Or(
			cmp.Compare(a.k.tenant, b.k.tenant),
			cmp.Compare(a.k.policy, b.k.policy),
			cmp.Compare(a.k.part, b.k.part),
			cmp.Compare(a.k.algo, b.k.algo),
		)
	})
	var calls []*pendingCall
	for lo := 0; lo < len(items); lo += r.batch {
		hi := min(lo+r.batch, len(items))
		c := &pendingCall{id: NewChargeID(), at: now}
		for _, it := range items[lo:hi] {
			c.checks = append(c.checks, Check{
				Algorithm: it.k.algo,
				Tenant:    it.k.tenant,
				Policy:    it.k.policy,
				Part:      it.k.part,
				Rate:      it.rate,
				Cost:      it.units,
			})
		}
		calls = append(calls, c)
	}
	r.mu.Lock()
	r.calls = append(r.calls, calls...)
	r.count()
	r.mu.Unlock()
}

// answered counts a kept call of n checks the store answered err: a call
// it refused as invalid (or as a lease it cannot take) is dropped, never
// retried; another error keeps it.
func (r *Recorder) answered(st *FlushStats, err error, n int) error {
	if errors.Is(err, ErrInvalidCheck) || errors.Is(err, ErrLeaseUnsupported) {
		st.Refused++
		r.refused.Add(1)
		return nil
	}
	if err == nil {
		st.Calls++
		st.Buckets += int64(n)
	}
	return err
}

// send makes call c once more. It returns nil when the store answered (or
// nothing of c counts any more), the store's error otherwise.
func (r *Recorder) send(ctx context.Context, store Charger, c *pendingCall, st *FlushStats) error {
	if c.release != nil {
		rs, ok := store.(Store)
		if !ok {
			return nil
		}
		var err error
		if c.releaseSure {
			err = rs.Release(ctx, c.release)
			c.releaseSure = !mayHaveRun(err)
		} else {
			err = releaseLostTo(ctx, rs, c.release)
		}
		return r.answered(st, err, len(c.release))
	}
	if c.giveBack != nil {
		lt, ok := store.(LeaseTaker)
		if !ok {
			return nil
		}
		results := make([]Result, len(c.giveBack.Checks))
		_, err := lt.Lease(ctx, c.giveBack, results)
		return r.answered(st, err, len(c.giveBack.Checks))
	}
	age := r.clock.Now().UnixNano() - c.at
	checks := make([]Check, 0, len(c.checks))
	// A check invalid under its own rate (which debtRate would hide)
	// would be refused forever: dropped, once.
	valid := c.checks[:0]
	for _, ch := range c.checks {
		if chargeable(&ch) == nil {
			valid = append(valid, ch)
		}
	}
	refused := len(c.checks) - len(valid)
	clear(c.checks[len(valid):])
	c.checks = valid
	// Every attempt sends the same checks in the same order, a check whose
	// units no longer count with cost 0: the id's key is in the slot of
	// the first check of each slot, and a call that ran is answered with
	// one result per check it had.
	owed := false
	for _, ch := range c.checks {
		if ch.Cost > 0 {
			ch.Cost = stillOwed(ch.Algorithm, ch.Rate, ch.Cost, age)
			ch.Rate = debtRate(ch.Algorithm, ch.Rate)
		}
		owed = owed || ch.Cost != 0
		checks = append(checks, ch)
	}
	st.Refused += int64(refused)
	r.refused.Add(int64(refused))
	if !owed {
		// Nothing counts any more, whether or not an attempt ran.
		if refused == 0 {
			st.Expired++
		}
		return nil
	}
	charged := make([]int64, len(checks))
	err := store.Charge(ctx, c.id, checks, charged)
	for j, n := range charged {
		switch {
		case n == ChargeRefused:
			st.Refused++
			r.refused.Add(1)
		case n == ChargeFailed:
		case err == nil:
			st.Buckets++
			st.Units += max(checks[j].Cost, 0)
			st.Charged += max(n, 0)
		}
	}
	if err == nil {
		st.Calls++
	}
	return err
}
