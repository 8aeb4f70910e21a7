package surface

import (
	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// markNearLimit flags, in st.near, the verdicts of an admitted request
// that left their tenant with less than (1 - near_limit) of its limit,
// and notes those tenants on the handler's board. Only charged verdicts
// the store answered count (not fail modes, not unlimited tenants, not
// cost 0); shadow policies count too, measured against their own limit.
// The limit is the bucket's capacity: the limit, or a token bucket's or
// GCRA's burst. A verdict served from a lease reports what the store last
// said plus the units this instance still holds, so with leases a tenant
// shows up near its limit a little later.
func (h *Server) markNearLimit(st *requestState) {
	d := &st.decision
	if !d.Admitted {
		return
	}
	var board *fleet.NearLimitBoard
	for i := range d.Verdicts {
		v := &d.Verdicts[i]
		near := v.Counted() && v.Path == limiter.PathStore && v.Result.Allowed && st.items[i].Cost > 0 &&
			isNearLimit(v.Result.Remaining, v.Limit.Capacity(), st.policies[i].Near)
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
		board.Note(it.Policy.Name, gate.Loggable(it.Tenant), key, v.Result.Remaining, v.Limit.Capacity(), v.Result.Reset)
	}
}

// isNearLimit reports whether remaining is less than (1 - fraction) of
// capacity.
func isNearLimit(remaining, capacity int64, fraction float64) bool {
	return float64(remaining) < (1-fraction)*float64(capacity)
}
