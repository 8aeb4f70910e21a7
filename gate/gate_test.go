package gate

import (
	"math"
	"testing"
)

// TestNearLimit: less than (1 - fraction) of the limit left, exactly:
// just above, at and just below the boundary; the limit, never a burst
// (remaining above the limit is not near); fractions that floating point
// gets wrong by a hair; debt; extreme values.
func TestNearLimit(t *testing.T) {
	for _, tt := range []struct {
		remaining, limit int64
		fraction         float64
		want             bool
	}{
		{3, 10, 0.8, false},
		{2, 10, 0.8, false}, // exactly 20% left is not less than 20%
		{1, 10, 0.8, true},
		{0, 10, 0.8, true},
		{21, 100, 0.8, false},
		{20, 100, 0.8, false},
		{19, 100, 0.8, true},
		{4, 10, 0.7, false},
		{3, 10, 0.7, false}, // (1-0.7)*10 is 3.0000000000000004 in float64
		{2, 10, 0.7, true},
		{2, 10, 0.9, false},
		{1, 10, 0.9, false}, // (1-0.9)*10 is 0.9999999999999998 in float64
		{0, 10, 0.9, true},
		{20, 10, 0.8, false}, // a token bucket's burst of 20, full
		{10, 10, 0.8, false},
		{0, 100, 1, false}, // 1: only a bucket in debt
		{-1, 100, 1, true},
		{-5, 10, 0.5, true},
		{1, 3, 0.5, true},
		{2, 3, 0.5, false},
		{5, 10, 0.5, false},
		{4, 10, 0.5, true},
		{1, 0, 0.8, false}, // no limit: never
		{9_007_199_254_740_990, 9_007_199_254_740_991, 0.9, false},
		{1, 9_007_199_254_740_991, 0.9, true},
		{math.MinInt64, math.MaxInt64, 0.5, true},
		{math.MaxInt64/10 + 1, math.MaxInt64, 0.9, false}, // a tenth is ...580.7
		{math.MaxInt64 / 10, math.MaxInt64, 0.9, true},
	} {
		if got := NearLimit(tt.remaining, tt.limit, tt.fraction); got != tt.want {
			t.Errorf("NearLimit(%d, %d, %v) = %v, want %v", tt.remaining, tt.limit, tt.fraction, got, tt.want)
		}
	}
}
