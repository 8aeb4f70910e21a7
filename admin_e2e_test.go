package tollgate

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// adminCall sends method path (with an optional JSON body) to the admin
// endpoint of s and returns the status and the decoded JSON body.
func (s *caddyServer) adminCall(method, path, body string) (int, map[string]any) {
	s.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, "http://"+s.admin+path, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := testClient.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		s.t.Fatalf("%s %s: %d, body not a JSON object: %v\n%s", method, path, res.StatusCode, err, raw)
	}
	return res.StatusCode, m
}

func (s *caddyServer) adminOK(method, path, body string) map[string]any {
	s.t.Helper()
	code, m := s.adminCall(method, path, body)
	if code != http.StatusOK {
		s.t.Fatalf("%s %s: status %d, want 200: %v", method, path, code, m)
	}
	return m
}

// adminPolicy returns the entry of policy in a policies/usage answer.
func adminPolicy(t *testing.T, m map[string]any, policy string) map[string]any {
	t.Helper()
	for _, p := range m["policies"].([]any) {
		if pm := p.(map[string]any); pm["policy"] == policy {
			return pm
		}
	}
	t.Fatalf("policy %s not in %v", policy, m)
	return nil
}

const adminSite = `
	rate_limit {
		tenant {http.request.header.X-Tenant}
		tier {http.request.header.X-Plan}
		tenant_tier goldco gold%s
		policy api {
			limit 3
			window 1m
			tier gold 5
			override vip 7
		}
		policy login {
			match {
				path /login
			}
			algorithm token_bucket
			limit 2
			window 1m
		}
	}
	respond "ok"`

