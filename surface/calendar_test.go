package surface

import (
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/limiter"
)

func mustCalendar(t *testing.T, period, zone string) *limiter.Calendar {
	t.Helper()
	c, err := limiter.ParseCalendar(period, zone)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestPolicyHeaderCalendar: w= is the length of the current period.
func TestPolicyHeaderCalendar(t *testing.T) {
	ny := mustCalendar(t, "day", "America/New_York")
	p := &policyRuntime{Policy: &gate.Policy{Header: "daily", Engine: &limiter.Policy{Name: "daily", Algorithm: limiter.FixedWindow, Limit: limiter.Limit{Rate: limiter.CalendarRate(100, ny)}}}}
	loc := ny.Location()
	for _, tt := range []struct {
		at   time.Time
		want string
	}{
		{time.Date(2024, 3, 10, 12, 0, 0, 0, loc), `"daily";q=100;w=82800`},
		{time.Date(2024, 3, 11, 12, 0, 0, 0, loc), `"daily";q=100;w=86400`},
		{time.Date(2024, 11, 3, 12, 0, 0, 0, loc), `"daily";q=100;w=90000`},
		{time.Date(2024, 11, 3, 23, 59, 59, 0, loc), `"daily";q=100;w=90000`},
		{time.Date(2024, 11, 4, 0, 0, 0, 0, loc), `"daily";q=100;w=86400`},
	} {
		if got := p.calendarHeader.get(p, tt.at); got != tt.want {
			t.Errorf("at %s: %s, want %s", tt.at, got, tt.want)
		}
	}
	month := limiter.CalendarRate(5, mustCalendar(t, "month", "UTC"))
	if got := periodLength(month, time.Date(2024, 2, 10, 0, 0, 0, 0, time.UTC)); got != 29*24*time.Hour {
		t.Errorf("February 2024: %s", got)
	}
}
