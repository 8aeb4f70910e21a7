package config

import (
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/tollgate/caddy-tollgate/limiter"
)

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
