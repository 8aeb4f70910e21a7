package tollgate

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

const nearLimitBody = `
			tenant {http.request.header.X-Tenant}
			tier {http.request.header.X-Plan}
			metrics_tenants 5
			policy nl_api {
				limit 10
				window 1h
				tier pro 100
			}
			policy nl_half {
				match {
					path /half*
				}
				algorithm token_bucket
				limit 2
				burst 4
				window 1h
				near_limit 0.5
			}
			policy nl_shadow {
				match {
					path /shadow*
				}
				calendar month
				limit 3
				shadow
			}`

// TestNearLimitEndToEnd: admitted requests that leave less than
// (1 - near_limit) of the limit are counted per policy and per tenant and
// listed by the admin API, newest first, with the quota left; denied
// requests, and tenants above the threshold, are not.
func TestNearLimitEndToEnd(t *testing.T) {
	s := startCaddyAdmin(t, "", metricsSite(nearLimitBody), nil)
	before := scrapeMetrics(t, s.base+"/metrics")
	send := func(path, tenant string, n int, more ...string) {
		t.Helper()
		s.statuses(n, path, append([]string{"X-Tenant", tenant}, more...)...)
	}
	send("/", "nl-acme", 12)                 // 10 admitted: the 9th and 10th leave 1 and 0
	send("/", "nl-beta", 8)                  // 2 left: not less than 20%
	send("/", "nl-pro", 82, "X-Plan", "pro") // 19 then 18 left of 100: near twice
	send("/half", "nl-half", 4)              // burst 4: 3, 2, 1, 0 left; near below 1 (half the limit, not the burst)
	send("/shadow", "nl-shadow", 5)          // shadow: 3 charged, 2 left after the 1st
	m := scrapeMetrics(t, s.base+"/metrics")
	for _, w := range []struct {
		policy string
		n      float64
	}{{"nl_api", 4}, {"nl_half", 1}, {"nl_shadow", 1}} {
		if got := m.delta(before, "caddy_rate_limit_near_limit_total", "policy", w.policy); got != w.n {
			t.Errorf("near_limit_total{policy=%q} grew by %v, want %v", w.policy, got, w.n)
		}
	}
	const tenantFamily = "caddy_rate_limit_tenant_near_limit_total"
	if got := m.delta(before, tenantFamily, "policy", "nl_api", "tenant", "nl-acme"); got != 2 {
		t.Errorf("nl-acme near %v, want 2", got)
	}
	if got := m.labelValues(tenantFamily, "tenant", "policy", "nl_api"); !slices.Equal(got, []string{"nl-acme", "nl-pro"}) {
		t.Errorf("tenants with near-limit series: %v, want [nl-acme nl-pro]", got)
	}

	// The admin API, newest first.
	res := s.adminOK("GET", "/rate_limit/near_limit?policy=nl_api", "")
	got := res["tenants"].([]any)
	if len(got) != 2 {
		t.Fatalf("near_limit: %v", res)
	}
	pro, acme := got[0].(map[string]any), got[1].(map[string]any)
	if pro["tenant"] != "nl-pro" || pro["remaining"] != 18.0 || pro["limit"] != 100.0 || pro["near_limit"] != 0.8 ||
		acme["tenant"] != "nl-acme" || acme["remaining"] != 0.0 || acme["limit"] != 10.0 || res["policy"] != "nl_api" {
		t.Fatalf("near_limit: %v", res)
	}
	at, err := time.Parse(time.RFC3339Nano, acme["at"].(string))
	if err != nil || time.Since(at) > time.Minute {
		t.Fatalf("at %v: %v", acme["at"], err)
	}
	if reset, err := time.Parse(time.RFC3339, acme["reset_at"].(string)); err != nil || !reset.After(at) {
		t.Fatalf("reset_at %v: %v", acme["reset_at"], err)
	}
	// Listed against the limit the rule measures, not the burst.
	half := s.adminOK("GET", "/rate_limit/near_limit?policy=nl_half", "")["tenants"].([]any)
	if len(half) != 1 || half[0].(map[string]any)["limit"] != 2.0 {
		t.Errorf("nl_half (limit 2, burst 4): %v, want one entry with limit 2", half)
	}
	all := s.adminOK("GET", "/rate_limit/near_limit", "")["tenants"].([]any)
	if len(all) != 4 || all[0].(map[string]any)["policy"] != "nl_shadow" {
		t.Fatalf("every policy: %v", all)
	}
	if one := s.adminOK("GET", "/rate_limit/near_limit?count=1", "")["tenants"].([]any); len(one) != 1 {
		t.Fatalf("count=1: %v", one)
	}
	for _, q := range []string{"?count=0", "?count=1001", "?count=x", "?policy=nope"} {
		if code, m := s.adminCall("GET", "/rate_limit/near_limit"+q, ""); code != http.StatusBadRequest || m["error"] == nil {
			t.Errorf("%s: %d %v, want 400", q, code, m)
		}
	}
	if code, _ := s.adminCall("POST", "/rate_limit/near_limit", ""); code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", code)
	}
}

// TestNearLimitFleetWide: two Caddy processes on one Redis; a tenant near
// its limit on one is listed by the other's admin API within a few
// seconds (one publication), with the instance that saw it.
func TestNearLimitFleetWide(t *testing.T) {
	redistest.RequireBinaries(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	cfg := `{
	admin 127.0.0.1:{ADMIN}
	auto_https off
	log {
		output discard
	}
}

http://127.0.0.1:{PORT} {
	rate_limit {
		redis ` + srv.Addr + `
		tenant {http.request.header.X-Tenant}
		policy nl_fleet {
			calendar day Europe/Berlin
			limit 10
		}
	}
	respond "ok"
}
`
	a, b := startCaddyProcess(t, cfg), startCaddyProcess(t, cfg)
	for _, p := range []*caddyProcess{a, b} {
		p.caddyServer.admin = fmt.Sprintf("127.0.0.1:%d", p.admin)
		waitListening(t, p.admin)
	}
	if c := a.statuses(9, "/", "X-Tenant", "fleet-acme"); c[200] != 9 {
		t.Fatal(c)
	}
	start := time.Now()
	var entry map[string]any
	waitFor(t, func() bool {
		es := b.adminOK("GET", "/rate_limit/near_limit?policy=nl_fleet", "")["tenants"].([]any)
		if len(es) == 1 {
			entry = es[0].(map[string]any)
		}
		return entry != nil
	})
	t.Logf("listed by the other instance after %s", time.Since(start).Round(10*time.Millisecond))
	if entry["tenant"] != "fleet-acme" || entry["remaining"] != 1.0 || entry["limit"] != 10.0 || entry["instance"] == "" {
		t.Fatalf("entry %v", entry)
	}
	// b's own later sighting wins over a's.
	b.get("/", "X-Tenant", "fleet-acme")
	es := b.adminOK("GET", "/rate_limit/near_limit?policy=nl_fleet", "")["tenants"].([]any)
	if e := es[0].(map[string]any); len(es) != 1 || e["remaining"] != 0.0 || e["instance"] == entry["instance"] {
		t.Fatalf("after b's request: %v", es)
	}
	keys := srv.CLI(t, "KEYS", "rl:near*")
	if !strings.Contains(keys, "rl:near-index") || !strings.Contains(keys, "rl:near:") {
		t.Fatalf("keys %q", keys)
	}
}
