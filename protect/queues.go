package protect

import (
	"container/heap"
	"math"
	"slices"
	"time"
)

// waiter is a queued request.
type waiter struct {
	tenant   *tenantQueue
	prio     Priority
	finish   float64
	enqueued time.Time
	cohort   uint64 // set with a slot: the cohort it started in
	// done gets the outcome: nil (a slot), or a *ShedError.
	done chan error
}

// tenantQueue is an active tenant: its requests in flight, and those
// waiting, a FIFO per priority.
type tenantQueue struct {
	name     string
	weight   float64
	vtime    float64 // the finish of its last request
	inflight int
	fifo     [numPriorities][]*waiter
	n        int
	index    int // in the ready heap, -1 when not in it
	// CoDel, per tenant: since when this tenant's waits have been above
	// the target (zero: they are not), and whether it is shedding. A
	// flooding tenant's queue sheds; a light tenant's, served in its
	// turn, does not.
	aboveSince time.Time
	dropping   bool
}

func (q *tenantQueue) head() *waiter {
	for p := Critical; ; p-- {
		if len(q.fifo[p]) > 0 {
			return q.fifo[p][0]
		}
		if p == Sheddable {
			return nil
		}
	}
}

func (q *tenantQueue) pop() *waiter {
	for p := Critical; ; p-- {
		if len(q.fifo[p]) > 0 {
			w := q.fifo[p][0]
			q.fifo[p][0] = nil
			q.fifo[p] = q.fifo[p][1:]
			q.n--
			return w
		}
		if p == Sheddable {
			return nil
		}
	}
}

// tenantHeap orders tenants by their head request's finish.
type tenantHeap []*tenantQueue

func (h tenantHeap) Len() int { return len(h) }

func (h tenantHeap) Less(i, j int) bool {
	return h[i].head().finish < h[j].head().finish
}

func (h tenantHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}

func (h *tenantHeap) Push(x any) {
	q := x.(*tenantQueue)
	q.index = len(*h)
	*h = append(*h, q)
}

func (h *tenantHeap) Pop() any {
	old := *h
	q := old[len(old)-1]
	old[len(old)-1] = nil
	q.index = -1
	*h = old[:len(old)-1]
	return q
}

// mayTakeLocked says whether a request of q may take a slot now, ahead
// of any queue when ahead is set. Below the limit, a tenant below its
// fair share (the limit split by weight among the active tenants) may
// take any free slot; a tenant at or above it leaves one free slot per
// other active tenant, at least one and at most a tenth of the limit.
// Without that reserve a flooding tenant refills every slot the moment
// it frees, and the others wait for the next one: with an upstream whose
// answers come in waves, up to a whole upstream latency. It is small
// because the limit follows the latency of what is in flight, so it
// settles higher by the reserve's unused slots, and the light tenants'
// bursts into the reserve then take the upstream that much further.
func (l *Limiter) mayTakeLocked(q *tenantQueue, ahead bool) bool {
	free := int(l.limit) - l.inflight
	switch {
	case free <= 0:
		return false
	case l.belowShareLocked(q):
		return true
	}
	return ahead && free > l.reserveLocked()
}

// reserveLocked is how many slots a tenant at or above its share leaves
// free.
func (l *Limiter) reserveLocked() int {
	return min(len(l.tenants)-1, max(1, int(l.limit)/10))
}

// belowShareLocked says whether q has fewer requests in flight than its
// fair share: the limit split among the active tenants by weight.
func (l *Limiter) belowShareLocked(q *tenantQueue) bool {
	return float64(q.inflight)*l.weights < l.limit*q.weight
}

// fitsShareLocked says whether all of q's requests, in flight, queued
// and the one leaving the queue, fit its fair share rounded up: such a
// tenant waits because of others, and CoDel does not shed it (MaxWait
// still bounds its wait).
func (l *Limiter) fitsShareLocked(q *tenantQueue) bool {
	return float64(q.inflight+q.n+1) <= math.Ceil(l.limit*q.weight/l.weights)
}

// takeLocked counts a request of q in flight and unlocks.
func (l *Limiter) takeLocked(q *tenantQueue, now time.Time) *Slot {
	l.inflight++
	q.inflight++
	l.peak = max(l.peak, l.inflight)
	cohort := l.startedLocked(now)
	l.mu.Unlock()
	return &Slot{l: l, tenant: q, start: now, cohort: cohort}
}

