package tollgate

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// Calendar quotas in the Caddy layer: the `calendar` configuration of a
// fixed_window policy, tier or tenant limit, and the RateLimit-Policy
// header of a calendar period (its w= is the length of the current
// period, which changes with DST and the month).

// calendarText describes the calendar of r for the admin API: "month
// America/New_York", or "" when r has none.
func calendarText(r limiter.Rate) string {
	if r.Calendar == nil {
		return ""
	}
	return r.Calendar.String()
}

// calendarPeriod describes the calendar of r and its period at now, for
// the admin API: "month America/New_York" and the period's start and end
// in RFC 3339, in the calendar's zone.
func calendarPeriod(r limiter.Rate, now time.Time) (name, start, end string) {
	start0, end0 := r.Calendar.Period(now.UnixNano())
	loc := r.Calendar.Location()
	return r.Calendar.String(), time.Unix(0, start0).In(loc).Format(time.RFC3339), time.Unix(0, end0).In(loc).Format(time.RFC3339)
}

// checkOverrideCalendar refuses a runtime override with a window for a
// calendar policy: overrides keep the policy's calendar period.
func checkOverrideCalendar(p *limiter.Policy, o *fleet.Override) error {
	if p.Limit.Calendar != nil && o.Window != 0 && !o.Unlimited {
		return apiError(http.StatusBadRequest, "policy %s counts per calendar %s: an override keeps that period (omit window; a tenant_limit in the config can set another)", p.Name, p.Limit.Calendar)
	}
	return nil
}

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
	r := p.policy.Limit.Rate
	start, end := r.Calendar.Period(t)
	h := &calendarHeader{start: start, end: end, header: policyHeaderWindow(p.header, r.Limit, time.Duration(end-start))}
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
