package surface

import "github.com/tollgate/caddy-tollgate/limiter"

// Usage history (fleet.History): what each counted verdict did to its
// tenant's bucket, noted in process after the decision, and corrected
// when units are given back or a metered cost is settled, so a tenant's
// series adds up to what its buckets counted.

// noteHistory notes a decision: for each counted verdict, the units an
// admitted request charged, a denial, or a shadow would-deny.
func (h *Server) noteHistory(st *requestState) {
	hist := h.gate.Store.History()
	if hist == nil {
		return
	}
	d := &st.decision
	for i := range d.Verdicts {
		v := &d.Verdicts[i]
		if !v.Counted() {
			continue
		}
		it := &st.items[i]
		var admitted, denied, shadow int64
		switch {
		case v.ShadowDenied():
			shadow = 1
		case !v.Result.Allowed:
			denied = 1
		case d.Admitted && v.Path != limiter.PathFailedOpen:
			admitted = it.Cost
		}
		hist.Note(it.Policy.Name, it.Tenant, admitted, denied, shadow)
	}
}

// noteGiveBack takes the units given back (st.back) out of the history.
func (h *Server) noteGiveBack(st *requestState) {
	hist := h.gate.Store.History()
	if hist == nil {
		return
	}
	for i, back := range st.back {
		if v := &st.decision.Verdicts[i]; back && v.Counted() && v.Result.Allowed {
			hist.Note(st.items[i].Policy.Name, st.items[i].Tenant, -st.items[i].Cost, 0, 0)
		}
	}
}

// noteSettle adds the difference between the real costs settled and the
// up-front costs charged.
func (h *Server) noteSettle(st *requestState, real []int64) {
	hist := h.gate.Store.History()
	if hist == nil {
		return
	}
	for i, n := range real {
		if v := &st.decision.Verdicts[i]; n >= 0 && v.Counted() && v.Result.Allowed {
			delta := n - st.items[i].Cost
			if delta < 0 && !st.items[i].Policy.Algorithm.Refills() {
				delta = 0 // a window keeps its up-front units (limiter.Settle)
			}
			hist.Note(st.items[i].Policy.Name, st.items[i].Tenant, delta, 0, 0)
		}
	}
}
