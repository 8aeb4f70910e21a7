package lua

import (
	"strings"
	"testing"
)

// TestAssembly: the assembled scripts hold the shared helpers, every
// algorithm and their own entry point, in that order.
func TestAssembly(t *testing.T) {
	for name, src := range map[string]string{"Decide": Decide, "Refund": Refund} {
		last := -1
		for _, part := range []string{
			"local ALGORITHMS = {}",
			"ALGORITHMS.token_bucket = function()",
			"ALGORITHMS.gcra = function()",
			"ALGORITHMS.sliding_window = function()",
			"ALGORITHMS.fixed_window = function()",
			"ALGORITHMS.sliding_log = function()",
			"ALGORITHMS.concurrency = function()",
			"ALGORITHMS.calendar = function()",
			"ALGORITHMS.token_bucket_delay = with_delay(",
			"ALGORITHMS.gcra_delay = with_delay(",
		} {
			i := strings.Index(src, part)
			if i < 0 || i < last {
				t.Fatalf("%s: %q missing or out of order", name, part)
			}
			last = i
		}
	}
	if !strings.Contains(Decide, "-- decide.lua") || strings.Contains(Decide, "-- refund.lua") {
		t.Error("Decide does not end with decide.lua alone")
	}
	if !strings.Contains(Refund, "-- refund.lua") || strings.Contains(Refund, "-- decide.lua") {
		t.Error("Refund does not end with refund.lua alone")
	}
	if !strings.HasPrefix(Release, "-- release.lua") || strings.Contains(Release, "ALGORITHMS") {
		t.Error("Release is not release.lua alone")
	}
}
