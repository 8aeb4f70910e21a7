package tollgate

import (
	"path/filepath"
	"strings"
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

// TestDistributedStorageWarnings: caddy-ratelimit's distributed and
// storage are accepted, and each handler that sets either logs one WARN
// naming the redis block as what supersedes them: ignored beside one,
// caddy-ratelimit's approximate sync without one (distributed), unused
// without distributed (storage).
func TestDistributedStorageWarnings(t *testing.T) {
	const (
		ignored = `"msg":"distributed and storage are superseded by the redis block, which shares limits exactly across the fleet: they are ignored"`
		syncs   = `"msg":"distributed syncs limits through storage as caddy-ratelimit does, approximately (a fleet can admit more than a zone's events in a window); a redis block supersedes it with exact fleet-wide limits"`
		unused  = `"msg":"storage is used only by distributed: it is ignored; a redis block supersedes both with exact fleet-wide limits"`
	)
	storage := "storage file_system " + t.TempDir()
	for _, tc := range []struct {
		name, settings, want, field string
	}{
		{"redis and distributed", "redis 127.0.0.1:1\n\t\t\tdistributed", ignored, `,"ignored":["distributed"]`},
		{"redis and storage", "redis 127.0.0.1:1\n\t\t\t" + storage, ignored, `,"ignored":["storage"]`},
		{"redis, distributed and storage", "redis 127.0.0.1:1\n\t\t\tdistributed\n\t\t\t" + storage, ignored, `,"ignored":["distributed","storage"]`},
		{"distributed without redis", "distributed\n\t\t\t" + storage, syncs, ""},
		{"storage without distributed", storage, unused, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			globals := "\tlog {\n\t\toutput file " + logFile + "\n\t\tformat json\n\t}"
			startCaddy(t, globals, `
	rate_limit {
			`+tc.settings+`
			zone dist_warn {
				key static
				events 5
				window 1m
			}
	}
	respond "ok"`, nil)
			if n := countLogLines(t, logFile, tc.want+tc.field); n != 1 {
				t.Errorf("%d log lines with %s%s, want 1", n, tc.want, tc.field)
			}
			// That one line is the only warning about them.
			n := 0
			for _, l := range readJSONLines(t, logFile) {
				s := string(l)
				if strings.Contains(s, `"level":"warn"`) && (strings.Contains(s, "distributed") || strings.Contains(s, "storage")) {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%d warnings about distributed or storage, want 1", n)
			}
		})
	}
}
