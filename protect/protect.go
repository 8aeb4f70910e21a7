// Package protect is an adaptive concurrency limit with fair queues: it
// keeps the requests in flight to an upstream near what the upstream can
// take right now, and when the limit is reached, queues the rest per
// tenant and serves them fairly, weighted by tier, shedding what waits
// too long. No Caddy, no I/O: package surface puts it in front of the
// rest of the handler chain.
//
// The limit follows the upstream's latency, per instance (the loop reacts
// within a few hundred milliseconds; a shared store would add a round
// trip to each decision and lag behind). Every update period it compares
// the period's average latency with a baseline, the lowest latency seen
// recently. Beyond tolerance × baseline it shrinks by the gradient:
//
//	gradient = max(tolerance × baseline / latency, 0.5)
//	limit    = limit × (1 - smoothing × (1 - gradient))
//
// Below it, while the limit is in use (in flight reached it, but for the
// reserve, during the period), it grows in steps of 10% (at least 1, at most
// √limit), each on the evidence of a cohort: the requests started in one
// period after the last step, judged once they have all answered (the
// fastest answer first, so the first answers say nothing of a new limit).
// The step tapers to nothing half way to tolerance × baseline, and the
// limit holds between there and the edge. An idle upstream earns no
// higher limit. The baseline follows a lower latency at once and a higher
// one slowly: 1% a second while the limit is not in use, 0.05% a second
// while it is, so an overload cannot teach it that the latency it causes
// is normal (the way Gradient2's long average grows without bound under
// moderate overload); and nothing ever lowers the limit to measure it
// (Envoy's periodic minRTT window and its 503s). Once failures are a
// fifth of the recent answers, each failure cuts the limit at once to
// 0.9 × what is still in flight, and the limit does not grow for a
// second after. The limit stays within [Min, Max].
//
// Fairness: a request that finds the limit reached waits in its tenant's
// queue. When a slot frees, the next request is the one with the
// smallest virtual finish time (weighted fair queuing): each request of a
// tenant of weight w advances that tenant's virtual time by 1/w, starting
// from the queue's virtual time when the tenant was idle. A tenant alone
// gets every free slot; a flooding tenant gets its weight's share while
// others wait. A tenant below its fair share (the limit split by weight
// among the tenants with requests in flight or queued) may take any free
// slot at once; one at or above it leaves a slot free per other active
// tenant (at least one, at most a tenth of the limit). Within a tenant, critical requests go first and sheddable ones
// last.
//
// Shedding, CoDel style, per tenant: when a request leaves its tenant's
// queue after waiting longer than TargetWait, and that tenant's waits
// have been above the target for a whole Interval, it is shed instead of
// served (and so are the next ones above the target, until a wait is
// below it): a queue that drains in time is never shed, however long,
// and a tenant whose requests all fit its fair share is never shed for
// waiting. A request also gives up after MaxWait, and a tenant's queue
// holds at most QueueLimit requests. Sheddable requests count as waiting
// twice as long, critical ones half.
package protect

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"time"
)

// Priority is a request's criticality.
type Priority uint8

// Priorities, most shed first.
const (
	Sheddable Priority = iota
	Normal
	Critical
	numPriorities
)

// ParsePriority reads a priority placeholder's value: "critical",
// "sheddable" (or "low"), anything else normal.
func ParsePriority(s string) Priority {
	switch s {
	case "critical", "high":
		return Critical
	case "sheddable", "low":
		return Sheddable
	}
	return Normal
}

// failWeight is the weight of each answer in the failure rate (about the
// last 10 answers), and overloadFailRate the rate at which failures cut
// the limit: three failures in a row, or one answer in five for a while.
const (
	failWeight       = 0.1
	overloadFailRate = 0.2
)

// Reasons a request is shed.
const (
	ReasonWait      = "wait"       // waited longer than the target while waits kept growing
	ReasonTimeout   = "timeout"    // waited MaxWait
	ReasonQueueFull = "queue_full" // its tenant's queue was full
)

// ShedError is a request shed, and why.
type ShedError struct{ Reason string }

func (e *ShedError) Error() string { return "protect: request shed (" + e.Reason + ")" }

// ErrClosed is a request to a closed limiter.
var ErrClosed = errors.New("protect: closed")

