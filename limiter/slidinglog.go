package limiter

import (
	"math"
	"sort"
)

// slidingLog decides one request with an exact log of admitted units.
//
// The bucket remembers the instant of every admitted unit (a request of
// cost n logs n units at the same instant) and counts those inside the
// trailing window (now - Window, now]. A request of cost n is admitted when
//
//	count + n <= Limit  and  (MinInterval == 0 or now - lastAdmitted >= MinInterval)
//
// and then logs n units at now. Exact, but O(Limit) memory by nature: up to
// Limit int64 timestamps (8 bytes each) per bucket, in a ring allocated
// lazily and grown as needed, never holding more than Limit entries.
//
//   - Remaining: Limit - count, after the request when admitted.
//   - RetryAfter (denied): the later of the instant the (count+n-Limit)-th
//     oldest unit leaves the window and lastAdmitted + MinInterval; exact.
//   - Reset: time until the oldest unit in the window expires (more
//     precisely until Remaining+1 units fit, ignoring MinInterval); 0 when
//     the window is empty.
//   - n > Limit never fits: denied with RetryAfter = Window.
//
// State: the log (nil when empty), At = instant of the last admission (0 =
// never) and N = units admitted at At that are not in the log yet. A store
// appends charged units to the log (logRing.add) and keeps N = 0; N lets a
// store chain several checks of the same bucket within one instant.
func slidingLog(s bucketState, log *logRing, now int64, r Rate, cost int64) (Result, bucketState) {
	cur := s
	view := logView{log: log, first: log.firstAfter(now - int64(r.Window)), s: s, now: now, w: int64(r.Window)}
	count := view.count()
	peek := view.result(count, r)
	switch {
	case cost == 0:
		return peek, cur
	case cost > r.Limit:
		return nothingFits(peek, r), cur
	}
	var wait int64
	if count+cost > r.Limit {
		wait = view.expiry(count+cost-r.Limit) - now
	}
	if r.MinInterval > 0 && s.At != 0 && now-s.At < int64(r.MinInterval) {
		wait = max(wait, s.At+int64(r.MinInterval)-now)
	}
	if wait > 0 {
		return deniedResult(peek, wait), cur
	}
	if s.At != now {
		// Units pending at an older instant are re-dated to now: later
		// expiry, never earlier. (A store keeps N = 0 between instants.)
		cur.At = max(now, s.At)
	}
	cur.N += cost
	view.s = cur
	res := view.result(count+cost, r)
	res.Allowed = true
	return res, cur
}

// logView is the part of a log inside the window at now, followed by the
// N units pending at s.At.
type logView struct {
	log   *logRing
	first int // index of the oldest logged unit inside the window
	s     bucketState
	now   int64
	w     int64
}

func (v logView) count() int64 {
	n := int64(v.log.len() - v.first)
	if v.s.N > 0 && v.s.At > v.now-v.w {
		n += v.s.N
	}
	return n
}

// expiry returns the instant the k-th oldest unit in the window leaves it
// (1 <= k <= count).
func (v logView) expiry(k int64) int64 {
	logged := int64(v.log.len() - v.first)
	if k <= logged {
		return v.log.at(v.first+int(k)-1) + v.w
	}
	return v.s.At + v.w
}

// result reports Remaining and Reset when count units are in the window.
func (v logView) result(count int64, r Rate) Result {
	rem := max(r.Limit-count, 0)
	res := Result{Allowed: true, Remaining: rem}
	if count > 0 {
		// Remaining+1 units fit once count+rem+1-Limit units expired.
		res.Reset = nsDuration(v.expiry(count+rem+1-r.Limit) - v.now)
	}
	return res
}

// slidingLogExpiry is the instant from which the log is empty and
// MinInterval no longer applies.
func slidingLogExpiry(s bucketState, log *logRing, r Rate) int64 {
	var exp int64 = math.MinInt64
	if n := log.len(); n > 0 {
		exp = satAdd(log.at(n-1), int64(r.Window))
	}
	if s.N > 0 {
		exp = max(exp, satAdd(s.At, int64(r.Window)))
	}
	if s.At != 0 && r.MinInterval > 0 {
		exp = max(exp, satAdd(s.At, int64(r.MinInterval)))
	}
	return exp
}

// logRing is a ring buffer of non-decreasing unit timestamps, oldest first.
// A nil *logRing is an empty log.
type logRing struct {
	buf  []int64
	head int // index in buf of the oldest entry
	n    int
}

func (l *logRing) len() int {
	if l == nil {
		return 0
	}
	return l.n
}

// at returns the i-th oldest entry.
func (l *logRing) at(i int) int64 {
	j := l.head + i
	if j >= len(l.buf) {
		j -= len(l.buf)
	}
	return l.buf[j]
}

// firstAfter returns the index of the oldest entry later than cutoff
// (len() when there is none).
func (l *logRing) firstAfter(cutoff int64) int {
	if l == nil {
		return 0
	}
	return sort.Search(l.n, func(i int) bool { return l.at(i) > cutoff })
}

// trim drops the entries at or before cutoff.
func (l *logRing) trim(cutoff int64) {
	k := l.firstAfter(cutoff)
	if k == 0 {
		return
	}
	l.n -= k
	l.head += k
	if l.head >= len(l.buf) {
		l.head -= len(l.buf)
	}
	if l.n == 0 {
		l.head = 0
	}
}

// add logs n units at t (or at the newest entry, if later, to keep the
// ring sorted when the clock goes back), keeping at most limit entries: the
// oldest are dropped first, which cannot change any decision since the
// newest limit entries alone already deny every request until they expire.
func (l *logRing) add(t, n, limit int64) {
	if l.n > 0 {
		t = max(t, l.at(l.n-1))
	}
	n = min(n, limit)
	if drop := int64(l.n) + n - limit; drop > 0 {
		l.n -= int(drop)
		l.head = (l.head + int(drop)) % max(len(l.buf), 1)
	}
	need := l.n + int(n)
	if need > len(l.buf) || int64(len(l.buf)) > limit {
		size := min(max(2*len(l.buf), need, 4), int(limit))
		if int64(len(l.buf)) > limit {
			size = int(limit)
		}
		buf := make([]int64, size)
		for i := 0; i < l.n; i++ {
			buf[i] = l.at(i)
		}
		l.buf, l.head = buf, 0
	}
	for i := 0; i < int(n); i++ {
		j := l.head + l.n
		if j >= len(l.buf) {
			j -= len(l.buf)
		}
		l.buf[j] = t
		l.n++
	}
}

// reset empties the log and frees its buffer.
func (l *logRing) reset() {
	l.buf, l.head, l.n = nil, 0, 0
}
