package tollgate

import (
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/tollgate/caddy-tollgate/metrics"
)

// provisionMetrics registers the collectors and resolves the policies'
// label children. Call it after provisionPolicies.
func (h *Handler) provisionMetrics(ctx caddy.Context) error {
	if h.DisableMetrics {
		return nil
	}
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		if err := metrics.Register(reg); err != nil {
			return err
		}
	}
	infos := make([]metrics.PolicyInfo, len(h.policies))
	for i, p := range h.policies {
		infos[i] = metrics.PolicyInfo{Label: p.Label, Engine: p.Engine, Metered: p.meter != nil}
		p.initCompat(h.RateLimits[p.Name])
	}
	m, err := metrics.NewHandler(h.Redis != nil, h.MetricsTenants, infos)
	if err != nil {
		return err
	}
	h.metrics = m
	return nil
}

// cleanupMetrics lets go of the handler's tenant tracker.
func (h *Handler) cleanupMetrics() {
	if h.metrics != nil {
		h.metrics.Close()
	}
}

// decisionStart is the start time of a decision, or the zero time when
// the handler records no metrics (sparing the clock read).
func (h *Handler) decisionStart() time.Time {
	if h.metrics == nil {
		return time.Time{}
	}
	return time.Now()
}

// recordDecision counts each counted verdict of the request's decision
// and observes the decision's duration.
func (h *Handler) recordDecision(st *requestState, start time.Time) {
	m := h.metrics
	if m == nil {
		return
	}
	secs := time.Since(start).Seconds()
	recordCompat(st, secs)
	d := &st.decision
	for i := range d.Verdicts {
		if v := &d.Verdicts[i]; v.Counted() {
			near := i < len(st.near) && st.near[i]
			m.Record(st.policies[i].index, v, st.items[i].Tenant, near, d.Admitted, secs)
		}
	}
}
