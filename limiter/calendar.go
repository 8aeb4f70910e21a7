package limiter

import (
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	// The IANA time zone database, embedded: a calendar in
	// America/New_York must mean the same on a minimal container image
	// without /usr/share/zoneinfo. Go uses the system database when there
	// is one and this copy otherwise (about 450 KB of binary size).
	_ "time/tzdata"
)

// CalendarUnit is the length of a calendar period.
type CalendarUnit uint8

// Calendar units. The zero value is no unit.
const (
	// CalendarDay: from midnight to midnight, 23 to 25 hours on the days
	// a DST change happens.
	CalendarDay CalendarUnit = iota + 1
	// CalendarWeek: ISO weeks, from Monday midnight to Monday midnight.
	CalendarWeek
	// CalendarMonth: from midnight on the 1st to midnight on the 1st of
	// the next month, 28 to 31 days.
	CalendarMonth
)

// CalendarUnits lists the unit names, for error messages.
const CalendarUnits = "day, week, month"

var calendarUnitNames = [...]string{CalendarDay: "day", CalendarWeek: "week", CalendarMonth: "month"}

// String returns the configuration name of u.
func (u CalendarUnit) String() string {
	if u >= CalendarDay && int(u) < len(calendarUnitNames) {
		return calendarUnitNames[u]
	}
	return fmt.Sprintf("calendar_unit(%d)", uint8(u))
}

// ParseCalendarUnit turns "day", "week" or "month" into a unit.
func ParseCalendarUnit(name string) (CalendarUnit, error) {
	for u, n := range calendarUnitNames {
		if n != "" && n == name {
			return CalendarUnit(u), nil
		}
	}
	return 0, fmt.Errorf("%q: unknown calendar period (allowed: %s)", name, CalendarUnits)
}

// Calendar cuts time into the calendar periods (days, ISO weeks or
// months) of one time zone. A fixed_window Rate with a Calendar counts per
// period instead of per epoch-aligned window: a period starts at local
// midnight (of the day, of Monday, of the 1st) and ends at the next one,
// so it lasts 23 or 25 hours across a DST change and 28 to 31 days for a
// month. On a day whose midnight does not exist (clocks jump from 24:00
// to 01:00) the day starts when the gap ends.
//
// A Calendar is immutable and safe for concurrent use; it caches the
// periods around the last instant it was asked about, so the common case
// (now is in the cached period) costs two atomic loads and compares.
type Calendar struct {
	unit CalendarUnit
	loc  *time.Location
	name string // "month America/New_York"
	// cache holds the periods around the last instant computed.
	cache atomic.Pointer[calendarBounds]
}

// calendarBounds are four consecutive period starts: the periods
// [b[0], b[1]), [b[1], b[2]) and [b[2], b[3]), in Unix nanoseconds.
type calendarBounds [4]int64

// NewCalendar returns the calendar of unit in loc (nil means UTC).
func NewCalendar(unit CalendarUnit, loc *time.Location) *Calendar {
	if loc == nil {
		loc = time.UTC
	}
	return &Calendar{unit: unit, loc: loc, name: unit.String() + " " + loc.String()}
}

// ParseCalendar returns the calendar of the period unit ("day", "week" or
// "month") in the IANA time zone zone ("" means UTC). The errors name
// what is wrong: an unknown period, or the zone that is not known.
// "Local" is refused: it would mean another zone on every machine.
func ParseCalendar(unit, zone string) (*Calendar, error) {
	u, err := ParseCalendarUnit(unit)
	if err != nil {
		return nil, err
	}
	loc, err := LoadZone(zone)
	if err != nil {
		return nil, err
	}
	return NewCalendar(u, loc), nil
}

// LoadZone loads an IANA time zone by name ("" means UTC), refusing
// "Local" and naming the zone when it is unknown.
func LoadZone(zone string) (*time.Location, error) {
	if zone == "" {
		return time.UTC, nil
	}
	if strings.EqualFold(zone, "local") {
		return nil, fmt.Errorf("%q: name an IANA time zone such as America/New_York (Local is each machine's own zone, so instances could disagree)", zone)
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, fmt.Errorf("%q: unknown time zone (want an IANA name such as UTC, America/New_York or Europe/Berlin)", zone)
	}
	return loc, nil
}