// abandon takes w out of its queue (it timed out or its client left);
// when a slot was handed to it meanwhile, the slot is given back.
func (l *Limiter) abandon(w *waiter, why error) error {
	l.mu.Lock()
	q := w.tenant
	for p := range q.fifo {
		for i, x := range q.fifo[p] {
			if x == w {
				q.fifo[p] = slices.Delete(q.fifo[p], i, i+1) // zeroes the vacated end
				q.n--
				l.queued--
				l.fixLocked(q)
				// Its tenant may be gone: the shares and the reserve
				// changed, and a waiting request may take a slot now.
				l.dispatchLocked(l.o.Now())
				l.mu.Unlock()
				return why
			}
		}
	}
	l.mu.Unlock()
	// Already dequeued: a slot or a shed is in done.
	if err := <-w.done; err != nil {
		return err
	}
	(&Slot{l: l, tenant: q, start: l.o.Now(), cohort: w.cohort}).release(0, false, false)
	return why
}

// fixLocked puts q back in order, or out of the heap when it has nothing
// queued, and forgets it when it has nothing in flight either.
func (l *Limiter) fixLocked(q *tenantQueue) {
	switch {
	case q.n > 0:
		heap.Fix(&l.ready, q.index)
		return
	case q.index >= 0:
		heap.Remove(&l.ready, q.index)
	}
	l.forgetLocked(q)
}

// newTenantLocked makes tenant's state, active from now.
func (l *Limiter) newTenantLocked(tenant, tier string) *tenantQueue {
	var q *tenantQueue
	if n := len(l.spare); n > 0 {
		q, l.spare = l.spare[n-1], l.spare[:n-1]
	} else {
		q = &tenantQueue{}
	}
	q.name, q.weight, q.vtime, q.index = tenant, float64(max(l.o.Weight(tier), 1)), l.vtime, -1
	l.tenants[tenant] = q
	l.weights += q.weight
	return q
}

// forgetLocked drops q when it has nothing queued or in flight.
func (l *Limiter) forgetLocked(q *tenantQueue) {
	if q.n != 0 || q.inflight != 0 || l.tenants[q.name] != q {
		return
	}
	delete(l.tenants, q.name)
	l.weights -= q.weight
	if len(l.spare) < 64 {
		fifo := q.fifo
		for p := range fifo {
			fifo[p] = fifo[p][:0]
		}
		*q = tenantQueue{fifo: fifo}
		l.spare = append(l.spare, q)
	}
}

// dispatchLocked hands free slots to queued requests, fairest first,
// shedding those CoDel drops.
func (l *Limiter) dispatchLocked(now time.Time) {
	for l.queued > 0 {
		q := l.ready[0]
		if !l.mayTakeLocked(q, true) {
			// The head is held back by the reserve (or no slot is
			// free): the reserve is for the tenants below their share,
			// who may be further down.
			if q = l.belowShareQueuedLocked(); q == nil {
				return
			}
		}
		w := q.pop()
		l.queued--
		if q.n == 0 {
			heap.Remove(&l.ready, q.index)
		} else {
			heap.Fix(&l.ready, q.index)
		}
		l.vtime = max(l.vtime, w.finish-1/q.weight)
		if l.fitsShareLocked(q) {
			// It waits because of others: not a standing queue of its
			// own, and no CoDel state to carry over.
			q.aboveSince, q.dropping = time.Time{}, false
		} else if q.shed(w, now, l.o.TargetWait, l.o.Interval) {
			l.forgetLocked(q)
			w.done <- &ShedError{ReasonWait}
			continue
		}
		l.inflight++
		q.inflight++
		l.peak = max(l.peak, l.inflight)
		w.cohort = l.startedLocked(now)
		w.done <- nil
	}
}

// belowShareQueuedLocked is the queued tenant below its share whose head
// finishes first, when a slot is free, else nil. It walks every queued
// tenant, and runs only when the fairest one is held back by the reserve
// while a slot is free.
func (l *Limiter) belowShareQueuedLocked() *tenantQueue {
	if int(l.limit)-l.inflight <= 0 {
		return nil
	}
	var best *tenantQueue
	for _, q := range l.ready {
		if l.belowShareLocked(q) && (best == nil || q.head().finish < best.head().finish) {
			best = q
		}
	}
	return best
}

// shed is CoDel's decision for w, leaving q now.
func (q *tenantQueue) shed(w *waiter, now time.Time, target, interval time.Duration) bool {
	wait := now.Sub(w.enqueued)
	switch w.prio {
	case Sheddable:
		wait *= 2
	case Critical:
		wait /= 2
	}
	if wait < target {
		q.aboveSince, q.dropping = time.Time{}, false
		return false
	}
	if q.aboveSince.IsZero() {
		q.aboveSince = now
		return false
	}
	if !q.dropping && now.Sub(q.aboveSince) < interval {
		return false
	}
	q.dropping = true
	return true
}
