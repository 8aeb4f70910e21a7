package limiter

import (
	"slices"
	"testing"
	"time"
)

// Calendar checks against plain fixed windows:
//
//	go test -run xxx -bench Calendar -benchtime 5000x ./limiter/
//
// BenchmarkRedisCalendar reports the script's time inside Redis
// (redis-usec/call, INFO commandstats) for one check on an existing
// bucket: a fixed window of 24h, and calendar days and months in New York,
// whose period boundaries travel with the check.
func BenchmarkRedisCalendar(b *testing.B) {
	s, client := benchRedisStore(b)
	ny, err := LoadZone("America/New_York")
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		rate Rate
	}{
		{"fixed_window-24h", Rate{Limit: 1 << 40, Window: 24 * time.Hour}},
		{"calendar-day-NY", CalendarRate(1<<40, NewCalendar(CalendarDay, ny))},
		{"calendar-month-NY", CalendarRate(1<<40, NewCalendar(CalendarMonth, ny))},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := Check{Algorithm: FixedWindow, Tenant: "tenant-42", Policy: "quota-" + tc.name, Rate: tc.rate, Cost: 1}
			benchDecide(b, s, client, []Check{c})
		})
	}
}

// BenchmarkMemoryCalendar: one decision on the embedded store, fixed
// window against calendar day, and the period lookup alone (cached: the
// current period; uncached: a fresh computation with time.Date).
func BenchmarkMemoryCalendar(b *testing.B) {
	ny, err := LoadZone("America/New_York")
	if err != nil {
		b.Fatal(err)
	}
	cal := NewCalendar(CalendarDay, ny)
	for _, tc := range []struct {
		name string
		rate Rate
	}{
		{"fixed_window-24h", Rate{Limit: 1 << 40, Window: 24 * time.Hour}},
		{"calendar-day-NY", CalendarRate(1<<40, cal)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			m := NewMemoryStore(MemoryOptions{SweepInterval: -1})
			defer m.Close()
			checks := []Check{{Algorithm: FixedWindow, Tenant: "tenant-42", Policy: "q", Rate: tc.rate, Cost: 1}}
			res := make([]Result, 1)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := m.Decide(bgCtx, checks, res); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	now := time.Now().UnixNano()
	b.Run("period-cached", func(b *testing.B) {
		for b.Loop() {
			cal.Period(now)
		}
	})
	b.Run("period-uncached", func(b *testing.B) {
		for b.Loop() {
			cal.period(now)
		}
	})
}

// BenchmarkRedisCalendarInterleaved measures a fixed window of 24h and a
// calendar day in New York in alternating rounds of 1000 decisions, so
// that a noisy machine slows both alike, and reports the median of the
// rounds' Redis time per call (INFO commandstats) for each.
func BenchmarkRedisCalendarInterleaved(b *testing.B) {
	s, client := benchRedisStore(b)
	ny, err := LoadZone("America/New_York")
	if err != nil {
		b.Fatal(err)
	}
	checks := [][]Check{
		{{Algorithm: FixedWindow, Tenant: "tenant-42", Policy: "fixed", Rate: Rate{Limit: 1 << 40, Window: 24 * time.Hour}, Cost: 1}},
		{{Algorithm: FixedWindow, Tenant: "tenant-42", Policy: "calendar", Rate: CalendarRate(1<<40, NewCalendar(CalendarDay, ny)), Cost: 1}},
	}
	res := make([]Result, 1)
	var usec [2][]float64
	for b.Loop() {
		for i, c := range checks {
			if err := client.ConfigResetStat(bgCtx).Err(); err != nil {
				b.Fatal(err)
			}
			for range 1000 {
				if _, err := s.Decide(bgCtx, c, res); err != nil {
					b.Fatal(err)
				}
			}
			usec[i] = append(usec[i], scriptUsecPerCall(b, client))
		}
	}
	median := func(v []float64) float64 {
		slices.Sort(v)
		return v[len(v)/2]
	}
	b.ReportMetric(median(usec[0]), "fixed-usec/call")
	b.ReportMetric(median(usec[1]), "calendar-usec/call")
}
