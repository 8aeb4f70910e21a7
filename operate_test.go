package tollgate

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/internal/redistest"
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

// TestAdminPolicyNamesAndDurations: an unknown policy lists the valid
// names; windows and expiries are Caddy durations, as strings ("1d") or
// numbers of nanoseconds, as in the rest of Caddy's JSON.
func TestAdminPolicyNamesAndDurations(t *testing.T) {
	s := startCaddyAdmin(t, "", `
	rate_limit {
		tenant {http.request.header.X-Tenant}
		policy api {
			limit 10
			window 1m
		}
		policy search {
			limit 10
			window 1m
		}
	}
	respond "ok"`, nil)
	code, m := s.adminCall(http.MethodGet, "/rate_limit/policies?tenant=a&policy=nope", "")
	if code != http.StatusBadRequest || m["error"] != `unknown policy "nope" (policies: api, search)` {
		t.Errorf("unknown policy: %d %v", code, m)
	}
	code, m = s.adminCall(http.MethodPut, "/rate_limit/overrides", `{"tenant":"a","policy":"nope","max_events":1}`)
	if code != http.StatusBadRequest || !strings.Contains(fmt.Sprint(m["error"]), "(policies: api, search)") {
		t.Errorf("PUT unknown policy: %d %v", code, m)
	}
	for _, tc := range []struct{ window, want string }{
		{`"1d"`, "24h0m0s"},
		{`90000000000`, "1m30s"},
		{`"1h30m"`, "1h30m0s"},
	} {
		m := s.adminOK(http.MethodPut, "/rate_limit/overrides", `{"tenant":"a","policy":"api","max_events":5,"window":`+tc.window+`,"expires":"1d"}`)
		o := m["override"].(map[string]any)
		exp, err := time.Parse(time.RFC3339, fmt.Sprint(o["expires"]))
		if o["window"] != tc.want || err != nil || time.Until(exp) < 23*time.Hour {
			t.Errorf("window %s: override %v, want window %s expiring in a day", tc.window, o, tc.want)
		}
	}
	// POST is accepted as PUT (documented).
	s.adminOK(http.MethodPost, "/rate_limit/overrides", `{"tenant":"b","policy":"api","max_events":5}`)
}

// TestRedisLogsThroughCaddy: go-redis's own log lines go through Caddy's
// logger as JSON (logger "redis"), and the breaker's warning names the
// cause: connection refused when nothing listens, timeout when Redis
// stalls.
func TestRedisLogsThroughCaddy(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	globals := "\tlog {\n\t\toutput file " + logFile + "\n\t\tformat json\n\t}"
	down := freePort(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	s := startCaddy(t, globals, fmt.Sprintf(`
	route /down* {
		rate_limit {
			redis {
				address 127.0.0.1:%d
				breaker_failures 1
				key_prefix down
			}
			tenant {http.request.header.X-Tenant}
			policy api {
				limit 10
				window 1m
			}
		}
		respond "down"
	}
	route /stalled* {
		rate_limit {
			redis {
				address %s
				breaker_failures 1
				timeout 50ms
			}
			tenant {http.request.header.X-Tenant}
			policy api2 {
				limit 10
				window 1m
			}
		}
		respond "stalled"
	}`, down, srv.Addr), nil)
	gate.ClearRedisLogThrottle() // other tests' lines must not throttle this one's
	s.get("/down", "X-Tenant", "a")
	waitFor(t, func() bool {
		return countLogLines(t, logFile, `"logger":"http.handlers.rate_limit","msg":"rate limit store unreachable (connection refused)`) > 0
	})
	waitFor(t, func() bool { return countLogLines(t, logFile, `"logger":"redis"`) > 0 })
	s.get("/stalled", "X-Tenant", "a") // the script is loaded
	srv.Pause()
	defer srv.Resume()
	s.get("/stalled", "X-Tenant", "a")
	waitFor(t, func() bool {
		return countLogLines(t, logFile, `"msg":"rate limit store unreachable (timeout)`) > 0
	})
}

// TestDocMetricsListener: the documented Prometheus setup serves the
// metrics on a listener of its own, with the admin API on localhost only:
// the scrape sees Tollgate's families.
func TestDocMetricsListener(t *testing.T) {
	block := docBlockWith(t, ":9180 {", "metrics")
	metricsPort, sitePort, adminPort := freePort(t), freePort(t), freePort(t)
	src := strings.NewReplacer(
		"admin localhost:2019", fmt.Sprintf("admin 127.0.0.1:%d\n\tauto_https off\n\tpersist_config off", adminPort),
		":9180 {", fmt.Sprintf("http://127.0.0.1:%d {", metricsPort),
		"api.example.com {", fmt.Sprintf("http://127.0.0.1:%d {", sitePort),
	).Replace(block)
	caddyMu.Lock()
	defer caddyMu.Unlock()
	t.Cleanup(func() { _ = caddy.Stop() })
	if err := caddy.Load(adaptCaddyfile(t, src), true); err != nil {
		t.Fatalf("loading: %v\n%s", err, src)
	}
	waitListening(t, metricsPort)
	site := &caddyServer{t: t, port: sitePort, base: fmt.Sprintf("http://127.0.0.1:%d", sitePort)}
	site.get("/") // one decision, so the families have samples
	m := scrapeMetrics(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
	if _, ok := m.families["caddy_rate_limit_requests_total"]; !ok {
		t.Errorf("no caddy_rate_limit_requests_total on the metrics listener")
	}
}
