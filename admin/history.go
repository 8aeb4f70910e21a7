package admin

import (
	"errors"
	"net/http"
	"time"

	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/report"
)

// history reads tenant's series of p for the usage route's range and
// resolution parameters: nil when the handler keeps no history, a 400
// for a bad range, a 503 when the history cannot be read.
func history(r *http.Request, h *gate.Gate, p *gate.Policy, tenant string) (*report.Series, error) {
	hist := h.Store.History()
	if hist == nil {
		return nil, nil
	}
	q := r.URL.Query()
	rng, err := report.ParseRange(hist, q.Get("range"), q.Get("resolution"))
	if err != nil {
		return nil, apiError(http.StatusBadRequest, "%v", err)
	}
	s, err := report.History(r.Context(), h, p, tenant, rng, time.Now())
	if err != nil {
		return nil, apiError(http.StatusServiceUnavailable, "reading the history of policy %s: %v", p.Engine.Name, err)
	}
	return s, nil
}

// Limits of GET /rate_limit/top.
const (
	defaultTopCount = 10
	maxTopCount     = 1000
)

// top answers GET /rate_limit/top?policy=P&range=24h&count=N: the
// tenants of P admitted the most units over the range (default 24h, at
// most the minute retention, counted by hour), most first; fleet-wide
// with Redis.
func (adminAPI) top(w http.ResponseWriter, r *http.Request) error {
	if err := requireMethod(r, http.MethodGet); err != nil {
		return err
	}
	q := r.URL.Query()
	policy := q.Get("policy")
	if policy == "" {
		return apiError(http.StatusBadRequest, "policy: required, e.g. ?policy=api")
	}
	count, err := countParam(r, defaultTopCount, maxTopCount)
	if err != nil {
		return err
	}
	hs, ps, err := selectPolicies(policy)
	if err != nil {
		return err
	}
	for i, h := range hs {
		hist := h.Store.History()
		if len(ps[i]) == 0 || hist == nil {
			continue
		}
		length := 24 * time.Hour
		if rs := q.Get("range"); rs != "" {
			rng, err := report.ParseRange(hist, rs, "1h")
			if err != nil {
				return apiError(http.StatusBadRequest, "%v", err)
			}
			length = rng.Length
		}
		length = min(length, hist.Retention(fleet.Minute))
		now := time.Now()
		// Top counts whole hours: the hours the range reaches back to,
		// the current one included (a range under an hour: that one).
		from := now.Add(time.Hour - max(length, time.Hour))
		top, err := hist.Top(r.Context(), ps[i][0].Engine.Name, from, now, count)
		if errors.Is(err, fleet.ErrHistoryRange) {
			return apiError(http.StatusBadRequest, "range: %v", err)
		}
		if err != nil {
			return apiError(http.StatusServiceUnavailable, "reading the top tenants: %v", err)
		}
		out := make([]map[string]any, len(top))
		for j, e := range top {
			out[j] = map[string]any{"tenant": e.Tenant, "admitted": e.Admitted}
		}
		return writeJSON(w, map[string]any{"policy": policy, "range": length.String(), "tenants": out})
	}
	return apiError(http.StatusNotFound, "policy %s keeps no usage history (history off)", policy)
}
