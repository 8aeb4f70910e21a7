package surface

import (
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/tollgate/caddy-tollgate/compat"
	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/metrics"
	"go.uber.org/zap"
)

// provisionMetrics registers the collectors and resolves the policies'
// label children. Call it after provisionPolicies.
func (h *Server) provisionMetrics(ctx caddy.Context) error {
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
	}
	h.compat = compat.NewMetrics(h.Handler, h.gate.Policies)
	m, err := metrics.NewHandler(h.Redis != nil, h.labelTenants(), infos)
	if err != nil {
		return err
	}
	if h.MissingTenant == config.MissingTenantDeny {
		m.DeniesMissingTenant()
	}
	h.metrics = m
	return nil
}

// labelTenants is how many tenants get series of their own:
// metrics_tenants, when the handler has a tenant template. Without one, a
// request's tenant is its key (a client address, an API key), and no key
// ever becomes a label: the setting is ignored with a warning.
func (h *Server) labelTenants() int {
	if h.MetricsTenants > 0 && h.Tenant == "" {
		h.logger.Warn("metrics_tenants is ignored without tenant: a request's tenant is then its key, which never becomes a metric label",
			zap.Int("metrics_tenants", h.MetricsTenants))
		return 0
	}
	return h.MetricsTenants
}

// cleanupMetrics lets go of the handler's tenant tracker.
func (h *Server) cleanupMetrics() {
	if h.metrics != nil {
		h.metrics.Close()
	}
}

// decisionStart is the start time of a decision, or the zero time when
// the handler records no metrics (sparing the clock read).
func (h *Server) decisionStart() time.Time {
	if h.metrics == nil {
		return time.Time{}
	}
	return time.Now()
}

// recordDecision counts each counted verdict of the request's decision
// and observes the decision's duration.
func (h *Server) recordDecision(st *requestState, start time.Time) {
	m := h.metrics
	if m == nil {
		return
	}
	secs := time.Since(start).Seconds()
	d := &st.decision
	// caddy-ratelimit's families: under the policy the response
	// describes.
	if i := pick(d, true); i >= 0 {
		h.compat.Record(st.policies[i].index, d.Admitted, secs)
	} else if i = pick(d, false); i >= 0 {
		h.compat.Record(st.policies[i].index, d.Admitted, secs)
	}
	for i := range d.Verdicts {
		if v := &d.Verdicts[i]; v.Counted() {
			near := i < len(st.near) && st.near[i]
			m.Record(st.policies[i].index, v, st.items[i].Tenant, near, d.Admitted, secs)
		}
	}
}
