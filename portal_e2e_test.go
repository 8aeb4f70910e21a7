package tollgate

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// portalSite serves the API behind rate_limit and the tenant's view of
// it at /limits (outside rate_limit: asking costs nothing).
const portalSite = `
	handle /limits {
		rate_limit_usage
	}
	handle {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			tier {http.request.header.X-Plan}
			policy pt_api {
				limit 10
				window 1h
				tier gold 100
				tenant_limit pt_carol 50
			}
		}
		respond "ok"
	}`

// portalView GETs /limits as tenant (with plan, when set) and decodes it.
func portalView(t *testing.T, s *caddyServer, path, tenant, plan string) (int, map[string]any) {
	t.Helper()
	headers := []string{"Accept", "application/json"}
	if tenant != "" {
		headers = append(headers, "X-Tenant", tenant)
	}
	if plan != "" {
		headers = append(headers, "X-Plan", plan)
	}
	r := s.get(path, headers...)
	var m map[string]any
	if err := json.Unmarshal([]byte(r.body), &m); err != nil {
		t.Fatalf("GET %s as %s: %d %q: %v", path, tenant, r.status, r.body, err)
	}
	return r.status, m
}

// portalPolicy is the policy name of the view.
func portalPolicy(t *testing.T, m map[string]any, name string) map[string]any {
	t.Helper()
	for _, p := range m["policies"].([]any) {
		if p := p.(map[string]any); p["policy"] == name {
			return p
		}
	}
	t.Fatalf("no policy %s in %v", name, m)
	return nil
}

// TestPortal: each tenant sees its own limits, where they come from, what
// is left and its history, and nothing of another tenant; no parameter
// names another tenant; a request without a tenant gets 401; the page
// has the same numbers.
func TestPortal(t *testing.T) {
	s := startCaddyAdmin(t, "", portalSite, nil)
	for _, tenant := range []string{"pt_alice", "pt_bob", "pt_carol", "pt_dave"} {
		s.adminOK("POST", "/rate_limit/reset?tenant="+tenant, "")
	}
	s.adminOK("PUT", "/rate_limit/overrides", `{"tenant":"pt_dave","policy":"pt_api","max_events":7}`)
	t.Cleanup(func() { s.adminCall("DELETE", "/rate_limit/overrides?tenant=pt_dave&policy=pt_api", "") })

	if c := s.statuses(12, "/", "X-Tenant", "pt_alice"); c[200] != 10 || c[429] != 2 {
		t.Fatalf("alice: %v", c)
	}
	if c := s.statuses(3, "/", "X-Tenant", "pt_bob", "X-Plan", "gold"); c[200] != 3 {
		t.Fatalf("bob: %v", c)
	}
	for _, tc := range []struct {
		tenant, plan, source, why string
		limit, remaining          float64
		near                      bool
		used, denied              float64
	}{
		{"pt_alice", "", "policy", "the default limit", 10, 0, true, 10, 2},
		{"pt_bob", "gold", "tier", "the limit of your plan (gold)", 100, 97, false, 3, 0},
		{"pt_carol", "", "tenant_limit", "a limit set for you in the configuration", 50, 50, false, 0, 0},
		{"pt_dave", "", "runtime_override", "a limit set for you by the operator", 7, 7, false, 0, 0},
	} {
		status, m := portalView(t, s, "/limits", tc.tenant, tc.plan)
		if status != http.StatusOK || m["tenant"] != tc.tenant {
			t.Fatalf("%s: %d %v", tc.tenant, status, m)
		}
		p := portalPolicy(t, m, "pt_api")
		if p["limit"] != tc.limit || p["source"] != tc.source || p["why"] != tc.why || p["remaining"] != tc.remaining || p["near_limit"] != tc.near {
			t.Errorf("%s: %v", tc.tenant, p)
		}
		var used, denied float64
		hist := p["history"].(map[string]any)
		if hist["resolution"] != "1m" || len(hist["points"].([]any)) != 60 {
			t.Errorf("%s: history %v", tc.tenant, hist)
		}
		for _, pt := range hist["points"].([]any) {
			used += pt.(map[string]any)["admitted"].(float64)
			denied += pt.(map[string]any)["denied"].(float64)
		}
		if used != tc.used || denied != tc.denied {
			t.Errorf("%s: history used %v denied %v, want %v and %v", tc.tenant, used, denied, tc.used, tc.denied)
		}
		// The admin API says the same.
		a := s.adminOK("GET", "/rate_limit/usage?tenant="+tc.tenant+"&tier="+tc.plan+"&range=1h", "")
		ap := adminPolicy(t, a, "pt_api")
		if ap["remaining"] != tc.remaining || ap["source"] != tc.source {
			t.Errorf("%s: admin %v", tc.tenant, ap)
		}
		if fmtJSON(ap["history"]) != fmtJSON(hist) {
			t.Errorf("%s: admin history differs:\n%v\n%v", tc.tenant, ap["history"], hist)
		}
	}
	// Another tenant's view is out of reach.
	if status, m := portalView(t, s, "/limits?tenant=pt_bob", "pt_alice", ""); status != http.StatusBadRequest {
		t.Errorf("?tenant=: %d %v", status, m)
	}
	if status, m := portalView(t, s, "/limits", "", ""); status != http.StatusUnauthorized {
		t.Errorf("no tenant: %d %v", status, m)
	}
	r := s.get("/limits", "X-Tenant", "pt_alice", "Accept", "text/html,application/xhtml+xml")
	if r.status != http.StatusOK || !strings.HasPrefix(r.header.Get("Content-Type"), "text/html") {
		t.Fatalf("page: %d %s", r.status, r.header.Get("Content-Type"))
	}
	for _, want := range []string{`id="tenant">pt_alice<`, `data-field="remaining">0<`, `data-field="used">10<`, `data-field="denied">2<`, "limit reached", `data-admitted="10"`, `<rect class="denied"`, "</html>"} {
		if !strings.Contains(r.body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(r.body, "pt_bob") {
		t.Error("alice's page names bob")
	}
	if cc := r.header.Get("Cache-Control"); cc != "private, max-age=5" {
		t.Errorf("Cache-Control %q", cc)
	}
	// The top tenants of the policy.
	top := s.adminOK("GET", "/rate_limit/top?policy=pt_api&range=1h", "")
	if got := fmtJSON(top["tenants"]); !strings.HasPrefix(got, `[{"admitted":10,"tenant":"pt_alice"},{"admitted":3,"tenant":"pt_bob"}`) {
		t.Errorf("top: %s", got)
	}
	// A range under an hour is the current hour: top counts whole hours.
	// (It was a 400 once the current minute was past the range.)
	for _, rng := range []string{"10m", "59m"} {
		top := s.adminOK("GET", "/rate_limit/top?policy=pt_api&range="+rng, "")
		if got := fmtJSON(top["tenants"]); !strings.HasPrefix(got, `[{"admitted":10,"tenant":"pt_alice"},{"admitted":3,"tenant":"pt_bob"}`) {
			t.Errorf("top, range %s: %s", rng, got)
		}
	}
}

func fmtJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
