package limiter

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Penalty boxes. A policy with a Penalty puts a bucket (a tenant, with its
// partition key) that its store denied After times within one window of
// its limit in a penalty box for Duration: every request of that bucket is
// then refused by Decide itself, from an in-process table, without asking
// the store (Verdict.Path PathPenalty). Where the denials are counted and
// how the whole fleet learns of a box is the Penalties implementation's
// business: LocalPenalties counts in process (the embedded store), the
// fleet package counts in Redis and shares the boxes.

// Penalty is a policy's penalty box.
type Penalty struct {
	// Duration is how long a boxed bucket is refused; 0 means the policy
	// has no penalty box.
	Duration time.Duration
	// After is the number of denials within one window of the limit that
	// puts a bucket in the box (at least 1).
	After int64
}

// MaxPenalty bounds Penalty.Duration.
const MaxPenalty = 366 * 24 * time.Hour

// On reports whether p boxes anything.
func (p Penalty) On() bool { return p.Duration > 0 }

// Validate reports what is wrong with p, naming the field.
func (p Penalty) Validate() error {
	if !p.On() {
		return nil
	}
	if p.Duration < time.Millisecond || p.Duration > MaxPenalty {
		return fmt.Errorf("penalty: duration %s: use 1ms to %s", p.Duration, MaxPenalty)
	}
	if p.After < 1 || p.After > MaxCount {
		return fmt.Errorf("penalty: after %d: use 1 to %d denials", p.After, MaxCount)
	}
	return nil
}

// PenaltyKey names a bucket that can be boxed: a policy (its engine name),
// a tenant and a partition key, bounded (see NewPenaltyKey).
type PenaltyKey struct {
	Policy, Tenant, Part string
}

// NewPenaltyKey is the key of the bucket of tenant and part in policy,
// its values bounded (BoundedValue): a hostile header cannot grow a
// penalty table, an index or a message.
func NewPenaltyKey(policy, tenant, part string) PenaltyKey {
	return PenaltyKey{policy, BoundedValue(tenant), BoundedValue(part)}
}

// BoundedValue is v as penalty keys hold it: v itself, or the digest
// "%#" + hex(SHA-256(v)) when v is longer than MaxValueLen bytes or
// starts with "%#" (so no value can pass for another's digest).
func BoundedValue(v string) string {
	if len(v) <= MaxValueLen && !strings.HasPrefix(v, hashedMarker) {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	return hashedMarker + hex.EncodeToString(sum[:])
}

// clone copies k's strings, so a key kept in a table does not keep a
// request's memory alive.
func (k PenaltyKey) clone() PenaltyKey {
	return PenaltyKey{strings.Clone(k.Policy), strings.Clone(k.Tenant), strings.Clone(k.Part)}
}

// PenaltyEntry is one boxed bucket.
type PenaltyEntry struct {
	PenaltyKey
	// Until is when the box ends (Unix ns).
	Until int64
}

// Penalties is where Decide looks for boxed buckets and reports denials.
// Both run on the request path: Boxed must be an in-process lookup, and
// Denied must not wait for I/O.
type Penalties interface {
	// Boxed reports whether the bucket k is boxed, and for how long
	// still.
	Boxed(k PenaltyKey) (left time.Duration, ok bool)
	// Denied notes that the store denied the bucket k of a policy with
	// penalty p, under limit l (denials are counted within its window).
	// k's strings belong to the request: copy them to keep them.
	Denied(k PenaltyKey, p Penalty, l Limit)
}

// Box is a penalty box as the Penalties that made it tells of it.
type Box struct {
	PenaltyEntry
	// Limit is the bucket's limit at the denial that boxed it: its Shadow
	// says the box refuses nothing.
	Limit Limit
}

// BoxWatcher is a Penalties that tells of the boxes it makes, so a
// handler can announce a box when it starts (its penalty webhook), not at
// a later request the box refuses, which may never come.
type BoxWatcher interface {
	// WatchBoxes adds f to the functions told of each box made, and
	// returns the function that removes it.
	WatchBoxes(f func(Box) bool) (stop func())
}

// BoxWatchers are the functions told of the boxes a Penalties makes: each
// box once, by the Penalties that made it (never by those that learn of
// it from others), so one box is one call fleet-wide. The newest function
// is told first, and the first that takes the box (returns true) is the
// last told: the handler that replaced another in a config reload, or
// the one of several sharing a store that has the box's policy. The zero
// value is ready; safe for concurrent use.
type BoxWatchers struct {
	mu   sync.Mutex
	list []*func(Box) bool
}

var _ BoxWatcher = (*BoxWatchers)(nil)

// WatchBoxes implements BoxWatcher. f runs on the goroutine that made the
// box (a request's or a writer's), under a lock: it must not block.
func (w *BoxWatchers) WatchBoxes(f func(Box) bool) (stop func()) {
	p := &f
	w.mu.Lock()
	w.list = append(w.list, p)
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if i := slices.Index(w.list, p); i >= 0 {
			w.list = slices.Delete(w.list, i, i+1)
		}
	}
}

// Made tells the watchers of b, a box just made.
func (w *BoxWatchers) Made(b Box) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(w.list) - 1; i >= 0; i-- {
		if (*w.list[i])(b) {
			return
		}
	}
}

