package limiter

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

func mustZone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := LoadZone(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// TestCalendarPeriods: known periods, DST days of 23 and 25 hours in two
// zones, ISO weeks, months of 28 to 31 days, a day without a midnight and
// a day that does not exist.
func TestCalendarPeriods(t *testing.T) {
	ny := mustZone(t, "America/New_York")
	berlin := mustZone(t, "Europe/Berlin")
	tests := []struct {
		name       string
		unit       CalendarUnit
		loc        *time.Location
		at         string // RFC 3339 instant
		start, end string // RFC 3339, in any offset
		hours      float64
	}{
		{"day utc", CalendarDay, time.UTC, "2024-03-10T12:00:00Z", "2024-03-10T00:00:00Z", "2024-03-11T00:00:00Z", 24},
		{"day ny", CalendarDay, ny, "2024-01-15T03:00:00Z", "2024-01-14T00:00:00-05:00", "2024-01-15T00:00:00-05:00", 24},
		{"day ny spring forward", CalendarDay, ny, "2024-03-10T12:00:00Z", "2024-03-10T00:00:00-05:00", "2024-03-11T00:00:00-04:00", 23},
		{"day ny fall back", CalendarDay, ny, "2024-11-03T12:00:00Z", "2024-11-03T00:00:00-04:00", "2024-11-04T00:00:00-05:00", 25},
		{"day ny fall back, second 1:30", CalendarDay, ny, "2024-11-03T06:30:00Z", "2024-11-03T00:00:00-04:00", "2024-11-04T00:00:00-05:00", 25},
		{"day berlin spring forward", CalendarDay, berlin, "2024-03-31T10:00:00Z", "2024-03-31T00:00:00+01:00", "2024-04-01T00:00:00+02:00", 23},
		{"day berlin fall back", CalendarDay, berlin, "2024-10-27T10:00:00Z", "2024-10-27T00:00:00+02:00", "2024-10-28T00:00:00+01:00", 25},
		{"day berlin, utc evening is next day", CalendarDay, berlin, "2024-06-30T22:30:00Z", "2024-07-01T00:00:00+02:00", "2024-07-02T00:00:00+02:00", 24},
		// Clocks jump from 24:00 to 01:00: the day starts at 01:00.
		{"day santiago, no midnight", CalendarDay, mustZone(t, "America/Santiago"), "2024-09-08T12:00:00Z", "2024-09-08T01:00:00-03:00", "2024-09-09T00:00:00-03:00", 23},
		{"day before santiago gap", CalendarDay, mustZone(t, "America/Santiago"), "2024-09-07T12:00:00Z", "2024-09-07T00:00:00-04:00", "2024-09-08T01:00:00-03:00", 24},
		// Samoa skipped 2011-12-30: the 29th ends when the 31st begins.
		{"day apia, skipped day", CalendarDay, mustZone(t, "Pacific/Apia"), "2011-12-29T12:00:00-10:00", "2011-12-29T00:00:00-10:00", "2011-12-31T00:00:00+14:00", 24},
		{"week utc", CalendarWeek, time.UTC, "2024-03-14T12:00:00Z", "2024-03-11T00:00:00Z", "2024-03-18T00:00:00Z", 168},
		{"week on monday", CalendarWeek, time.UTC, "2024-03-11T00:00:00Z", "2024-03-11T00:00:00Z", "2024-03-18T00:00:00Z", 168},
		{"week on sunday night", CalendarWeek, time.UTC, "2024-03-17T23:59:59Z", "2024-03-11T00:00:00Z", "2024-03-18T00:00:00Z", 168},
		{"week ny with spring forward", CalendarWeek, ny, "2024-03-10T12:00:00Z", "2024-03-04T00:00:00-05:00", "2024-03-11T00:00:00-04:00", 167},
		{"week berlin with fall back", CalendarWeek, berlin, "2024-10-27T12:00:00Z", "2024-10-21T00:00:00+02:00", "2024-10-28T00:00:00+01:00", 169},
		{"week across new year", CalendarWeek, time.UTC, "2025-01-01T12:00:00Z", "2024-12-30T00:00:00Z", "2025-01-06T00:00:00Z", 168},
		{"month leap february", CalendarMonth, time.UTC, "2024-02-15T00:00:00Z", "2024-02-01T00:00:00Z", "2024-03-01T00:00:00Z", 29 * 24},
		{"month february", CalendarMonth, time.UTC, "2023-02-28T23:59:59Z", "2023-02-01T00:00:00Z", "2023-03-01T00:00:00Z", 28 * 24},
		{"month april", CalendarMonth, time.UTC, "2024-04-30T00:00:00Z", "2024-04-01T00:00:00Z", "2024-05-01T00:00:00Z", 30 * 24},
		{"month december", CalendarMonth, time.UTC, "2024-12-31T23:00:00Z", "2024-12-01T00:00:00Z", "2025-01-01T00:00:00Z", 31 * 24},
		{"month ny march", CalendarMonth, ny, "2024-03-20T00:00:00Z", "2024-03-01T00:00:00-05:00", "2024-04-01T00:00:00-04:00", 31*24 - 1},
		{"month ny november", CalendarMonth, ny, "2024-11-20T00:00:00Z", "2024-11-01T00:00:00-04:00", "2024-12-01T00:00:00-05:00", 30*24 + 1},
		// 03:00 UTC on Nov 1st is still October in New York.
		{"month ny, utc is next month", CalendarMonth, ny, "2024-11-01T03:00:00Z", "2024-10-01T00:00:00-04:00", "2024-11-01T00:00:00-04:00", 31 * 24},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCalendar(tt.unit, tt.loc)
			at := mustTime(t, tt.at)
			start, end := c.Period(at.UnixNano())
			if want := mustTime(t, tt.start); start != want.UnixNano() {
				t.Errorf("start %s, want %s", time.Unix(0, start).In(tt.loc), want.In(tt.loc))
			}
			if want := mustTime(t, tt.end); end != want.UnixNano() {
				t.Errorf("end %s, want %s", time.Unix(0, end).In(tt.loc), want.In(tt.loc))
			}
			if got := time.Duration(end - start).Hours(); got != tt.hours {
				t.Errorf("length %vh, want %vh", got, tt.hours)
			}
			// The same answers from a fresh calendar (no cache), and from
			// the cache at both ends of the period.
			fresh := NewCalendar(tt.unit, tt.loc)
			for _, x := range []int64{start, end - 1, at.UnixNano()} {
				if s, e := fresh.Period(x); s != start || e != end {
					t.Errorf("Period(%s) = %s..%s, want %s..%s", time.Unix(0, x), time.Unix(0, s), time.Unix(0, e), time.Unix(0, start), time.Unix(0, end))
				}
				if s, e := c.Period(x); s != start || e != end {
					t.Errorf("cached Period(%s) = %s..%s", time.Unix(0, x), time.Unix(0, s), time.Unix(0, e))
				}
			}
		})
	}
}

