package limiter

import "time"

// Calendar checks on Redis. A Lua script cannot do time zones, and the
// decision must be timed by Redis TIME, not by this instance's clock. So
// the store computes, around its own clock, the boundaries of the period
// that holds now and of the periods on either side (Calendar.Bounds), and
// passes them with the check; the script (lua/calendar.lua) picks the
// period that holds Redis's now. An instance whose clock is off Redis's by
// less than a period (11.5 hours at the least) so decides exactly as every
// other, even across a boundary: whoever crosses it first, the count
// follows Redis's clock.
//
// The check keeps its layout (CHECK_ARGS): its algorithm argument becomes
// "calendar" and its window argument the ARGV index of its first boundary;
// the boundaries, four per calendar check, follow the checks' arguments,
// where the entry points (decide, lease) never look.

// calendarArgs is the number of boundaries sent per calendar check.
const calendarArgs = 4

// argCalendar is the Lua algorithm name of a calendar check, boxed once.
var argCalendar any = "calendar"

// hasCalendar reports whether any of the checks idx counts calendar
// periods, so the clock is read only for those.
func hasCalendar(checks []Check, idx []int) bool {
	for _, i := range idx {
		if checks[i].Rate.Calendar != nil {
			return true
		}
	}
	return false
}

// appendCalendarArgs turns the calendar checks among the checks idx, whose
// arguments appendCheckArgs has just appended to sc.args, into "calendar"
// checks and appends their boundaries, computed around now (Unix ns).
func (sc *redisScratch) appendCalendarArgs(checks []Check, idx []int, now int64) {
	n := 0
	for _, i := range idx {
		if checks[i].Rate.Calendar != nil {
			n++
		}
	}
	if n == 0 {
		return
	}
	// sc.cal must not move once pointers into it are taken.
	if cap(sc.cal) < calendarArgs*n {
		sc.cal = make([]int64, calendarArgs*n)
	}
	sc.cal = sc.cal[:calendarArgs*n]
	base := len(sc.args) - checkArgs*len(idx)
	k := 0
	for j, i := range idx {
		cal := checks[i].Rate.Calendar
		if cal == nil {
			continue
		}
		b := cal.Bounds(now)
		v := sc.cal[calendarArgs*k : calendarArgs*(k+1)]
		for x := range b {
			// Period boundaries are whole seconds: exact in µs.
			v[x] = b[x] / int64(time.Microsecond)
		}
		sc.args[base+checkArgs*j] = argCalendar
		// ARGV is 1-based: sc.args[m] is ARGV[m+1].
		sc.nums[checkNums*j+1] = int64(len(sc.args) + calendarArgs*k + 1)
		k++
	}
	for x := range sc.cal {
		sc.args = append(sc.args, &sc.cal[x])
	}
}

// gatewayNow is the instant the calendar boundaries are computed around:
// this instance's clock (the test hook's instant when set).
func (s *RedisStore) gatewayNow() int64 {
	if s.now != nil {
		return s.now() * int64(time.Microsecond)
	}
	return time.Now().UnixNano()
}
