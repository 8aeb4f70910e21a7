package config

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/limiter"
)

func mustCalendar(t *testing.T, period, zone string) *limiter.Calendar {
	t.Helper()
	c, err := (&CalendarConfig{Period: period, Zone: zone}).calendar()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCalendarConfig: JSON calendar policies, tiers and tenant limits are
// accepted and built with their periods; every mistake is refused at its
// JSON path, naming what is wrong.
func TestCalendarConfig(t *testing.T) {
	day := mustCalendar(t, "day", "America/New_York")
	week := mustCalendar(t, "week", "Europe/Berlin")
	month := mustCalendar(t, "month", "")
	got := policyNamed(t, jsonHandler(t, `{"rate_limits":{"p":{"max_events":15000,"calendar":{"period":"day","zone":"America/New_York"},
		"tiers":{"pro":{"max_events":100000},"trial":{"max_events":100,"window":"1h"},"big":{"max_events":1000000,"calendar":{"period":"month"}},"free":{"unlimited":true}},
		"tenant_limits":{"acme":{"max_events":7,"calendar":{"period":"week","zone":"Europe/Berlin"},"shadow":true}}}}}`), "p")
	want := &limiter.Policy{Name: "p", Algorithm: limiter.FixedWindow,
		Limit: limiter.Limit{Rate: limiter.CalendarRate(15000, day)},
		Tiers: map[string]limiter.Limit{
			"pro":   {Rate: limiter.CalendarRate(100000, day)},
			"trial": {Rate: limiter.Rate{Limit: 100, Window: time.Hour}},
			"big":   {Rate: limiter.CalendarRate(1000000, month)},
			"free":  {Unlimited: true},
		},
		TenantLimits: map[string]limiter.Limit{"acme": {Rate: limiter.CalendarRate(7, week), Shadow: true}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Fatal(err)
	}
	// A fixed_window policy with a window may give a tier a calendar.
	got = policyNamed(t, jsonHandler(t, `{"rate_limits":{"p":{"algorithm":"fixed_window","max_events":10,"window":"1m","tiers":{"pro":{"max_events":5,"calendar":{"period":"month"}}}}}}`), "p")
	if got.Limit.Calendar != nil || got.Tiers["pro"].Rate != limiter.CalendarRate(5, month) {
		t.Fatalf("calendar tier of a window policy: %+v", got)
	}

	for _, tt := range []struct{ name, config, want string }{
		{"unknown zone", `{"rate_limits":{"p":{"max_events":1,"calendar":{"period":"day","zone":"America/Gotham"}}}}`,
			`rate_limits.p.calendar.zone: "America/Gotham": unknown time zone (want an IANA name such as UTC, America/New_York or Europe/Berlin)`},
		{"unknown period", `{"rate_limits":{"p":{"max_events":1,"calendar":{"period":"fortnight"}}}}`,
			`rate_limits.p.calendar.period: "fortnight": unknown calendar period (allowed: day, week, month)`},
		{"missing period", `{"rate_limits":{"p":{"max_events":1,"calendar":{"zone":"UTC"}}}}`,
			`rate_limits.p.calendar.period: "": unknown calendar period`},
		{"other algorithm", `{"rate_limits":{"p":{"algorithm":"gcra","max_events":1,"calendar":{"period":"day"}}}}`,
			"rate_limits.p.calendar: applies only to fixed_window, not gcra"},
		{"with window", `{"rate_limits":{"p":{"max_events":1,"window":"24h","calendar":{"period":"day"}}}}`,
			"rate_limits.p.window: excludes calendar: count per window or per calendar period, not both (remove one)"},
		{"tier with window and calendar", `{"rate_limits":{"p":{"max_events":1,"calendar":{"period":"day"},"tiers":{"pro":{"max_events":2,"window":"1h","calendar":{"period":"month"}}}}}}`,
			"rate_limits.p.tiers.pro.window: excludes calendar"},
		{"tier calendar on sliding_window", `{"rate_limits":{"p":{"algorithm":"sliding_window","max_events":1,"window":"1s","tiers":{"pro":{"max_events":2,"calendar":{"period":"month"}}}}}}`,
			"rate_limits.p.tiers.pro.calendar: applies only to fixed_window, not sliding_window"},
		{"tenant limit zone", `{"rate_limits":{"p":{"max_events":1,"calendar":{"period":"day"},"tenant_limits":{"acme":{"max_events":2,"calendar":{"period":"day","zone":"Local"}}}}}}`,
			`rate_limits.p.tenant_limits.acme.calendar.zone: "Local": name an IANA time zone`},
		{"unlimited with calendar", `{"rate_limits":{"p":{"max_events":1,"calendar":{"period":"day"},"tiers":{"x":{"unlimited":true,"calendar":{"period":"day"}}}}}}`,
			"rate_limits.p.tiers.x: unlimited excludes max_events, window, calendar, burst and delay"},
		{"near_limit above one", `{"near_limit":2,"rate_limits":{"p":{"max_events":1,"window":"1s"}}}`,
			"near_limit: 2: want a fraction above 0 and at most 1"},
		{"policy near_limit negative", `{"rate_limits":{"p":{"max_events":1,"window":"1s","near_limit":-0.5}}}`,
			"rate_limits.p.near_limit: -0.5: want a fraction above 0 and at most 1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := jsonHandler(t, tt.config).Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want %q", err, tt.want)
			}
		})
	}
}