// Unit is the calendar's period unit.
func (c *Calendar) Unit() CalendarUnit { return c.unit }

// Location is the calendar's time zone.
func (c *Calendar) Location() *time.Location { return c.loc }

// String names the calendar as the configuration writes it: "month
// America/New_York".
func (c *Calendar) String() string { return c.name }

// Nominal is the duration a calendar Rate carries as its Window: 24h, 7
// days or 31 days. Code that needs one duration per rate (recovery
// accounting, lease entries) uses it; the decisions use the real periods.
func (c *Calendar) Nominal() time.Duration {
	switch c.unit {
	case CalendarWeek:
		return 7 * 24 * time.Hour
	case CalendarMonth:
		return 31 * 24 * time.Hour
	}
	return 24 * time.Hour
}

// Period returns the start and the end (Unix nanoseconds) of the period
// that holds the instant t: start <= t < end.
func (c *Calendar) Period(t int64) (start, end int64) {
	if b := c.cache.Load(); b != nil {
		for i := 0; i < 3; i++ {
			if b[i] <= t && t < b[i+1] {
				return b[i], b[i+1]
			}
		}
	}
	b := c.bounds(t)
	return b[1], b[2]
}

// Bounds returns the start of the period before the one that holds t, the
// start and end of the period that holds t, and the end of the period
// after it (Unix nanoseconds).
func (c *Calendar) Bounds(t int64) [4]int64 {
	if b := c.cache.Load(); b != nil && b[1] <= t && t < b[2] {
		return *b
	}
	return *c.bounds(t)
}

// bounds computes the bounds around t and caches them.
func (c *Calendar) bounds(t int64) *calendarBounds {
	start, end := c.period(t)
	prev, _ := c.period(start - 1)
	_, next := c.period(end)
	b := &calendarBounds{prev, start, end, next}
	c.cache.Store(b)
	return b
}

// period computes the period that holds t, without the cache.
func (c *Calendar) period(t int64) (start, end int64) {
	lt := time.Unix(0, t).In(c.loc)
	y, m, d := lt.Date()
	switch c.unit {
	case CalendarWeek:
		d -= (int(lt.Weekday()) + 6) % 7 // back to Monday
		return c.midnight(y, m, d), c.midnight(y, m, d+7)
	case CalendarMonth:
		return c.midnight(y, m, 1), c.midnight(y, m+1, 1)
	}
	return c.midnight(y, m, d), c.midnight(y, m, d+1)
}

// midnight returns the first instant of the civil date (y, m, d) in the
// calendar's zone (d may be out of range: time.Date normalizes it). Where
// midnight does not exist (a gap at midnight, or a day skipped when a zone
// moved across the date line), time.Date resolves it by either offset;
// when that lands on an earlier date the day starts at the end of the
// gap, the next zone transition.
func (c *Calendar) midnight(y int, m time.Month, d int) int64 {
	t := time.Date(y, m, d, 0, 0, 0, 0, c.loc)
	wy, wm, wd := time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Date()
	ty, tm, td := t.Date()
	if ty < wy || (ty == wy && (tm < wm || (tm == wm && td < wd))) {
		if _, end := t.ZoneBounds(); !end.IsZero() {
			t = end
		}
	}
	return t.UnixNano()
}

// checkCalendar reports why r cannot be a rate of algorithm a, nil when r
// has no calendar or it can be one: only FixedWindow counts per calendar
// period, and the rate's Window must be the calendar's Nominal.
func checkCalendar(r Rate, a Algorithm) error {
	if r.Calendar == nil {
		return nil
	}
	if a != FixedWindow {
		return fmt.Errorf("calendar applies only to fixed_window, not %s", a)
	}
	if r.Window != r.Calendar.Nominal() {
		return fmt.Errorf("window %s does not match calendar %s (a calendar rate's window is its Nominal, %s)", r.Window, r.Calendar, r.Calendar.Nominal())
	}
	return nil
}

// CalendarRate returns the Rate of limit units per period of cal.
func CalendarRate(limit int64, cal *Calendar) Rate {
	return Rate{Limit: limit, Window: cal.Nominal(), Calendar: cal}
}
