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

// Charger is a store that can force units into buckets without deciding:
// recovery accounting charges it with what a fallback admitted while it
// was unreachable. RedisStore and BreakerStore (over a Charger) are
// Chargers.
type Charger interface {
	// Charge charges checks[i].Cost units to each bucket, never driving a
	// bucket below empty, and stores in charged[i] the units it charged
	// (-1 when its call failed or was not made, ChargeRefused when the
	// check is invalid and was not sent; the others are still charged).
	Charge(ctx context.Context, checks []Check, charged []int64) error
}

// ChargeRefused is the charged[i] of a check that Charge refused as
// invalid input: retrying it cannot help.
const ChargeRefused = -2

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
	// MaxEntries bounds how many buckets the recorder tracks; 0 means
	// 100000 (about 200 bytes each plus the strings). Units of new buckets
	// beyond it are dropped and counted (Dropped).
	MaxEntries int
	// Batch is the most checks sent in one Charge call; 0 means 256.
	Batch int
	// Clock tells the time; nil means SystemClock.
	Clock Clock
}

// Recorder keeps what the local fallback admitted while the primary store
// was unreachable, so that the units can be charged to the primary store
// once it is back (Flush): a tenant then cannot get a fresh budget by
// riding an outage. Set it as Fallback.Recorder; DecideOrFallback records
// every unit the fallback store charged (FailLocal items only: FailOpen
// admissions are not counted, FailClosed ones admit nothing; concurrency
// slots are not recorded, they are given back anyway).
//
// Per bucket it keeps the rate (unscaled, as the primary store knows it)
// and the units admitted in slots of a tenth of the bucket's window. Flush
// charges the units of the trailing window, rounded out to whole slots (so
// up to a tenth of a window older, never less); older units are forgotten:
// by then every algorithm counts them no more (token bucket and GCRA with
// a burst larger than the limit refill over burst/limit windows, so for
// them older units are undercounted). The primary store charges them at
// the instant of the flush and caps each bucket at empty (see
// RedisStore.Charge): token bucket deficit and GCRA backlog at most the
// capacity, window and log counts at most the limit. Charging at the flush
// instant rather than at each admission errs on the strict side: the units
// count a little longer than they would have.
//
// Time is the recorder's clock, the instance's own: the primary store,
// whose clock rules otherwise, is unreachable while units are recorded.
//
// All methods are safe for concurrent use; Record takes a mutex and
// allocates only for a new bucket. A bucket costs about 150 bytes plus its
// strings.
type Recorder struct {
	clock Clock
	max   int
	batch int

	mu      sync.Mutex
	entries map[recKey]*recEntry

	pending  atomic.Int64 // len(entries)
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

// recEntry counts a bucket's units per slot of Window/recSlots: slot
// number k (k = instant / slot length) is counts[k % len(counts)], for k in
// (last - len(counts), last].
type recEntry struct {
	rate   Rate
	last   int64
	counts [recSlots + 1]uint32
}

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
		e.counts = [recSlots + 1]uint32{}
	} else {
		for j := e.last + 1; j <= k; j++ {
			e.counts[j%n] = 0
		}
	}
	e.last = k
}

// addAt adds units to slot k (the newest slot when k is older than the
// ring, as when the clock went back), saturating.
func (e *recEntry) addAt(k int64, units int64) {
	e.roll(k)
	n := int64(len(e.counts))
	if k <= e.last-n {
		k = e.last
	}
	i := k % n
	e.counts[i] = uint32(min(int64(e.counts[i])+units, math.MaxUint32))
}