// Options configure a Limiter.
type Options struct {
	// Min, Max and Initial bound and start the limit (defaults 1, 1000,
	// 20).
	Min, Max, Initial int
	// Tolerance is how much slower than the baseline the upstream may be
	// before the limit shrinks (default 1.1).
	Tolerance float64
	// Smoothing is how much of the gradient's decrease each update
	// takes (0 to 1, default 0.2).
	Smoothing float64
	// UpdateEvery is the update period (default 100ms).
	UpdateEvery time.Duration
	// TargetWait and Interval are CoDel's (defaults 20ms, 100ms).
	TargetWait, Interval time.Duration
	// MaxWait bounds any wait (default 10 × TargetWait + Interval).
	MaxWait time.Duration
	// QueueLimit bounds each tenant's queue (default 4 × Max).
	QueueLimit int
	// Weight is a tier's weight (default 1 for unknown tiers).
	Weight func(tier string) int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (o *Options) defaults() {
	if o.Min <= 0 {
		o.Min = 1
	}
	if o.Max <= 0 {
		o.Max = 1000
	}
	if o.Initial <= 0 {
		o.Initial = 20
	}
	o.Initial = min(max(o.Initial, o.Min), o.Max)
	if o.Tolerance < 1 {
		o.Tolerance = 1.1
	}
	if o.Smoothing <= 0 || o.Smoothing > 1 {
		o.Smoothing = 0.2
	}
	if o.UpdateEvery <= 0 {
		o.UpdateEvery = 100 * time.Millisecond
	}
	if o.TargetWait <= 0 {
		o.TargetWait = 20 * time.Millisecond
	}
	if o.Interval <= 0 {
		o.Interval = 100 * time.Millisecond
	}
	if o.MaxWait <= 0 {
		o.MaxWait = 10*o.TargetWait + o.Interval
	}
	if o.QueueLimit <= 0 {
		o.QueueLimit = 4 * o.Max
	}
	if o.Weight == nil {
		o.Weight = func(string) int { return 1 }
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Limiter is one upstream's adaptive limit and queues. Safe for
// concurrent use.
type Limiter struct {
	o Options

	mu       sync.Mutex
	limit    float64
	inflight int
	// The latency samples of the current period, the baseline, and when
	// the period started.
	sum        time.Duration
	samples    int
	peak       int // most in flight during the period
	failed     bool
	baseline   time.Duration
	periodFrom time.Time
	// failRate is the share of failures among the recent answers (an
	// average weighted by failWeight); cutAt is when a failure last cut
	// the limit.
	failRate float64
	cutAt    time.Time
	// The cohort: the requests started in [cohortFrom, cohortUntil),
	// how many, how many have answered and their latencies' sum. The
	// limit grows only on a whole cohort's evidence (see updateLocked).
	cohortFrom, cohortUntil time.Time
	cohort                  uint64 // numbers the cohorts, from 1
	cohortStarted           int
	cohortDone              int
	cohortSum               time.Duration
	// Tenants with requests in flight or queued, the sum of their
	// weights, and those with queued requests by their head's finish.
	tenants map[string]*tenantQueue
	weights float64
	// spare are forgotten tenant states kept for reuse: a tenant's state
	// lives while it has requests in flight, so most requests would
	// otherwise make one.
	spare  []*tenantQueue
	ready  tenantHeap
	vtime  float64
	queued int
	closed bool
}

// New returns a Limiter.
func New(o Options) *Limiter {
	o.defaults()
	l := &Limiter{o: o, limit: float64(o.Initial), tenants: map[string]*tenantQueue{}, periodFrom: o.Now()}
	l.newCohortLocked(l.periodFrom)
	return l
}

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

// Slot is a request's place in flight; Release it when the upstream has
// answered.
type Slot struct {
	l      *Limiter
	tenant *tenantQueue
	start  time.Time
	cohort uint64 // the limit's cohort it started in, or 0
}

// Acquire returns a slot for a request of tenant (in tier, of priority
// prio) at once when the limit allows, else waits in the tenant's queue
// until a slot is its turn, the request is shed (*ShedError), or ctx
// ends. With shadow set it never waits: the second result reports that
// the request would have had to queue.
func (l *Limiter) Acquire(ctx context.Context, tenant, tier string, prio Priority, shadow bool) (*Slot, bool, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, false, ErrClosed
	}
	now := l.o.Now()
	q := l.tenants[tenant]
	if q == nil {
		q = l.newTenantLocked(tenant, tier)
	}
	if q.n == 0 && l.mayTakeLocked(q, l.queued == 0) {
		return l.takeLocked(q, now), false, nil
	}
	if shadow {
		return l.takeLocked(q, now), true, nil
	}
	if q.n >= l.o.QueueLimit {
		l.mu.Unlock()
		return nil, false, &ShedError{ReasonQueueFull}
	}
	start := max(q.vtime, l.vtime)
	w := &waiter{tenant: q, prio: prio, finish: start + 1/q.weight, enqueued: now, done: make(chan error, 1)}
	q.vtime = w.finish
	q.fifo[prio] = append(q.fifo[prio], w)
	q.n++
	l.queued++
	if q.index < 0 {
		heap.Push(&l.ready, q)
	} else {
		heap.Fix(&l.ready, q.index)
	}
	l.dispatchLocked(now)
	l.mu.Unlock()

	t := time.NewTimer(l.o.MaxWait)
	defer t.Stop()
	select {
	case err := <-w.done:
		if err != nil {
			return nil, false, err
		}
		return &Slot{l: l, tenant: w.tenant, start: l.o.Now(), cohort: w.cohort}, false, nil
	case <-t.C:
		return nil, false, l.abandon(w, &ShedError{ReasonTimeout})
	case <-ctx.Done():
		return nil, false, l.abandon(w, ctx.Err())
	}
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

// Release gives the slot back. latency is how long the upstream took;
// failed says it failed the way an overloaded upstream does (the caller
// decides: package surface counts 429, 502, 503 and 504).
func (s *Slot) Release(latency time.Duration, failed bool) {
	s.release(latency, failed, true)
}

func (s *Slot) release(latency time.Duration, failed, sample bool) {
	l := s.l
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight--
	s.tenant.inflight--
	l.forgetLocked(s.tenant)
	if s.cohort == l.cohort && (!sample || failed) {
		l.cohortStarted-- // no latency to tell
	}
	now := l.o.Now()
	switch {
	case sample && failed:
		// A failure says nothing of the latency (an overloaded upstream
		// refuses fast). Once failures are a fifth of the recent answers
		// (an overload, not a broken endpoint's trickle), each cuts the
		// limit below what is in flight now, at once: an overloaded
		// upstream refuses the next requests in microseconds. Cutting
		// to a fraction of what is in flight, not of the limit, makes a
		// burst of failures one cut, not a collapse: the next failure
		// cuts again only once fewer requests are in flight.
		l.failRate += failWeight * (1 - l.failRate)
		if l.failRate >= overloadFailRate {
			l.failed = true
			l.cutAt = now
			l.limit = max(min(l.limit, 0.9*float64(l.inflight)), float64(l.o.Min))
		}
	case sample:
		l.failRate -= failWeight * l.failRate
		l.sum += latency
		l.samples++
		if s.cohort == l.cohort {
			l.cohortDone++
			l.cohortSum += latency
		}
	}
	if now.Sub(l.periodFrom) >= l.o.UpdateEvery {
		l.updateLocked(now)
	}
	l.dispatchLocked(now)
}

// updateLocked ends the period: the baseline and the limit.
func (l *Limiter) updateLocked(now time.Time) {
	defer func() {
		l.sum, l.samples, l.failed, l.peak, l.periodFrom = 0, 0, false, l.inflight, now
	}()
	if l.samples == 0 {
		return
	}
	avg := l.sum / time.Duration(l.samples)
	switch {
	case l.baseline == 0 || avg < l.baseline:
		l.baseline = avg
	default:
		// Up by 1% a second while the limit is not in use (the latency
		// is the upstream's own, not the load's), by 0.05% a second
		// while it is: a lasting change of the upstream is learnt in a
		// minute when traffic allows, a few minutes under overload; an
		// overload cannot teach it that its own latency is normal.
		rate := 0.0005
		if float64(l.peak) < 0.5*l.limit {
			rate = 0.01
		}
		step := time.Duration(float64(l.baseline) * rate * now.Sub(l.periodFrom).Seconds())
		l.baseline += max(step, 1)
	}
	if l.failed {
		return // cut already; no growth in a period with failures
	}
	// Beyond tolerance × baseline the limit shrinks by the gradient.
	edge := l.o.Tolerance * float64(l.baseline)
	if g := edge / float64(avg); g < 1 {
		l.limit *= 1 - l.o.Smoothing*(1-max(g, 0.5))
	} else if cohort, ok := l.cohortLatencyLocked(now); ok {
		// Below it, while the limit is in use (in flight reached it,
		// but for the reserve, during the period), it grows in steps of 10%
		// (at least 1, at most √limit), each on the evidence of a whole
		// cohort: the requests started in one period, judged once they
		// have all answered. Latency tells of a new limit one upstream
		// latency late, and its fastest requests answer first: steps
		// taken on the first answers overshoot. The step tapers to
		// nothing half way to the edge, and the limit holds between
		// there and the edge. Nor does it grow for a second after a
		// failure cut it.
		mid := (edge + float64(l.baseline)) / 2
		headroom := 0.0 // tolerance 1: no band, grow only at the baseline
		if span := mid - float64(l.baseline); span > 0 {
			headroom = (mid - cohort) / span
		} else if cohort <= mid {
			headroom = 1
		}
		if headroom > 0 && l.peak >= int(l.limit)-l.reserveLocked() && now.Sub(l.cutAt) >= max(time.Second, 2*l.baseline) {
			l.limit += min(headroom, 1) * max(1, min(math.Sqrt(l.limit), l.limit/10))
		}
		l.newCohortLocked(now)
	}
	l.limit = min(max(l.limit, float64(l.o.Min)), float64(l.o.Max))
}

// cohortLatencyLocked is the average latency of the cohort, once its
// requests have all answered (or twice the edge latency has passed since
// it ended: those still in flight count with their age so far). A cohort
// without requests starts again.
func (l *Limiter) cohortLatencyLocked(now time.Time) (float64, bool) {
	if now.Before(l.cohortUntil) {
		return 0, false
	}
	if l.cohortStarted == 0 {
		l.newCohortLocked(now)
		return 0, false
	}
	waiting := l.cohortStarted - l.cohortDone
	age := now.Sub(l.cohortUntil)
	if waiting > 0 && float64(age) < 2*l.o.Tolerance*float64(l.baseline) {
		return 0, false
	}
	return (float64(l.cohortSum) + float64(waiting)*float64(age)) / float64(l.cohortStarted), true
}

// newCohortLocked starts a cohort of the requests started in the next
// period.
func (l *Limiter) newCohortLocked(now time.Time) {
	l.cohort++
	l.cohortFrom, l.cohortUntil, l.cohortStarted, l.cohortDone, l.cohortSum = now, now.Add(l.o.UpdateEvery), 0, 0, 0
}

// startedLocked counts a request started now in the cohort when it
// belongs to it, and returns the cohort's number (else 0).
func (l *Limiter) startedLocked(now time.Time) uint64 {
	if now.Before(l.cohortFrom) || !now.Before(l.cohortUntil) {
		return 0
	}
	l.cohortStarted++
	return l.cohort
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

// Stats is a Limiter's state.
type Stats struct {
	Limit    int
	InFlight int
	Queued   int
	// Tenants is the number of tenants with queued requests.
	Tenants  int
	Baseline time.Duration
}

// Stats returns the limiter's state now.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Stats{Limit: int(l.limit), InFlight: l.inflight, Queued: l.queued, Tenants: len(l.ready), Baseline: l.baseline}
}

// TenantQueue is one tenant's waiting requests.
type TenantQueue struct {
	Tenant string
	Queued int
	Weight float64
}

// Queues returns up to n tenants with waiting requests, most waiting
// first.
func (l *Limiter) Queues(n int) []TenantQueue {
	l.mu.Lock()
	out := make([]TenantQueue, 0, len(l.ready))
	for _, q := range l.ready {
		out = append(out, TenantQueue{Tenant: q.name, Queued: q.n, Weight: q.weight})
	}
	l.mu.Unlock()
	slices.SortFunc(out, func(a, b TenantQueue) int {
		return cmp.Or(cmp.Compare(b.Queued, a.Queued), cmp.Compare(a.Tenant, b.Tenant))
	})
	return out[:min(n, len(out))]
}

// Close sheds every queued request; later Acquires fail.
func (l *Limiter) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	for len(l.ready) > 0 {
		q := heap.Pop(&l.ready).(*tenantQueue)
		for w := q.pop(); w != nil; w = q.pop() {
			w.done <- ErrClosed
			l.queued--
		}
	}
	clear(l.tenants)
	l.weights = 0
}
