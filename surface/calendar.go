package surface

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// Calendar quotas in the Caddy layer: the `calendar` configuration of a
// fixed_window policy, tier or tenant limit, and the RateLimit-Policy
// header of a calendar period (its w= is the length of the current
// period, which changes with DST and the month).

// calendarHeader caches the RateLimit-Policy value of a policy's own
// calendar limit for the current period.
type calendarHeader struct {
	end    int64 // Unix ns: the period the value is right for ends
	start  int64
	header string
}

// calendarHeaderCache holds, per policyRuntime, the cached header of its own
// limit (calendar policies only).
type calendarHeaderCache struct {
	v atomic.Pointer[calendarHeader]
}

// get returns the RateLimit-Policy value of the policy's own calendar
// limit at now, rendering it once per period.
func (c *calendarHeaderCache) get(p *policyRuntime, now time.Time) string {
	t := now.UnixNano()
	if h := c.v.Load(); h != nil && h.start <= t && t < h.end {
		return h.header
	}
	r := p.Engine.Limit.Rate
	start, end := r.Calendar.Period(t)
	h := &calendarHeader{start: start, end: end, header: policyHeaderWindow(p.Header, r.Limit, time.Duration(end-start))}
	c.v.Store(h)
	return h.header
}

// periodLength is the length of the period of r that holds now: its
// window, or with a calendar the current period's.
func periodLength(r limiter.Rate, now time.Time) time.Duration {
	if r.Calendar == nil {
		return r.Window
	}
	start, end := r.Calendar.Period(now.UnixNano())
	return time.Duration(end - start)
}

// policyHeaderWindow renders "name";q=limit;w=secs.
func policyHeaderWindow(name string, limit int64, window time.Duration) string {
	b := make([]byte, 0, len(name)+32)
	b = append(b, '"')
	b = append(b, name...)
	b = append(b, `";q=`...)
	b = strconv.AppendInt(b, limit, 10)
	b = append(b, ";w="...)
	b = strconv.AppendInt(b, ceilSeconds(window), 10)
	return string(b)
}