// estimate returns the units of the slots that overlap the trailing window
// at now.
func (e *recEntry) estimate(now int64) int64 {
	k := max(e.slot(now), e.last)
	n := int64(len(e.counts))
	var sum int64
	for j := max(k-recSlots, e.last-n+1); j <= e.last; j++ {
		sum += int64(e.counts[j%n])
	}
	return sum
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

// Record counts units admitted by the fallback for the bucket of c, whose
// unscaled rate is rate. Concurrency checks, non-positive units and rates
// without a window are ignored.
func (r *Recorder) Record(c *Check, rate Rate, units int64) {
	if units <= 0 || c.Algorithm == Concurrency || rate.Window <= 0 {
		return
	}
	now := r.clock.Now().UnixNano()
	k := recKey{c.Algorithm, c.Tenant, c.Policy, c.Part}
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entries[k]
	switch {
	case e == nil:
		if len(r.entries) >= r.max {
			r.dropped.Add(units)
			return
		}
		e = newRecEntry(rate, now)
		r.entries[k] = e
		r.pending.Store(int64(len(r.entries)))
	case e.rate.Window != rate.Window:
		// The window changed (a new config or override): start over
		// with what still counts.
		est := e.estimate(now)
		*e = *newRecEntry(rate, now)
		e.addAt(e.last, est)
	}
	e.rate = rate
	e.addAt(e.slot(now), units)
}

// Pending returns the number of buckets with recorded units not yet
// flushed. It is one atomic load: cheap enough to ask on every request.
func (r *Recorder) Pending() int { return int(r.pending.Load()) }

// Dropped returns the units not recorded because MaxEntries buckets were
// already tracked.
func (r *Recorder) Dropped() int64 { return r.dropped.Load() }

// Refused returns the number of buckets Flush dropped because the store
// refused them as invalid.
func (r *Recorder) Refused() int64 { return r.refused.Load() }

// FlushStats reports one Flush.
type FlushStats struct {
	// Buckets is the number of buckets charged; Units the units asked to
	// charge (the trailing-window estimates) and Charged those the store
	// charged (less when a bucket reached empty).
	Buckets, Units, Charged int64
	// Expired is the number of buckets whose units were all older than a
	// window, forgotten without a call.
	Expired int64
	// Refused is the number of buckets the store refused as invalid
	// (ChargeRefused): they are dropped, not retried.
	Refused int64
}

// Flush charges every recorded bucket to store (normally the primary
// store, or a BreakerStore over it, so that a store failing again trips
// the breaker) in calls of at most Batch checks, and forgets what it
// charged. Call it when the primary store is back: when the breaker
// closes (from BreakerOptions.OnStateChange, in a new goroutine: the
// callback must not block), and whenever Pending is not zero while the
// store answers (short failures that never opened the breaker are
// recorded too).
//
// A bucket the store refuses as invalid (ChargeRefused) is dropped and
// counted (FlushStats.Refused, Refused), so one bad entry cannot keep the
// others from being charged. When a call fails, the buckets it and later
// calls held are kept for the next Flush (merged with units recorded meanwhile) and the error is
// returned; a call that timed out may have charged already, so those units
// may be charged twice (capped at empty). Only one Flush runs at a time: a
// concurrent call returns at once with zero stats and a nil error.
func (r *Recorder) Flush(ctx context.Context, store Charger) (FlushStats, error) {
	var st FlushStats
	if !r.flushing.CompareAndSwap(false, true) {
		return st, nil
	}
	defer r.flushing.Store(false)

	r.mu.Lock()
	snap := r.entries
	r.entries = make(map[recKey]*recEntry)
	r.pending.Store(0)
	r.mu.Unlock()
	if len(snap) == 0 {
		return st, nil
	}

	now := r.clock.Now().UnixNano()
	type item struct {
		k recKey
		e *recEntry
	}
	items := make([]item, 0, len(snap))
	for k, e := range snap {
		if e.estimate(now) <= 0 {
			st.Expired++
			continue
		}
		items = append(items, item{k, e})
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

	checks := make([]Check, 0, min(r.batch, len(items)))
	charged := make([]int64, min(r.batch, len(items)))
	for lo := 0; lo < len(items); lo += r.batch {
		hi := min(lo+r.batch, len(items))
		checks = checks[:0]
		for _, it := range items[lo:hi] {
			checks = append(checks, Check{
				Algorithm: it.k.algo,
				Tenant:    it.k.tenant,
				Policy:    it.k.policy,
				Part:      it.k.part,
				Rate:      it.e.rate,
				Cost:      it.e.estimate(now),
			})
		}
		for j := range checks {
			charged[j] = -1 // not charged unless the store says so
		}
		err := store.Charge(ctx, checks, charged[:len(checks)])
		for j, c := range charged[:len(checks)] {
			if c == ChargeRefused {
				// Invalid: it would be refused forever. Drop it.
				st.Refused++
				r.refused.Add(1)
				continue
			}
			if err == nil || c >= 0 {
				st.Buckets++
				st.Units += checks[j].Cost
				st.Charged += max(c, 0)
				continue
			}
			r.restore(items[lo+j].k, items[lo+j].e)
		}
		if err != nil {
			for _, it := range items[hi:] {
				r.restore(it.k, it.e)
			}
			return st, err
		}
	}
	return st, nil
}

// restore puts back an entry that could not be charged, merging it with
// units recorded since.
func (r *Recorder) restore(k recKey, old *recEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entries[k]
	switch {
	case e == nil:
		if len(r.entries) >= r.max {
			var sum int64
			for _, c := range old.counts {
				sum += int64(c)
			}
			r.dropped.Add(sum)
			return
		}
		r.entries[k] = old
		r.pending.Store(int64(len(r.entries)))
	case e.rate.Window != old.rate.Window:
		// Recorded meanwhile under another window: add what still counts.
		e.addAt(e.last, old.estimate(r.clock.Now().UnixNano()))
	default:
		// Slot by slot; slots older than e's ring are more than a window
		// old and dropped.
		e.roll(old.last)
		n := int64(len(old.counts))
		for j := old.last - n + 1; j <= old.last; j++ {
			if c := old.counts[j%n]; c > 0 && j > e.last-n {
				e.addAt(j, int64(c))
			}
		}
	}
}