func TestAdminRoutes(t *testing.T) {
	s := startCaddyAdmin(t, "", fmt.Sprintf(adminSite, ""), nil)

	t.Run("status", func(t *testing.T) {
		m := s.adminOK("GET", "/rate_limit/status", "")
		hs := m["handlers"].([]any)
		if len(hs) != 1 {
			t.Fatalf("handlers: %v", hs)
		}
		h := hs[0].(map[string]any)
		if h["store"] != "memory" || h["healthy"] != true || h["breaker_open"] != false || h["live_instances"] != 1.0 {
			t.Fatalf("status: %v", h)
		}
		ps := h["policies"].([]any)
		if len(ps) != 2 || ps[0].(map[string]any)["name"] != "api" || ps[0].(map[string]any)["algorithm"] != "sliding_window" {
			t.Fatalf("policies: %v", ps)
		}
	})

	t.Run("policies", func(t *testing.T) {
		m := s.adminOK("GET", "/rate_limit/policies?tenant=plain", "")
		if p := adminPolicy(t, m, "api"); p["limit"] != 3.0 || p["window"] != "1m0s" || p["source"] != "policy" || p["fail_mode"] == nil {
			t.Fatalf("plain: %v", p)
		}
		if m["note"] == nil {
			t.Fatalf("no note about the tier placeholder: %v", m)
		}
		m = s.adminOK("GET", "/rate_limit/policies?tenant=goldco", "")
		if p := adminPolicy(t, m, "api"); p["limit"] != 5.0 || p["source"] != "tier" || m["tier"] != "gold" {
			t.Fatalf("goldco: %v", m)
		}
		m = s.adminOK("GET", "/rate_limit/policies?tenant=x&tier=gold", "")
		if p := adminPolicy(t, m, "api"); p["limit"] != 5.0 || p["source"] != "tier" {
			t.Fatalf("tier query: %v", m)
		}
		m = s.adminOK("GET", "/rate_limit/policies?tenant=vip&policy=api", "")
		if p := adminPolicy(t, m, "api"); p["limit"] != 7.0 || p["source"] != "tenant_limit" || len(m["policies"].([]any)) != 1 {
			t.Fatalf("vip: %v", m)
		}
		if p := adminPolicy(t, s.adminOK("GET", "/rate_limit/policies?tenant=vip", ""), "login"); p["algorithm"] != "token_bucket" {
			t.Fatalf("login: %v", p)
		}
	})

	t.Run("usage_does_not_charge", func(t *testing.T) {
		for range 2 {
			m := s.adminOK("GET", "/rate_limit/usage?tenant=u1", "")
			if p := adminPolicy(t, m, "api"); p["limit"] != 3.0 || p["remaining"] != 3.0 {
				t.Fatalf("usage: %v", p)
			}
		}
		if c := s.statuses(1, "/", "X-Tenant", "u1"); c[200] != 1 {
			t.Fatal(c)
		}
		m := s.adminOK("GET", "/rate_limit/usage?tenant=u1&policy=api", "")
		if p := adminPolicy(t, m, "api"); p["remaining"] != 2.0 || p["reset"].(float64) <= 0 {
			t.Fatalf("after one request: %v", p)
		}
		if c := s.statuses(3, "/", "X-Tenant", "u1"); c[200] != 2 || c[429] != 1 {
			t.Fatalf("the full budget after usage reads: %v", c)
		}
		m = s.adminOK("GET", "/rate_limit/usage?tenant=u1&policy=api", "")
		if p := adminPolicy(t, m, "api"); p["remaining"] != 0.0 {
			t.Fatalf("exhausted: %v", p)
		}
	})

	t.Run("reset", func(t *testing.T) {
		if c := s.statuses(4, "/", "X-Tenant", "r1"); c[429] != 1 {
			t.Fatal(c)
		}
		m := s.adminOK("POST", "/rate_limit/reset?tenant=r1&policy=api", "")
		if m["reset"] != true {
			t.Fatal(m)
		}
		if c := s.statuses(3, "/", "X-Tenant", "r1"); c[200] != 3 {
			t.Fatalf("after reset: %v", c)
		}
		s.statuses(1, "/", "X-Tenant", "r1")
		s.adminOK("POST", "/rate_limit/reset?tenant=r1", "")
		if c := s.statuses(3, "/", "X-Tenant", "r1"); c[200] != 3 {
			t.Fatalf("after reset of every policy: %v", c)
		}
	})

	t.Run("reload", func(t *testing.T) {
		// The registry follows reloads: the old handler is gone, the new
		// one serves, counters and overrides carry over.
		s.adminOK("PUT", "/rate_limit/overrides", `{"tenant":"reloaded","policy":"api","max_events":1}`)
		for range 3 {
			s.load("", fmt.Sprintf(adminSite, ""), nil)
		}
		hs := s.adminOK("GET", "/rate_limit/status", "")["handlers"].([]any)
		if len(hs) != 1 {
			t.Fatalf("handlers after reloads: %v", hs)
		}
		if c := s.statuses(2, "/", "X-Tenant", "reloaded"); c[200] != 1 || c[429] != 1 {
			t.Fatalf("override after reloads: %v", c)
		}
		s.adminOK("DELETE", "/rate_limit/overrides?tenant=reloaded&policy=api", "")
	})

	t.Run("errors", func(t *testing.T) {
		cases := []struct {
			method, path string
			code         int
		}{
			{"GET", "/rate_limit/policies", 400},
			{"GET", "/rate_limit/usage", 400},
			{"POST", "/rate_limit/reset", 400},
			{"GET", "/rate_limit/policies?tenant=a&policy=nope", 400},
			{"GET", "/rate_limit/usage?tenant=a&policy=nope", 400},
			{"POST", "/rate_limit/reset?tenant=a&policy=nope", 400},
			{"POST", "/rate_limit/status", 405},
			{"POST", "/rate_limit/policies?tenant=a", 405},
			{"DELETE", "/rate_limit/usage?tenant=a", 405},
			{"GET", "/rate_limit/reset?tenant=a", 405},
			{"PATCH", "/rate_limit/overrides", 405},
			{"GET", "/rate_limit/nope", 404},
		}
		for _, c := range cases {
			code, m := s.adminCall(c.method, c.path, "")
			if code != c.code || m["error"] == nil {
				t.Errorf("%s %s: %d %v, want %d with an error message", c.method, c.path, code, m, c.code)
			}
		}
	})
}

