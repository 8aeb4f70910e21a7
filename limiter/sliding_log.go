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
// and then logs n units at now.
//
//   - Remaining: Limit - count, after the request when admitted.
//   - RetryAfter (denied): the later of the instant the (count+n-Limit)-th
//     oldest unit leaves the window and lastAdmitted + MinInterval; exact.
//   - Reset: time until the oldest unit in the window expires (more
//     precisely until Remaining+1 units fit, ignoring MinInterval); 0 when
//     the window is empty.
//   - n > Limit never fits: denied with RetryAfter = Window.
//
// The log is not stored unit by unit: it holds one entry per admission
// (see logRing), with the running count of units logged, so a decision
// costs O(log entries) whatever the cost and the limit, and memory is 16
// bytes per admission in the window.
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
	if cost > r.Limit-count { // count + cost > Limit, without overflow
		wait = view.expiry(cost-(r.Limit-count)) - now
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
	first int // index of the oldest entry inside the window
	s     bucketState
	now   int64
	w     int64
}

func (v logView) count() int64 {
	n := v.log.unitsFrom(v.first)
	if v.s.N > 0 && v.s.At > v.now-v.w {
		n += v.s.N
	}
	return n
}

// expiry returns the instant the k-th oldest unit in the window leaves it
// (1 <= k <= count).
func (v logView) expiry(k int64) int64 {
	if k <= v.log.unitsFrom(v.first) {
		return v.log.at(v.log.unitEntry(v.first, k)).t + v.w
	}
	return v.s.At + v.w
}

// result reports Remaining and Reset when count units are in the window.
func (v logView) result(count int64, r Rate) Result {
	rem := max(r.Limit-count, 0)
	res := Result{Allowed: true, Remaining: rem}
	if count > 0 {
		// Remaining+1 units fit once count+rem+1-Limit units expired:
		// the oldest one, or the excess over a lowered limit plus one.
		k := int64(1)
		if count > r.Limit {
			k = count - r.Limit + 1
		}
		res.Reset = nsDuration(v.expiry(k) - v.now)
	}
	return res
}

// slidingLogExpiry is the instant from which the log is empty and
// MinInterval no longer applies.
func slidingLogExpiry(s bucketState, log *logRing, r Rate) int64 {
	var exp int64 = math.MinInt64
	if n := log.len(); n > 0 {
		exp = satAdd(log.at(n-1).t, int64(r.Window))
	}
	if s.N > 0 {
		exp = max(exp, satAdd(s.At, int64(r.Window)))
	}
	if s.At != 0 && r.MinInterval > 0 {
		exp = max(exp, satAdd(s.At, int64(r.MinInterval)))
	}
	return exp
}

// logEntry is one admission of a sliding log: its instant t and cum, the
// number of units logged in the bucket up to and including it.
type logEntry struct {
	t   int64
	cum int64
}

// logEntryBytes is the memory of one entry of a logRing's buffer.
const logEntryBytes = 16

// logRing is a sliding log: a ring buffer of entries with non-decreasing
// instants, oldest first, one per admission (admissions at the same instant
// share one entry). Entry i holds at(i).cum - at(i-1).cum units, and entry
// 0 holds at(0).cum - base, base being the cum of the last entry dropped;
// so the units from entry i on are at(len-1).cum - cumBefore(i), and the
// k-th of them belongs to the first entry whose cum reaches cumBefore(i)+k,
// found by binary search. Only differences of cums are used, and the log
// never holds more than MaxInt64 units (the largest limit), so cums may
// wrap around: int64 subtraction still gives the exact difference.
//
// A nil *logRing is an empty log.
type logRing struct {
	buf  []logEntry
	head int // index in buf of the oldest entry
	n    int
	base int64
}

func (l *logRing) len() int {
	if l == nil {
		return 0
	}
	return l.n
}

// at returns the i-th oldest entry.
func (l *logRing) at(i int) logEntry {
	j := l.head + i
	if j >= len(l.buf) {
		j -= len(l.buf)
	}
	return l.buf[j]
}

// cumBefore returns the cum of the entry before the i-th oldest (base for
// the oldest).
func (l *logRing) cumBefore(i int) int64 {
	if i == 0 {
		return l.base
	}
	return l.at(i - 1).cum
}

// unitsFrom returns the number of units logged in entries i and later.
func (l *logRing) unitsFrom(i int) int64 {
	if i >= l.len() {
		return 0
	}
	return l.at(l.n-1).cum - l.cumBefore(i)
}

// unitEntry returns the index of the entry that holds the k-th oldest unit
// counted from entry i (1 <= k <= unitsFrom(i)).
func (l *logRing) unitEntry(i int, k int64) int {
	c := l.cumBefore(i)
	return i + sort.Search(l.n-i, func(j int) bool { return l.at(i+j).cum-c >= k })
}

// firstAfter returns the index of the oldest entry later than cutoff
// (len() when there is none).
func (l *logRing) firstAfter(cutoff int64) int {
	if l == nil {
		return 0
	}
	return sort.Search(l.n, func(i int) bool { return l.at(i).t > cutoff })
}

// minLogBuf is the smallest buffer of a logRing.
const minLogBuf = 2

// trim drops the entries at or before cutoff. A buffer left less than a
// quarter full is halved until it is not, so a log that was long once does
// not keep its memory (and growing again is amortized).
func (l *logRing) trim(cutoff int64) {
	k := l.firstAfter(cutoff)
	if k == 0 {
		return
	}
	l.base = l.at(k - 1).cum
	l.n -= k
	l.head += k
	if l.head >= len(l.buf) {
		l.head -= len(l.buf)
	}
	if l.n == 0 {
		l.head = 0
	}
	size := len(l.buf)
	for size > minLogBuf && l.n < size/4 {
		size /= 2
	}
	if size < len(l.buf) {
		l.resize(size)
	}
}

// add logs n units at t (or at the newest entry, if later, to keep the
// ring sorted when the clock goes back): one more entry, or more units in
// the newest entry when it has the same instant.
func (l *logRing) add(t, n int64) {
	if n <= 0 {
		return
	}
	last := l.base
	if l.n > 0 {
		e := l.at(l.n - 1)
		if e.t >= t {
			j := l.head + l.n - 1
			if j >= len(l.buf) {
				j -= len(l.buf)
			}
			l.buf[j].cum += n
			return
		}
		last = e.cum
	}
	if l.n == len(l.buf) {
		l.resize(max(2*len(l.buf), minLogBuf))
	}
	j := l.head + l.n
	if j >= len(l.buf) {
		j -= len(l.buf)
	}
	l.buf[j] = logEntry{t: t, cum: last + n}
	l.n++
}

// resize moves the entries to a buffer of size entries (at least n).
func (l *logRing) resize(size int) {
	buf := make([]logEntry, size)
	for i := 0; i < l.n; i++ {
		buf[i] = l.at(i)
	}
	l.buf, l.head = buf, 0
}

// bytes is the memory of the log's buffer.
func (l *logRing) bytes() int {
	if l == nil {
		return 0
	}
	return len(l.buf) * logEntryBytes
}

// reset empties the log and frees its buffer.
func (l *logRing) reset() {
	l.buf, l.head, l.n, l.base = nil, 0, 0, 0
}
