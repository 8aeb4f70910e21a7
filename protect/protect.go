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
	"container/heap"
	"context"
	"errors"
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
