// Package topk finds the heaviest keys of a stream in bounded memory
// (space-saving), and keeps the n heaviest as members with a value each:
// Tollgate's per-tenant metric series follow the busiest tenants with it.
package topk

import (
	"cmp"
	"slices"
	"strings"
	"sync"
)

// TopK finds the heaviest keys of a stream in O(capacity) memory with the
// space-saving algorithm (Metwally, Agrawal, El Abbadi 2005): it counts at
// most capacity keys, and a key it does not count replaces the one with
// the smallest count, inheriting that count as its possible
// overestimation. Any key with more than total/capacity occurrences is
// always counted.
//
// On top of that, up to n counted keys are members, each with a value V.
// A key is promoted as soon as a member place is free; every rebalance
// observations the members are recomputed as the n largest counts, with
// the sitting members' counts weighted up by a quarter so that near-ties
// do not swap members back and forth, and then every count is halved so
// that the ranking follows recent traffic. Members are never evicted
// between rebalances. release is called (under the lock) when a member
// stops being one; its value is then reset.
//
// It is safe for concurrent use.
type TopK[V any] struct {
	mu        sync.Mutex
	n         int
	capacity  int
	rebalance int
	release   func(key string, v *V)

	entries map[string]*topEntry[V]
	// heap is a min-heap on count of the counted keys that are not
	// members; only these can be evicted.
	heap    []*topEntry[V]
	members int
	seen    int // observations since the last rebalance
	scratch []*topEntry[V]
}

type topEntry[V any] struct {
	key    string
	count  uint64
	err    uint64 // count may exceed the true count by at most err
	pos    int    // index in heap; -1 for a member
	member bool
	val    V
}

// New returns a top-k with n member places counting at most capacity
// keys (at least n+1).
func New[V any](n, capacity int, release func(key string, v *V)) *TopK[V] {
	capacity = max(capacity, n+1)
	return &TopK[V]{
		n:         n,
		capacity:  capacity,
		rebalance: max(4*capacity, 1024),
		release:   release,
		entries:   make(map[string]*topEntry[V], capacity),
		heap:      make([]*topEntry[V], 0, capacity),
	}
}

// Observe counts one occurrence of key and calls visit, under the lock,
// with the key as stored and the member's value, or nil when key is not a
// member. visit must not keep v.
func (t *TopK[V]) Observe(key string, visit func(key string, v *V)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[key]
	if e == nil {
		e = t.insert(key)
	}
	e.count++
	if !e.member {
		if t.members < t.n {
			t.promote(e)
		} else {
			t.down(e.pos)
		}
	}
	if t.seen++; t.seen >= t.rebalance {
		t.rebalanceLocked()
	}
	if e.member {
		visit(e.key, &e.val)
	} else {
		visit(e.key, nil)
	}
}

// insert starts counting key, evicting the smallest non-member when full.
func (t *TopK[V]) insert(key string) *topEntry[V] {
	key = strings.Clone(key) // do not pin the request's memory
	if len(t.entries) < t.capacity {
		e := &topEntry[V]{key: key, pos: len(t.heap)}
		t.heap = append(t.heap, e)
		t.up(e.pos)
		t.entries[key] = e
		return e
	}
	e := t.heap[0]
	delete(t.entries, e.key)
	e.key, e.err = key, e.count
	t.entries[key] = e
	return e
}

func (t *TopK[V]) promote(e *topEntry[V]) {
	t.removeFromHeap(e.pos)
	e.pos, e.member = -1, true
	t.members++
}

func (t *TopK[V]) demote(e *topEntry[V]) {
	if t.release != nil {
		t.release(e.key, &e.val)
	}
	var zero V
	e.val, e.member = zero, false
	t.members--
	e.pos = len(t.heap)
	t.heap = append(t.heap, e)
	t.up(e.pos)
}

// rebalanceLocked makes the n largest (weighted) counts the members, then
// halves every count.
func (t *TopK[V]) rebalanceLocked() {
	t.seen = 0
	all := t.scratch[:0]
	for _, e := range t.entries {
		all = append(all, e)
	}
	slices.SortFunc(all, func(a, b *topEntry[V]) int {
		if c := cmp.Compare(b.score(), a.score()); c != 0 {
			return c
		}
		switch {
		case a.member && !b.member:
			return -1
		case b.member && !a.member:
			return 1
		}
		return strings.Compare(a.key, b.key)
	})
	keep := min(t.n, len(all))
	// Demote first so the member count never exceeds n.
	for _, e := range all[keep:] {
		if e.member {
			t.demote(e)
		}
	}
	for _, e := range all[:keep] {
		if !e.member && e.count > 0 {
			t.promote(e)
		}
	}
	for _, e := range all {
		e.count /= 2
		e.err /= 2
	}
	clear(all)
	t.scratch = all[:0]
}

// score ranks entries at a rebalance: sitting members are weighted up by a
// quarter.
func (e *topEntry[V]) score() uint64 {
	if e.member {
		return e.count + e.count/4
	}
	return e.count
}

// reset demotes every member, releasing its value.
func (t *TopK[V]) Reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range t.entries {
		if e.member {
			t.demote(e)
		}
	}
}

// top returns the members' keys, for tests.
func (t *TopK[V]) Top() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var keys []string
	for _, e := range t.entries {
		if e.member {
			keys = append(keys, e.key)
		}
	}
	slices.Sort(keys)
	return keys
}

// Min-heap on count.

func (t *TopK[V]) less(i, j int) bool { return t.heap[i].count < t.heap[j].count }

func (t *TopK[V]) swap(i, j int) {
	t.heap[i], t.heap[j] = t.heap[j], t.heap[i]
	t.heap[i].pos, t.heap[j].pos = i, j
}

func (t *TopK[V]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !t.less(i, p) {
			return
		}
		t.swap(i, p)
		i = p
	}
}

func (t *TopK[V]) down(i int) {
	n := len(t.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		c := l
		if r := l + 1; r < n && t.less(r, l) {
			c = r
		}
		if !t.less(c, i) {
			return
		}
		t.swap(i, c)
		i = c
	}
}

func (t *TopK[V]) removeFromHeap(i int) {
	last := len(t.heap) - 1
	if i != last {
		t.swap(i, last)
	}
	t.heap[last] = nil
	t.heap = t.heap[:last]
	if i != last {
		t.down(i)
		t.up(i)
	}
}

// WithLock runs f with the top-k's lock held, for state the caller guards
// with it (as Observe's visit does).
func (t *TopK[V]) WithLock(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f()
}
