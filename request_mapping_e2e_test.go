package tollgate

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestE2ENetworkPrefix: a zone keyed on the client IP, with
// ipv4_prefix/ipv6_prefix, groups addresses by network (caddy-ratelimit's
// meaning). Client IPs come from X-Forwarded-For via trusted_proxies.
func TestE2ENetworkPrefix(t *testing.T) {
	s := startCaddy(t, `	log {
		output discard
	}
	servers {
		trusted_proxies static 127.0.0.1/32
	}`, `
	rate_limit {
		zone per_network {
			key {client_ip}
			events 2
			window 1h
			ipv4_prefix 24
			ipv6_prefix 64
		}
	}
	respond "ok"`, nil)
	cases := []struct {
		ips      []string
		admitted int
	}{
		{[]string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}, 2},           // one /24
		{[]string{"10.0.1.1"}, 1},                                   // another /24
		{[]string{"2001:db8::1", "2001:db8::2", "2001:db8::ff"}, 2}, // one /64
		{[]string{"2001:db8:0:1::1"}, 1},                            // another /64
	}
	for _, c := range cases {
		got := 0
		for _, ip := range c.ips {
			if s.get("/", "X-Forwarded-For", ip).status == 200 {
				got++
			}
		}
		if got != c.admitted {
			t.Errorf("%v: admitted %d, want %d", c.ips, got, c.admitted)
		}
	}
}

// TestE2ECostPlaceholder: cost from a placeholder takes that many units;
// a value that is not a non-negative integer costs 1.
func TestE2ECostPlaceholder(t *testing.T) {
	s := startCaddy(t, "", `
	rate_limit {
		tenant {http.request.header.X-Tenant}
		policy units {
			algorithm fixed_window
			limit 10
			window 1h
			cost {http.request.header.X-Cost}
		}
	}
	respond "ok"`, nil)
	steps := []struct {
		cost      string
		status    int
		remaining string
	}{
		{"4", 200, "6"},
		{"", 200, "5"},       // missing: 1
		{"-3", 200, "4"},     // invalid: 1
		{"{evil}", 200, "3"}, // invalid: 1
		{"5", 429, "3"},      // does not fit, charges nothing
		{"0", 200, "3"},      // free
		{"3", 200, "0"},
	}
	for i, st := range steps {
		r := s.get("/", "X-Tenant", "acme", "X-Cost", st.cost)
		if r.status != st.status || r.header.Get("X-RateLimit-Remaining") != st.remaining {
			t.Errorf("step %d cost %q: status %d remaining %q, want %d %q", i, st.cost, r.status,
				r.header.Get("X-RateLimit-Remaining"), st.status, st.remaining)
		}
	}
}

// TestE2EHostileTenantLogs: a huge tenant with control bytes produces
// bounded, well-formed JSON log lines.
func TestE2EHostileTenantLogs(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	s := startCaddy(t, fmt.Sprintf(`	log {
		output file %s
		format json
		level DEBUG
	}`, logFile), `
	rate_limit {
		tenant {http.request.header.X-Tenant}
		log_key
		policy api {
			key {http.request.uri.path}
			limit 1
			window 1h
		}
	}
	respond "ok"`, nil)
	// Go's client refuses control bytes in header values (and Go's server
	// answers 400 to them), so they come in through the decoded path.
	tenant := strings.Repeat("T", 8000) + "{}:%"
	path := "/KKK" + strings.Repeat("K", 4000) + "%01%0A%00%7F"
	for range 3 {
		s.get(path, "X-Tenant", tenant)
	}
	time.Sleep(200 * time.Millisecond)
	denials := 0
	for _, l := range readJSONLines(t, logFile) {
		var entry map[string]any
		if err := json.Unmarshal(l, &entry); err != nil {
			t.Fatalf("log line is not JSON: %v", err)
		}
		if entry["msg"] != "rate limit exceeded" {
			continue
		}
		denials++
		if len(l) > 1024 {
			t.Errorf("denial log line is %d bytes, want it bounded", len(l))
		}
		if tn, _ := entry["tenant"].(string); !strings.HasSuffix(tn, "bytes)") || len(tn) > 200 {
			t.Errorf("tenant field not cut: %.80q", tn)
		}
		if k, _ := entry["key"].(string); !strings.HasPrefix(k, "/KKK") || len(k) > 200 {
			t.Errorf("key field missing or not cut (log_key): %.80q", k)
		}
	}
	if denials != 2 {
		t.Errorf("%d denial log lines, want 2", denials)
	}
}

// TestE2ETierShadow: `shadow` on a tier makes only that tier's tenants
// shadow; other tenants of the policy are enforced.
func TestE2ETierShadow(t *testing.T) {
	s := startCaddy(t, "", `
	rate_limit {
		tenant {http.request.header.X-Tenant}
		tier {http.request.header.X-Plan}
		policy api {
			limit 2
			window 1h
			tier trial 1 shadow
		}
	}
	respond "ok {http.rate_limit.shadow_denied}"`, nil)
	for i := range 4 {
		r := s.get("/", "X-Tenant", "newbie", "X-Plan", "trial")
		want := "ok "
		if i >= 1 {
			want = "ok api"
		}
		if r.status != 200 || r.body != want {
			t.Errorf("trial request %d: %d %q, want 200 %q", i+1, r.status, r.body, want)
		}
	}
	if c := s.statuses(4, "/", "X-Tenant", "payer", "X-Plan", "pro"); c[200] != 2 || c[429] != 2 {
		t.Errorf("non-trial tenant: %v, want 2 x 200 and 2 x 429 (enforced)", c)
	}
}
