package limiter

import (
	"context"
	"errors"
)

// Giving back units at the instant they were charged. A token bucket's or
// GCRA's units mean the same whenever they were charged (refundUnits); a
// window's or log's belong to the window or log entry of their instant,
// so they go back there, and not at all once that window has left the
// bucket (they no longer count). Mirrors each algorithm's refund in
// package lua.

// refundAt returns s with cost units charged at the instant at (Unix ns)
// given back, for every algorithm but sliding_log (whose units live in
// its log: logRing.remove) and concurrency (whose slots are released).
func refundAt(a Algorithm, s bucketState, r Rate, cost, at int64) bucketState {
	switch a {
	case TokenBucket, GCRA:
		return refundUnits(a, s, r, cost)
	case FixedWindow:
		if start, _ := fixedWindowAt(at, r); s.At == start {
			s.N = max(s.N-cost, 0)
		}
	case SlidingWindow:
		W := int64(r.Window)
		switch ws := windowStart(at, W); s.At {
		case ws:
			s.N = max(s.N-cost, 0)
		case ws + W:
			s.Prev = max(s.Prev-cost, 0)
		}
	}
	return s
}

// remove takes up to n units off the entry logged at instant t, and drops
// the entry when none are left; a log without an entry at t is left
// alone. It returns the units taken.
func (l *logRing) remove(t, n int64) int64 {
	if l.len() == 0 || n <= 0 {
		return 0
	}
	j := l.firstAfter(t) - 1
	if j < 0 || l.at(j).t != t {
		return 0
	}
	take := min(n, l.at(j).cum-l.cumBefore(j))
	for i := j; i < l.n; i++ {
		l.buf[l.index(i)].cum -= take
	}
	if l.at(j).cum == l.cumBefore(j) {
		for i := j; i < l.n-1; i++ {
			l.buf[l.index(i)] = l.at(i + 1)
		}
		l.n--
		if l.n == 0 {
			l.head = 0
		}
	}
	return take
}

// index returns the position in l.buf of the i-th oldest entry.
func (l *logRing) index(i int) int {
	j := l.head + i
	if j >= len(l.buf) {
		j -= len(l.buf)
	}
	return j
}

// GiveBack gives back the units an admitted decision charged for the
// verdicts i where back[i] is true, for a request whose outcome should
// not count (a response status the policy does not count, or one it
// refunds): every algorithm's, at the instant each was charged (a
// window's units go back to their window, a log's to their entry, a
// leased unit to the store it was leased from), shadow checks that allowed
// included. Concurrency slots are not given back here (Release frees
// them). Call it at most once, before Release; a decision that was not
// admitted holds nothing.
//
// The give-back carries an id (NewChargeID), so it lands once: when the
// store fails, fb.Recorder keeps it and sends it again until the store
// answers. A request the fallback decided gives its units back there, and
// they are taken off what fb.Recorder holds for the primary store (or,
// when a Flush sent them to the primary store meanwhile, given back
// there, under an id).
func (d *Decision) GiveBack(ctx context.Context, fb Fallback, back []bool) error {
	if !d.Admitted || d.decidedBy == nil {
		return nil
	}
	if len(d.checks) != len(d.counted) {
		return errGiveBackAfterRelease
	}
	return d.giveBack(ctx, fb, func(j, i int) bool {
		return i < len(back) && back[i] && d.checks[j].Algorithm != Concurrency
	})
}

// giveBack gives back what d charged for the counted checks pick selects
// (pick gets a check's index j in d.checks and its verdict's i): checks
// that allowed with a positive cost, at the instant they were charged, in
// one Charge with an id. It is the one give-back of GiveBack and Cancel:
// a request decided by the fallback gives back there and takes the units
// off what fb.Recorder holds for the primary store; a call that failed is
// kept by fb.Recorder with its id, to land once.
func (d *Decision) giveBack(ctx context.Context, fb Fallback, pick func(j, i int) bool) error {
	var checks []Check
	var rates []Rate
	for j, i := range d.counted {
		c := &d.checks[j]
		if c.Cost <= 0 || !d.results[j].Allowed || !pick(j, i) {
			continue
		}
		checks = append(checks, giveBackCheck(c, d.results[j].At))
		rates = append(rates, d.Verdicts[i].Limit.Rate)
	}
	ch, ok := d.decidedBy.(Charger)
	if !ok || len(checks) == 0 {
		return nil
	}
	local := fb.Store != nil && d.decidedBy == fb.Store
	id := ""
	if !local {
		id = NewChargeID()
	}
	err := ch.Charge(ctx, id, checks, make([]int64, len(checks)))
	switch {
	case fb.Recorder == nil:
	case local:
		// Take back what DecideOrFallback recorded; what a Flush sent to
		// the primary store since goes back there, under an id.
		var sent []Check
		for k := range checks {
			if left := fb.Recorder.Record(&checks[k], rates[k], checks[k].Cost); left < 0 {
				g := checks[k]
				g.Rate, g.Cost = rates[k], left
				sent = append(sent, g)
			}
		}
		if len(sent) > 0 {
			fb.Recorder.Retry(NewChargeID(), sent)
		}
	case err != nil && !errors.Is(err, ErrInvalidCheck):
		for k := range checks {
			checks[k].Rate = rates[k]
		}
		fb.Recorder.Retry(id, checks)
	}
	return err
}

// giveBackCheck returns the check that gives back, through a Charger,
// what c charged at the instant at (Unix ns): its cost negated, at its
// instant, without the shadow flag and the delay that do not apply to a
// charge.
func giveBackCheck(c *Check, at int64) Check {
	g := *c
	g.Cost, g.Shadow, g.Rate.Delay = -g.Cost, false, 0
	g.ChargedAt = at
	return g
}

// errGiveBackAfterRelease: Release compacted the checks GiveBack needs.
var errGiveBackAfterRelease = errors.New("limiter: GiveBack called after Release")
