package surface

import (
	"testing"
	"time"
)

// TestNearLimitAllocatesNothing: flagging near-limit verdicts and
// counting them (per policy and per tenant) allocates nothing once the
// tenant is on the board.
func TestNearLimitAllocatesNothing(t *testing.T) {
	h := provisionServer(t, `{"tenant":"{http.request.header.X-Tenant}","metrics_tenants":5,"rate_limits":{"alloc_near":{"max_events":2,"window":3600000000000,"near_limit":0.1}}}`)
	st := decidedState(t, h, "alloc_near", "acme")
	h.markNearLimit(st)
	if len(st.near) != 1 || !st.near[0] {
		t.Fatalf("near %v, want the verdict flagged", st.near)
	}
	start := time.Now()
	if n := testing.AllocsPerRun(2000, func() {
		st.near = st.near[:0]
		h.markNearLimit(st)
		h.recordDecision(st, start)
	}); n != 0 {
		t.Errorf("%v allocations per near-limit decision", n)
	}
}