// testOverrides runs the runtime override checks against s, whose policy
// api allows 3 per minute.
func testOverrides(t *testing.T, s *caddyServer, tenant string) {
	s.adminOK("PUT", "/rate_limit/overrides", `{"tenant":"`+tenant+`","policy":"api","max_events":1,"window":"1m"}`)
	m := s.adminOK("GET", "/rate_limit/policies?tenant="+tenant, "")
	if p := adminPolicy(t, m, "api"); p["source"] != "runtime_override" || p["limit"] != 1.0 {
		t.Fatalf("after PUT: %v", p)
	}
	if c := s.statuses(2, "/", "X-Tenant", tenant); c[200] != 1 || c[429] != 1 {
		t.Fatalf("override of 1: %v", c)
	}
	m = s.adminOK("GET", "/rate_limit/overrides?tenant="+tenant, "")
	ovs := m["overrides"].([]any)
	if len(ovs) != 1 || ovs[0].(map[string]any)["max_events"] != 1.0 || ovs[0].(map[string]any)["window"] != "1m0s" {
		t.Fatalf("GET overrides: %v", m)
	}
	// Replace it: the previous value comes back.
	m = s.adminOK("PUT", "/rate_limit/overrides", `{"tenant":"`+tenant+`","policy":"api","unlimited":true,"expires":"1h"}`)
	if m["previous"] == nil {
		t.Fatalf("no previous value: %v", m)
	}
	if c := s.statuses(10, "/", "X-Tenant", tenant); c[200] != 10 {
		t.Fatalf("unlimited override: %v", c)
	}
	s.adminOK("DELETE", "/rate_limit/overrides?tenant="+tenant+"&policy=api", "")
	if p := adminPolicy(t, s.adminOK("GET", "/rate_limit/policies?tenant="+tenant, ""), "api"); p["source"] != "policy" {
		t.Fatalf("after DELETE: %v", p)
	}
	s.adminOK("POST", "/rate_limit/reset?tenant="+tenant, "")
	if c := s.statuses(4, "/", "X-Tenant", tenant); c[200] != 3 || c[429] != 1 {
		t.Fatalf("policy limit restored: %v", c)
	}
	// Expiry.
	s.adminOK("PUT", "/rate_limit/overrides", `{"tenant":"`+tenant+`-exp","policy":"api","max_events":9,"expires":"300ms"}`)
	if p := adminPolicy(t, s.adminOK("GET", "/rate_limit/policies?tenant="+tenant+"-exp", ""), "api"); p["source"] != "runtime_override" {
		t.Fatalf("before expiry: %v", p)
	}
	time.Sleep(400 * time.Millisecond)
	if p := adminPolicy(t, s.adminOK("GET", "/rate_limit/policies?tenant="+tenant+"-exp", ""), "api"); p["source"] != "policy" {
		t.Fatalf("after expiry: %v", p)
	}

	bad := []struct {
		method, body string
		code         int
	}{
		{"PUT", `{"tenant":"a","policy":"api","max_events":-1}`, 400},
		{"PUT", `{"tenant":"a","policy":"api","max_events":1,"window":"soon"}`, 400},
		{"PUT", `{"tenant":"a","policy":"api","max_events":1,"burst":-2}`, 400},
		{"PUT", `{"tenant":"a","policy":"api","max_events":1,"burst":2}`, 400}, // burst on sliding_window
		{"PUT", `{"tenant":"a","policy":"api","max_events":1,"expires":"yesterday"}`, 400},
		{"PUT", `{"tenant":"a","policy":"nope","max_events":1}`, 400},
		{"PUT", `{"tenant":"a","policy":"api"}`, 400},
		{"PUT", `{"tenant":"a"`, 400},
		{"PUT", `{"tenant":"a","policy":"api","max_events":1,"color":"red"}`, 400},
		{"DELETE", `{"tenant":"never","policy":"api"}`, 404},
		{"DELETE", `{"tenant":"a","policy":"nope"}`, 400},
		{"DELETE", `{"tenant":"a"}`, 400},
	}
	for _, c := range bad {
		code, m := s.adminCall(c.method, "/rate_limit/overrides", c.body)
		if code != c.code || m["error"] == nil {
			t.Errorf("%s %s: %d %v, want %d", c.method, c.body, code, m, c.code)
		}
	}
}

