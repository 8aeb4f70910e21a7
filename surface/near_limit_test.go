package surface

import (
	"testing"
	"time"
)

func TestIsNearLimit(t *testing.T) {
	for _, tt := range []struct {
		remaining, capacity int64
		fraction            float64
		want                bool
	}{
		{21, 100, 0.8, false},
		{20, 100, 0.8, false}, // exactly 20% left is not less than 20%
		{19, 100, 0.8, true},
		{0, 100, 0.8, true},
		{0, 100, 1, false}, // 1: never
		{1, 3, 0.5, true},
		{2, 3, 0.5, false},
		{9_007_199_254_740_990, 9_007_199_254_740_991, 0.9, false},
		{1, 9_007_199_254_740_991, 0.9, true},
	} {
		if got := isNearLimit(tt.remaining, tt.capacity, tt.fraction); got != tt.want {
			t.Errorf("isNearLimit(%d, %d, %v) = %v, want %v", tt.remaining, tt.capacity, tt.fraction, got, tt.want)
		}
	}
}

// TestNearLimitAllocatesNothing: flagging near-limit verdicts and
// counting them (per policy and per tenant) allocates nothing once the
// tenant is on the board.
func TestNearLimitAllocatesNothing(t *testing.T) {
	h := provisionServer(t, `{"metrics_tenants":5,"rate_limits":{"alloc_near":{"max_events":2,"window":3600000000000,"near_limit":0.1}}}`)
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