// DefaultPenaltyTableSize bounds a PenaltyTable: boxes and counts each.
const DefaultPenaltyTableSize = 1 << 16

// PenaltyTable is an in-process, bounded table of boxed buckets, and of
// the denials of buckets not boxed yet when it counts them itself. Safe
// for concurrent use. Its memory is bounded whatever the clients send:
// when full, a new box evicts the one that ends first, and a new count
// evicts an arbitrary count.
type PenaltyTable struct {
	// boxed is len(boxes): 0 spares every request of a penalty policy
	// the lock while nobody is boxed.
	boxed  atomic.Int64
	mu     sync.RWMutex
	boxes  map[PenaltyKey]int64
	counts map[PenaltyKey]denialCount
	max    int
}

// denialCount counts a bucket's denials in the window that ends at end
// (Unix ns).
type denialCount struct{ n, end int64 }

// NewPenaltyTable returns a table holding at most max boxes and max
// counts (0: DefaultPenaltyTableSize).
func NewPenaltyTable(max int) *PenaltyTable {
	if max <= 0 {
		max = DefaultPenaltyTableSize
	}
	return &PenaltyTable{boxes: map[PenaltyKey]int64{}, counts: map[PenaltyKey]denialCount{}, max: max}
}

// Len is the number of boxes held (ended ones included until dropped).
func (t *PenaltyTable) Len() int64 { return t.boxed.Load() }

// BoxedAt reports until when (Unix ns) k is boxed, if it is at now (Unix
// ns).
func (t *PenaltyTable) BoxedAt(k PenaltyKey, now int64) (int64, bool) {
	if t.boxed.Load() == 0 {
		return 0, false
	}
	t.mu.RLock()
	until, ok := t.boxes[k]
	t.mu.RUnlock()
	return until, ok && until > now
}

// Box boxes k until (Unix ns), or extends its box to until. It reports
// whether k was not boxed at now before.
func (t *PenaltyTable) Box(k PenaltyKey, until, now int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, had := t.boxes[k]
	if had {
		t.boxes[k] = max(old, until)
		return old <= now
	}
	if len(t.boxes) >= t.max {
		t.evictBox(now)
	}
	t.boxes[k.clone()] = until
	delete(t.counts, k)
	t.boxed.Store(int64(len(t.boxes)))
	return true
}

// evictBox makes room for one box: it drops the boxes that have ended,
// or else the one that ends first. With t.mu held.
func (t *PenaltyTable) evictBox(now int64) {
	var first PenaltyKey
	firstUntil := int64(-1)
	for k, until := range t.boxes {
		if until <= now {
			delete(t.boxes, k)
			continue
		}
		if firstUntil < 0 || until < firstUntil {
			first, firstUntil = k, until
		}
	}
	if len(t.boxes) >= t.max && firstUntil >= 0 {
		delete(t.boxes, first)
	}
}

