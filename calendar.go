package tollgate

import (
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// Calendar quotas in the Caddy layer: the `calendar` configuration of a
// fixed_window policy, tier or tenant limit, and the RateLimit-Policy
// header of a calendar period (its w= is the length of the current
// period, which changes with DST and the month).

// CalendarConfig makes a fixed_window policy, tier or tenant limit count
// per calendar period of a time zone instead of per window: "15000 a
// day", "1000000 a month". A period starts at local midnight (of the day,
// of Monday for a week, of the 1st for a month) and ends at the next one:
// a day across a DST change lasts 23 or 25 hours, a month 28 to 31 days.
// Reset and Retry-After count to the next period start.
type CalendarConfig struct {
	// The period: "day", "week" (ISO weeks, from Monday) or "month".
	Period string `json:"period,omitempty"`

	// The IANA time zone the periods are cut in, e.g.
	// "America/New_York". Default "UTC".
	Zone string `json:"zone,omitempty"`
}

// calendar reads `calendar <period> [<zone>]`; the validator checks the
// period and the zone.
func (p cfParser) calendar() (*CalendarConfig, error) {
	args, err := p.args(1, 2)
	if err != nil {
		return nil, err
	}
	cc := &CalendarConfig{Period: args[0]}
	if len(args) == 2 {
		cc.Zone = args[1]
	}
	return cc, nil
}

// isZoneWord reports whether the word after `calendar <period>` on a tier
// or tenant_limit line is its zone: not another option, nor a duration.
func isZoneWord(w string) bool {
	switch w {
	case "burst", "delay", "shadow", "calendar":
		return false
	}
	_, err := caddy.ParseDuration(w)
	return err != nil
}

// calendars shares one limiter.Calendar (and its cache of periods) per
// period and zone across policies, tiers and config reloads.
var calendars sync.Map // "period zone" -> *limiter.Calendar

// calendar returns the calendar cc describes (nil when cc is nil).
func (cc *CalendarConfig) calendar() (*limiter.Calendar, error) {
	if cc == nil {
		return nil, nil
	}
	key := cc.Period + " " + cc.Zone
	if c, ok := calendars.Load(key); ok {
		return c.(*limiter.Calendar), nil
	}
	c, err := limiter.ParseCalendar(cc.Period, cc.Zone)
	if err != nil {
		return nil, err
	}
	v, _ := calendars.LoadOrStore(key, c)
	return v.(*limiter.Calendar), nil
}

// checkCalendar checks the calendar at path of a limit whose window is w,
// in a policy of algorithm alg.
func checkCalendar(path []string, cc *CalendarConfig, w time.Duration, alg limiter.Algorithm) error {
	if cc == nil {
		return nil
	}
	if alg != limiter.FixedWindow {
		return at(path, "applies only to fixed_window, not %s (a calendar quota counts per period: use algorithm fixed_window)", alg)
	}
	if w != 0 {
		return at(sub(path[:len(path)-1], "window"), "excludes calendar: count per window or per calendar period, not both (remove one)")
	}
	if _, err := limiter.ParseCalendarUnit(cc.Period); err != nil {
		return at(sub(path, "period"), "%v", err)
	}
	if _, err := limiter.LoadZone(cc.Zone); err != nil {
		return at(sub(path, "zone"), "%v", err)
	}
	return nil
}

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
