package tollgate

import (
	"path/filepath"
	"testing"
)

// TestConfigWarnings: configurations that run but are almost certainly
// not what was meant are logged as warnings when the config loads.
func TestConfigWarnings(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	globals := "\tlog {\n\t\toutput file " + logFile + "\n\t\tformat json\n\t}"
	startCaddy(t, globals, `
	route /a* {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			tenant_tier acme gold
			lease 10
			policy shared_name {
				limit 5
				window 1m
				tier silver 10
			}
			policy inflight {
				algorithm concurrency
				limit 5
				window 1m
			}
		}
		respond "a"
	}
	route /b* {
		rate_limit {
			policy shared_name {
				limit 5
				window 1m
			}
		}
		respond "b"
	}
	route /c* {
		rate_limit {
			redis 127.0.0.1:1
			max_memory 64MiB
			policy c_only {
				limit 5
				window 1m
			}
		}
		respond "c"
	}`, nil)
	for _, want := range []string{
		`"msg":"tenant_tier names a tier that no policy defines: the tenant gets each policy's own limit","tenant":"acme","tier":"gold"`,
		`"msg":"lease is ignored on the embedded store`,
		`"msg":"window is ignored by the concurrency algorithm (it limits requests in flight)","policy":"inflight"`,
		`"msg":"max_memory and sweep_interval size the embedded store: they are ignored with a redis block"`,
		`"msg":"policy name defined by more than one rate_limit handler: they share its buckets (policies are named buckets); give distinct budgets distinct names","policy":"shared_name"`,
	} {
		if n := countLogLines(t, logFile, want); n != 1 {
			t.Errorf("%d log lines with %s, want 1", n, want)
		}
	}
	// A reload of the same config is a new generation: the shared name is
	// reported once for it, not against the unloaded handlers.
}