func mustTime(t testing.TB, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestCalendarPeriodsExhaustive: over two years, every hour, in zones
// with and without DST (and with a DST change at midnight), the period
// that holds an instant runs from the first to the last instant of its
// local date, ISO week or month, and consecutive periods touch.
func TestCalendarPeriodsExhaustive(t *testing.T) {
	zones := []string{"UTC", "America/New_York", "Europe/Berlin", "Australia/Sydney", "America/Santiago", "Asia/Kolkata", "Pacific/Chatham", "Pacific/Apia"}
	from := time.Date(2023, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	to := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	if testing.Short() {
		to = time.Date(2023, 4, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	}
	for _, zone := range zones {
		loc := mustZone(t, zone)
		for _, unit := range []CalendarUnit{CalendarDay, CalendarWeek, CalendarMonth} {
			label := func(ns int64) string {
				lt := time.Unix(0, ns).In(loc)
				switch unit {
				case CalendarWeek:
					y, w := lt.ISOWeek()
					return fmt.Sprint(y, "w", w)
				case CalendarMonth:
					return lt.Format("2006-01")
				}
				return lt.Format("2006-01-02")
			}
			c := NewCalendar(unit, loc)
			prevStart, prevEnd := int64(0), int64(0)
			for at := from; at < to; at += int64(time.Hour) {
				start, end := c.Period(at)
				l := label(at)
				switch {
				case !(start <= at && at < end):
					t.Fatalf("%s %s: %s not in %s..%s", zone, unit, time.Unix(0, at), time.Unix(0, start), time.Unix(0, end))
				case label(start) != l || label(end-1) != l:
					t.Fatalf("%s %s at %s (%s): period %s..%s is not all %s", zone, unit, time.Unix(0, at).In(loc), l, time.Unix(0, start).In(loc), time.Unix(0, end).In(loc), l)
				case label(start-1) == l || label(end) == l:
					t.Fatalf("%s %s at %s (%s): period %s..%s is not all of %s", zone, unit, time.Unix(0, at).In(loc), l, time.Unix(0, start).In(loc), time.Unix(0, end).In(loc), l)
				case prevEnd != 0 && start != prevStart && start != prevEnd:
					t.Fatalf("%s %s: period %s..%s does not start where the previous one ended, %s", zone, unit, time.Unix(0, start), time.Unix(0, end), time.Unix(0, prevEnd))
				}
				prevStart, prevEnd = start, end
				b := c.Bounds(at)
				if b[1] != start || b[2] != end {
					t.Fatalf("%s %s: Bounds(%s) = %v, period %d..%d", zone, unit, time.Unix(0, at), b, start, end)
				}
				if s, e := c.Period(b[0]); s != b[0] || e != b[1] {
					t.Fatalf("%s %s: previous period of %s", zone, unit, time.Unix(0, at))
				}
				if s, e := c.Period(b[2]); s != b[2] || e != b[3] {
					t.Fatalf("%s %s: next period of %s", zone, unit, time.Unix(0, at))
				}
			}
		}
	}
}

// TestCalendarConcurrent: the cache is safe and right under concurrent
// use at instants far apart.
func TestCalendarConcurrent(t *testing.T) {
	c := NewCalendar(CalendarMonth, mustZone(t, "Europe/Berlin"))
	ref := NewCalendar(CalendarMonth, mustZone(t, "Europe/Berlin"))
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				at := time.Date(2020+g, time.Month(1+i%12), 1+i%28, i%24, 0, 0, 0, time.UTC).UnixNano()
				s, e := c.Period(at)
				rs, re := ref.period(at)
				if s != rs || e != re {
					t.Errorf("Period(%s) = %d..%d, want %d..%d", time.Unix(0, at), s, e, rs, re)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestParseCalendar(t *testing.T) {
	c, err := ParseCalendar("month", "America/New_York")
	if err != nil || c.String() != "month America/New_York" || c.Unit() != CalendarMonth || c.Nominal() != 31*24*time.Hour {
		t.Fatalf("ParseCalendar: %v %v", c, err)
	}
	if c, err := ParseCalendar("day", ""); err != nil || c.String() != "day UTC" {
		t.Fatalf("default zone: %v %v", c, err)
	}
	for _, tt := range []struct{ unit, zone, want string }{
		{"year", "", `"year": unknown calendar period (allowed: day, week, month)`},
		{"day", "Mars/Olympus_Mons", `"Mars/Olympus_Mons": unknown time zone`},
		{"day", "Local", `"Local": name an IANA time zone`},
		{"day", "../../etc/passwd", `"../../etc/passwd": unknown time zone`},
	} {
		_, err := ParseCalendar(tt.unit, tt.zone)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseCalendar(%q, %q) = %v, want %q", tt.unit, tt.zone, err, tt.want)
		}
	}
}

// TestCalendarCheckValidation: a calendar rate must be fixed_window with
// its nominal window.
func TestCalendarCheckValidation(t *testing.T) {
	cal := NewCalendar(CalendarDay, time.UTC)
	ok := Check{Algorithm: FixedWindow, Tenant: "t", Policy: "p", Rate: CalendarRate(10, cal), Cost: 1}
	if err := ok.validate(); err != nil {
		t.Fatal(err)
	}
	bad := ok
	bad.Algorithm = SlidingWindow
	if err := bad.validate(); err == nil || !strings.Contains(err.Error(), "calendar applies only to fixed_window, not sliding_window") {
		t.Errorf("sliding_window calendar: %v", err)
	}
	bad = ok
	bad.Rate.Window = time.Hour
	if err := bad.validate(); err == nil || !strings.Contains(err.Error(), "does not match calendar day UTC") {
		t.Errorf("wrong window: %v", err)
	}
	p := &Policy{Name: "p", Algorithm: TokenBucket, Limit: Limit{Rate: CalendarRate(10, cal)}}
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "calendar: calendar applies only to fixed_window") {
		t.Errorf("policy: %v", err)
	}
}

// TestFixedWindowCalendar: the pure function across a DST day in New
// York: the period is 23 hours, Reset and RetryAfter count to the next
// local midnight, the count starts afresh at it.
func TestFixedWindowCalendar(t *testing.T) {
	ny := mustZone(t, "America/New_York")
	r := CalendarRate(3, NewCalendar(CalendarDay, ny))
	day := time.Date(2024, 3, 10, 0, 0, 0, 0, ny) // 23 hours
	next := time.Date(2024, 3, 11, 0, 0, 0, 0, ny)
	b := pureBucket{algo: FixedWindow}
	at := day.Add(22 * time.Hour) // 23:00 local, one hour before the end
	if got := b.decide(at.UnixNano(), r, 2); got != wantAllow(1, time.Hour) {
		t.Fatalf("first: %+v", got)
	}
	if got := b.decide(at.UnixNano(), r, 2); got != wantDeny(1, time.Hour, time.Hour) {
		t.Fatalf("over: %+v", got)
	}
	// A cost that never fits waits one period: this one's 23 hours.
	if got := b.decide(at.UnixNano(), r, 4); got != wantDeny(1, 23*time.Hour, time.Hour) {
		t.Fatalf("never fits: %+v", got)
	}
	if got := b.decide(next.UnixNano()-1, r, 1); got != wantAllow(0, 1) {
		t.Fatalf("last ns: %+v", got)
	}
	if got := b.decide(next.UnixNano(), r, 1); got != wantAllow(2, 24*time.Hour) {
		t.Fatalf("next day: %+v", got)
	}
	if e := expiresAt(FixedWindow, b.s, nil, r); e != time.Date(2024, 3, 12, 0, 0, 0, 0, ny).UnixNano() {
		t.Fatalf("expires %s", time.Unix(0, e).In(ny))
	}
	// The clock going back does not roll the bucket back to March 10.
	if got := b.decide(at.UnixNano(), r, 0); got != wantAllow(2, next.Add(24*time.Hour).Sub(at)) {
		t.Fatalf("clock back: %+v", got)
	}
}