// TestAdminStatusHealth: on a real redis-server, /rate_limit/status says
// healthy while Redis answers, not healthy once the breaker has opened
// (Redis paused), and healthy again once the breaker's probe finds Redis
// back, with no request.
func TestAdminStatusHealth(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	s := startCaddyAdmin(t, "", fmt.Sprintf(adminSite, "\n\t\tredis {\n\t\t\taddress "+srv.Addr+
		"\n\t\t\ttimeout 100ms\n\t\t\tbreaker_failures 2\n\t\t\tbreaker_cooldown 1s\n\t\t}"), nil)
	health := func() (healthy, open any) {
		t.Helper()
		h := s.adminOK("GET", "/rate_limit/status", "")["handlers"].([]any)[0].(map[string]any)
		return h["healthy"], h["breaker_open"]
	}
	if r := s.get("/", "X-Tenant", "h1"); r.status != http.StatusOK {
		t.Fatalf("Redis up: status %d", r.status)
	}
	if healthy, open := health(); healthy != true || open != false {
		t.Fatalf("Redis up: healthy %v, breaker_open %v; want true, false", healthy, open)
	}
	srv.Pause()
	defer srv.Resume()
	// One failed call leaves the breaker closed: still healthy.
	s.get("/", "X-Tenant", "h1")
	if healthy, open := health(); healthy != true || open != false {
		t.Fatalf("after one failure: healthy %v, breaker_open %v; want true, false", healthy, open)
	}
	s.get("/", "X-Tenant", "h1")
	if healthy, open := health(); healthy != false || open != true {
		t.Fatalf("breaker open: healthy %v, breaker_open %v; want false, true", healthy, open)
	}
	srv.Resume()
	waitFor(t, func() bool { healthy, _ := health(); return healthy == true })
	if _, open := health(); open != false {
		t.Fatalf("healthy again with the breaker open")
	}
}

func TestAdminOverridesEmbedded(t *testing.T) {
	s := startCaddyAdmin(t, "", fmt.Sprintf(adminSite, ""), nil)
	testOverrides(t, s, "ovr-mem")
}

