package protect

import (
	"math"
	"time"
)

// failWeight is the weight of each answer in the failure rate (about the
// last 10 answers), and overloadFailRate the rate at which failures cut
// the limit: three failures in a row, or one answer in five for a while.
const (
	failWeight       = 0.1
	overloadFailRate = 0.2
)

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
