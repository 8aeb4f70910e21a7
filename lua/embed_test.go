package lua

import (
	"strings"
	"testing"
)

// TestAssembly: the assembled scripts hold the shared helpers, every
// algorithm and their own entry point, in that order.
func TestAssembly(t *testing.T) {
	for name, src := range map[string]string{"Decide": Decide, "Lease": Lease} {
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
	if !strings.Contains(Decide, "-- decide.lua") || strings.Contains(Decide, "-- lease.lua") {
		t.Error("Decide does not end with decide.lua alone")
	}
	// The scripts that touch held slots share held.lua; keep.lua takes
	// its clock from common.lua.
	for name, c := range map[string]struct{ got, want string }{
		"Release": {Release, held + release},
		"Keep":    {Keep, common + held + keep},
		"Reset":   {Reset, held + reset},
	} {
		if c.got != c.want {
			t.Errorf("%s is not assembled as its comment in embed.go says", name)
		}
	}
}

// TestLibrary: the function library holds every algorithm once and one
// function per entry point, each running its entry point's source.
func TestLibrary(t *testing.T) {
	if !strings.HasPrefix(Library, "#!lua name="+LibraryName+"\n") {
		t.Fatalf("library header: %q", Library[:40])
	}
	if n := strings.Count(Library, "local ALGORITHMS = {}"); n != 1 {
		t.Errorf("%d copies of common.lua, want 1", n)
	}
	if n := strings.Count(Library, "local function held_index("); n != 1 {
		t.Errorf("%d copies of held.lua, want 1", n)
	}
	for _, e := range []struct{ name, body string }{{"decide", decide}, {"lease", lease}, {"release", release}, {"keep", keep}, {"reset", reset}, {"heartbeat", heartbeat}} {
		reg := "redis.register_function('" + Function(e.name) + "', function(keys, args)\nKEYS, ARGV = keys, args\n" + e.body + "\nend)"
		if !strings.Contains(Library, reg) {
			t.Errorf("no function %s running %s.lua", Function(e.name), e.name)
		}
	}
}