func TestAdminOverridesRedis(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	s := startCaddyAdmin(t, "", fmt.Sprintf(adminSite, "\n\t\tredis {\n\t\t\taddress "+srv.Addr+"\n\t\t}"), nil)
	m := s.adminOK("GET", "/rate_limit/status", "")
	if h := m["handlers"].([]any)[0].(map[string]any); h["store"] != "redis" || h["key_prefix"] != "rl" {
		t.Fatalf("status: %v", h)
	}
	// Usage on Redis does not charge either.
	for range 2 {
		if p := adminPolicy(t, s.adminOK("GET", "/rate_limit/usage?tenant=ru", ""), "api"); p["remaining"] != 3.0 {
			t.Fatalf("usage: %v", p)
		}
	}
	if c := s.statuses(4, "/", "X-Tenant", "ru"); c[200] != 3 || c[429] != 1 {
		t.Fatal(c)
	}

	// An override written by another instance (straight into Redis, as
	// the admin API writes it: hash, index, version, message) is picked
	// up within a second.
	c := srv.Client(t)
	ctx := context.Background()
	writeOverrideLikeAdmin(t, c, "ext", "api", `{"tenant":"ext","policy":"api","max_events":1}`)
	c.Publish(ctx, "rl:events", "ext")
	waitFor(t, func() bool {
		return adminPolicy(t, s.adminOK("GET", "/rate_limit/policies?tenant=ext", ""), "api")["source"] == "runtime_override"
	})

	testOverrides(t, s, "ovr-redis")
	if v, err := c.HGet(ctx, "rl:ovr:{ovr-redis}", "api").Result(); err == nil {
		t.Fatalf("deleted override still in Redis: %s", v)
	}
	entries, err := c.XRange(ctx, "rl:audit", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, e := range entries {
		if e.Values["tenant"] == "ovr-redis" {
			actions = append(actions, e.Values["action"].(string))
			if e.Values["remote"] == "" || e.Values["ts"] == "" {
				t.Errorf("audit entry lacks remote or ts: %v", e.Values)
			}
		}
	}
	// set, replace, delete, and the reset of the tenant (audited too).
	if strings.Join(actions, ",") != "set,set,delete,reset" {
		t.Fatalf("audit actions: %v", actions)
	}

	// Redis down: changes fail with 503, status still answers.
	srv.Stop()
	if code, m := s.adminCall("PUT", "/rate_limit/overrides", `{"tenant":"down","policy":"api","max_events":1}`); code != http.StatusServiceUnavailable || m["error"] == nil {
		t.Fatalf("PUT with Redis down: %d %v", code, m)
	}
	s.adminOK("GET", "/rate_limit/status", "")
}

// TestFleetOverridePropagation: two Caddy processes on one Redis; an
// override PUT on A is enforced by B within a second, and DELETE on A
// restores the policy limit on B.
func TestFleetOverridePropagation(t *testing.T) {
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
		redis {
			address ` + srv.Addr + `
		}
		tenant {http.request.header.X-Tenant}
		policy api {
			limit 100
			window 1h
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
	source := func(p *caddyProcess) any {
		return adminPolicy(t, p.adminOK("GET", "/rate_limit/policies?tenant=fleet", ""), "api")["source"]
	}
	within := func(what string, cond func() bool) {
		t.Helper()
		start := time.Now()
		for !cond() {
			if time.Since(start) > time.Second {
				t.Fatalf("%s: not within 1s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Logf("%s after %s", what, time.Since(start))
	}
	a.adminOK("PUT", "/rate_limit/overrides", `{"tenant":"fleet","policy":"api","max_events":2}`)
	within("B sees the override", func() bool { return source(b) == "runtime_override" })
	if c := b.statuses(3, "/", "X-Tenant", "fleet"); c[200] != 2 || c[429] != 1 {
		t.Fatalf("B with the override of 2: %v", c)
	}
	if c := a.statuses(1, "/", "X-Tenant", "fleet"); c[429] != 1 {
		t.Fatalf("A shares the budget: %v", c)
	}
	a.adminOK("DELETE", "/rate_limit/overrides?tenant=fleet&policy=api", "")
	within("B drops the override", func() bool { return source(b) == "policy" })
	if c := b.statuses(5, "/", "X-Tenant", "fleet"); c[200] != 5 {
		t.Fatalf("B after DELETE: %v", c)
	}
}

// TestAdminDenialsAndResetAudit: GET /rate_limit/denials returns a
// tenant's newest denials from the stream; a reset is audited.
func TestAdminDenialsAndResetAudit(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	s := startCaddyAdmin(t, "", fmt.Sprintf(`
	rate_limit {
		redis {
			address %s
		}
		denials_stream
		tenant {http.request.header.X-Tenant}
		policy api {
			limit 1
			window 1h
		}
	}
	respond "ok"`, srv.Addr), nil)
	// acme: 1 admitted, 4 denied; globex: 1 admitted, 2 denied.
	s.statuses(5, "/", "X-Tenant", "acme")
	s.statuses(3, "/", "X-Tenant", "globex")
	var entries []any
	waitFor(t, func() bool {
		m := s.adminOK(http.MethodGet, "/rate_limit/denials?tenant=acme&count=3", "")
		entries, _ = m["denials"].([]any)
		return len(entries) == 3
	})
	prevID := ""
	for _, e := range entries {
		m := e.(map[string]any)
		if m["tenant"] != "acme" || m["policy"] != "api" || m["limit"] != "1" || m["id"] == "" {
			t.Errorf("denial entry %v", m)
		}
		if id := m["id"].(string); prevID != "" && id >= prevID {
			t.Errorf("entries not newest first: %s after %s", id, prevID)
		} else {
			prevID = id
		}
	}
	if m := s.adminOK(http.MethodGet, "/rate_limit/denials?tenant=globex", ""); len(m["denials"].([]any)) != 2 {
		t.Errorf("globex denials: %v, want 2", m["denials"])
	}
	for _, bad := range []string{"/rate_limit/denials", "/rate_limit/denials?tenant=acme&count=0", "/rate_limit/denials?tenant=acme&count=x"} {
		if code, m := s.adminCall(http.MethodGet, bad, ""); code != http.StatusBadRequest || m["error"] == nil {
			t.Errorf("GET %s: %d %v, want 400 with an error", bad, code, m)
		}
	}

	s.adminOK(http.MethodPost, "/rate_limit/reset?tenant=acme", "")
	if r := s.get("/", "X-Tenant", "acme"); r.status != 200 {
		t.Errorf("after reset: %d, want 200", r.status)
	}
	audit := srv.CLI(t, "XRANGE", "rl:audit", "-", "+")
	if !strings.Contains(audit, "reset") || !strings.Contains(audit, "acme") {
		t.Errorf("audit stream lacks the reset: %q", audit)
	}
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
	// Overrides on the embedded store are process-wide: leave none behind
	// for the tests after this one.
	t.Cleanup(func() {
		for _, tenant := range []string{"a", "b"} {
			s.adminCall(http.MethodDelete, "/rate_limit/overrides", `{"tenant":"`+tenant+`","policy":"api"}`)
		}
	})
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

// TestAdminRefusesOutOfRange: runtime overrides outside the numeric domain
// are refused with 400 naming the field, and an oversized body gets 413.
func TestAdminRefusesOutOfRange(t *testing.T) {
	s := startCaddyAdmin(t, "", `
	rate_limit {
		tenant {http.request.header.X-Tenant}
		policy api {
			algorithm token_bucket
			limit 10
			window 1m
		}
	}
	respond "ok"`, nil)
	for _, tc := range []struct{ body, want string }{
		{`{"tenant":"a","policy":"api","max_events":9223372036854775807}`, "max_events: 9223372036854775807 is out of range (allowed: 1 to 9007199254740991)"},
		{`{"tenant":"a","policy":"api","max_events":9007199254740992}`, "max_events: 9007199254740992 is out of range"},
		{`{"tenant":"a","policy":"api","max_events":0}`, "max_events: 0 is out of range"},
		{`{"tenant":"a","policy":"api","max_events":5,"burst":9007199254740992}`, "burst: 9007199254740992 is out of range (allowed: 0 to 9007199254740991)"},
		{`{"tenant":"a","policy":"api","max_events":5,"window":"1ns"}`, "window: 1ns is out of range (allowed: 1ms to 366d)"},
		{`{"tenant":"a","policy":"api","max_events":5,"window":"9000h"}`, "window: 9000h0m0s is out of range"},
		{`{"tenant":"a","policy":"api","max_events":99999999999999999999}`, "max_events"},
	} {
		code, m := s.adminCall(http.MethodPut, "/rate_limit/overrides", tc.body)
		if code != http.StatusBadRequest || !strings.Contains(fmt.Sprint(m["error"]), tc.want) {
			t.Errorf("PUT %s: %d %v, want 400 with %q", tc.body, code, m, tc.want)
		}
	}
	big := `{"tenant":"` + strings.Repeat("a", 70<<10) + `","policy":"api","max_events":5}`
	if code, m := s.adminCall(http.MethodPut, "/rate_limit/overrides", big); code != http.StatusRequestEntityTooLarge {
		t.Errorf("PUT of a 70 KiB body: %d %v, want 413", code, m)
	}
	if code, m := s.adminCall(http.MethodDelete, "/rate_limit/overrides", big); code != http.StatusRequestEntityTooLarge {
		t.Errorf("DELETE with a 70 KiB body: %d %v, want 413", code, m)
	}
	// Nothing of the above was stored.
	if m := s.adminOK(http.MethodGet, "/rate_limit/overrides", ""); len(m["overrides"].([]any)) != 0 {
		t.Errorf("overrides stored: %v", m["overrides"])
	}
}
