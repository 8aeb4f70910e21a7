package limiter

import (
	"testing"
	"time"
)

func TestPolicyCounts(t *testing.T) {
	mem, _ := newTestStore(t, MemoryOptions{})
	for _, c := range []Check{
		{Algorithm: SlidingLog, Tenant: "a", Policy: "z", Rate: Rate{Limit: 5, Window: time.Minute}, Cost: 1},
		{Algorithm: SlidingLog, Tenant: "b:}{", Policy: "z", Rate: Rate{Limit: 5, Window: time.Minute}, Cost: 1},
		{Algorithm: SlidingLog, Tenant: "", Policy: "z", Rate: Rate{Limit: 5, Window: time.Minute}, Cost: 1},
		{Algorithm: FixedWindow, Tenant: "a", Policy: "p", Part: "x:y", Rate: Rate{Limit: 5, Window: time.Minute}, Cost: 1},
	} {
		mustDecide(t, mem, c)
	}
	got := mem.PolicyCounts()
	if got["z"] != 3 || got["p"] != 1 || len(got) != 2 {
		t.Errorf("PolicyCounts = %v, want z:3 p:1", got)
	}
}
