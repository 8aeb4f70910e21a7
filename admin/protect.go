package admin

import (
	"net/http"

	"github.com/tollgate/caddy-tollgate/gate"
)

// maxProtectTenants bounds the queued tenants GET /rate_limit/protect
// lists per handler.
const maxProtectTenants = 20

// protect answers GET /rate_limit/protect: each handler's adaptive limit
// (protect) on this instance: the limit, the requests in flight and
// queued, the latency baseline, and the tenants with the most requests
// waiting.
func (adminAPI) protect(w http.ResponseWriter, r *http.Request) error {
	if err := requireMethod(r, http.MethodGet); err != nil {
		return err
	}
	type queue struct {
		Tenant string  `json:"tenant"`
		Queued int     `json:"queued"`
		Weight float64 `json:"weight"`
	}
	type handler struct {
		Policies   []string `json:"policies"`
		Limit      int      `json:"limit"`
		InFlight   int      `json:"in_flight"`
		Queued     int      `json:"queued"`
		BaselineMS float64  `json:"baseline_ms"`
		Queues     []queue  `json:"queues"`
	}
	out := []handler{}
	for _, g := range gate.Gates() {
		l := g.Protection
		if l == nil {
			continue
		}
		st := l.Stats()
		h := handler{Policies: []string{}, Limit: st.Limit, InFlight: st.InFlight, Queued: st.Queued,
			BaselineMS: float64(st.Baseline.Microseconds()) / 1000, Queues: []queue{}}
		for _, p := range g.Policies {
			h.Policies = append(h.Policies, p.Name)
		}
		for _, q := range l.Queues(maxProtectTenants) {
			h.Queues = append(h.Queues, queue{Tenant: gate.Loggable(q.Tenant), Queued: q.Queued, Weight: q.Weight})
		}
		out = append(out, h)
	}
	return writeJSON(w, map[string]any{"handlers": out})
}
