package admin

import (
	"net/http"

	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// checkOverrideCalendar refuses a runtime override with a window for a
// calendar policy: overrides keep the policy's calendar period.
func checkOverrideCalendar(p *limiter.Policy, o *fleet.Override) error {
	if p.Limit.Calendar != nil && o.Window != 0 && !o.Unlimited {
		return apiError(http.StatusBadRequest, "policy %s counts per calendar %s: an override keeps that period (omit window; a tenant_limit in the config can set another)", p.Name, p.Limit.Calendar)
	}
	return nil
}