// Count counts one more denial of k, within window, at now (Unix ns), and
// boxes k for p.Duration when it is the p.After-th within its window. It
// returns the end of the box when it boxed k, and whether that made a
// new box (k was not boxed already).
func (t *PenaltyTable) Count(k PenaltyKey, p Penalty, window time.Duration, now int64) (until int64, boxed bool) {
	t.mu.Lock()
	c, had := t.counts[k]
	if !had || c.end <= now {
		if !had && len(t.counts) >= t.max {
			t.evictCount(now)
		}
		if !had {
			k = k.clone()
		}
		c = denialCount{end: now + int64(max(window, time.Millisecond))}
	}
	c.n++
	if c.n < p.After {
		t.counts[k] = c
		t.mu.Unlock()
		return 0, false
	}
	delete(t.counts, k)
	t.mu.Unlock()
	until = now + int64(p.Duration)
	return until, t.Box(k, until, now)
}

// evictCount makes room for one count: it drops the counts whose window
// ended, or else an arbitrary one. With t.mu held.
func (t *PenaltyTable) evictCount(now int64) {
	for k, c := range t.counts {
		if c.end <= now {
			delete(t.counts, k)
		}
	}
	for k := range t.counts {
		if len(t.counts) < t.max {
			return
		}
		delete(t.counts, k)
	}
}

// Lift takes out of the table the boxes (and counts) of tenant, of policy
// only when it is not empty, and returns the boxes lifted that had not
// ended at now.
func (t *PenaltyTable) Lift(tenant, policy string, now int64) []PenaltyEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []PenaltyEntry
	for k, until := range t.boxes {
		if k.Tenant == tenant && (policy == "" || k.Policy == policy) {
			delete(t.boxes, k)
			if until > now {
				out = append(out, PenaltyEntry{k, until})
			}
		}
	}
	for k := range t.counts {
		if k.Tenant == tenant && (policy == "" || k.Policy == policy) {
			delete(t.counts, k)
		}
	}
	t.boxed.Store(int64(len(t.boxes)))
	SortPenalties(out)
	return out
}

// Unbox takes k's box out of the table.
func (t *PenaltyTable) Unbox(k PenaltyKey) {
	t.mu.Lock()
	delete(t.boxes, k)
	t.boxed.Store(int64(len(t.boxes)))
	t.mu.Unlock()
}

// List returns the boxes of tenant and policy (each: any, when empty) not
// ended at now, the ones that end first first, at most n; ended boxes
// are dropped.
func (t *PenaltyTable) List(tenant, policy string, now int64, n int) []PenaltyEntry {
	t.mu.Lock()
	var out []PenaltyEntry
	for k, until := range t.boxes {
		if until <= now {
			delete(t.boxes, k)
			continue
		}
		if (tenant == "" || k.Tenant == tenant) && (policy == "" || k.Policy == policy) {
			out = append(out, PenaltyEntry{k, until})
		}
	}
	t.boxed.Store(int64(len(t.boxes)))
	t.mu.Unlock()
	SortPenalties(out)
	return out[:min(n, len(out))]
}

// SortPenalties sorts boxes by end, then by policy, tenant and part.
func SortPenalties(es []PenaltyEntry) {
	slices.SortFunc(es, func(a, b PenaltyEntry) int {
		return cmp.Or(cmp.Compare(a.Until, b.Until), cmp.Compare(a.Policy, b.Policy),
			cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Part, b.Part))
	})
}

// LocalPenalties is Penalties for one process: the table counts the
// denials and holds the boxes; its watchers hear of each box it makes.
type LocalPenalties struct {
	*PenaltyTable
	BoxWatchers
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

var (
	_ Penalties  = (*LocalPenalties)(nil)
	_ BoxWatcher = (*LocalPenalties)(nil)
)

func (l *LocalPenalties) now() int64 {
	if l.Now != nil {
		return l.Now().UnixNano()
	}
	return time.Now().UnixNano()
}

// Boxed implements Penalties.
func (l *LocalPenalties) Boxed(k PenaltyKey) (time.Duration, bool) {
	if l.Len() == 0 {
		return 0, false // no clock read while nobody is boxed
	}
	now := l.now()
	until, ok := l.BoxedAt(k, now)
	return time.Duration(until - now), ok
}

// Denied implements Penalties: counted in the table; a box it makes is
// told to the watchers.
func (l *LocalPenalties) Denied(k PenaltyKey, p Penalty, lim Limit) {
	if until, boxed := l.Count(k, p, lim.Window, l.now()); boxed {
		l.Made(Box{PenaltyEntry{k.clone(), until}, lim})
	}
}
