package surface

import (
	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// markNearLimit flags, in st.near, the verdicts of an admitted request
// that left their tenant near its limit (nearLimit), and notes those
// tenants on the handler's board. A verdict served from a lease reports
// what the store last said plus the units this instance still holds, so
// with leases a tenant shows up near its limit a little later.
func (h *Server) markNearLimit(st *requestState) {
	d := &st.decision
	if !d.Admitted {
		return
	}
	var board *fleet.NearLimitBoard
	for i := range d.Verdicts {
		v := &d.Verdicts[i]
		near := nearLimit(v, &st.items[i], st.policies[i].Near)
		st.near = append(st.near, near)
		if !near {
			continue
		}
		if board == nil {
			board = h.gate.Store.NearLimit()
		}
		it := &st.items[i]
		key := ""
		if h.LogKey {
			key = gate.Loggable(it.Part)
		}
		board.Note(it.Policy.Name, gate.Loggable(it.Tenant), key, v.Result.Remaining, v.Limit.Limit, v.Result.Reset)
	}
}

// nearLimit reports whether the verdict v of item it, of an admitted
// request, left the tenant near its limit at fraction: the rule of the
// near_limit metric and of the near_limit webhook's thresholds alike.
// Only charged verdicts the store answered count (not fail modes, not
// unlimited tenants, not cost 0); shadow policies count too, measured
// against their own limit. Near is gate.NearLimit: less than
// (1 - fraction) of the limit left, the limit and not a burst.
func nearLimit(v *limiter.Verdict, it *limiter.Item, fraction float64) bool {
	return v.Counted() && v.Path == limiter.PathStore && v.Result.Allowed && it.Cost > 0 &&
		gate.NearLimit(v.Result.Remaining, v.Limit.Limit, fraction)
}
