package admin

import (
	"net/http"
	"time"

	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/limiter"
)

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
