package tollgate

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestE2ELimitIsExact: a per-IP policy admits exactly its limit, then
// answers 429 with Retry-After and both header sets.
func TestE2ELimitIsExact(t *testing.T) {
	for _, algo := range []string{"token_bucket", "gcra", "sliding_window", "fixed_window", "sliding_log"} {
		t.Run(algo, func(t *testing.T) {
			s := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		policy api {
			algorithm %s
			limit 5
			window 1h
		}
	}
	respond "ok"`, algo), nil)

			for i := range 5 {
				r := s.get("/")
				if r.status != 200 || r.body != "ok" {
					t.Fatalf("request %d: status %d body %q, want 200 ok", i+1, r.status, r.body)
				}
				if got, want := r.header.Get("RateLimit-Policy"), `"api";q=5;w=3600`; got != want {
					t.Errorf("RateLimit-Policy = %q, want %q", got, want)
				}
				if got, want := r.header.Get("X-RateLimit-Remaining"), strconv.Itoa(4-i); got != want {
					t.Errorf("request %d: X-RateLimit-Remaining = %q, want %q", i+1, got, want)
				}
				if got, want := r.header.Get("X-RateLimit-Limit"), "5"; got != want {
					t.Errorf("X-RateLimit-Limit = %q, want %q", got, want)
				}
				if !strings.HasPrefix(r.header.Get("RateLimit"), fmt.Sprintf(`"api";r=%d;t=`, 4-i)) {
					t.Errorf("request %d: RateLimit = %q", i+1, r.header.Get("RateLimit"))
				}
			}
			r := s.get("/")
			if r.status != http.StatusTooManyRequests {
				t.Fatalf("6th request: status %d, want 429", r.status)
			}
			// A sliding window may need the next window and part of the one
			// after before the weighted count fades enough.
			maxWait := 3600
			if algo == "sliding_window" {
				maxWait = 7200
			}
			ra, err := strconv.Atoi(r.header.Get("Retry-After"))
			if err != nil || ra < 1 || ra > maxWait {
				t.Errorf("Retry-After = %q, want whole seconds in [1, %d]", r.header.Get("Retry-After"), maxWait)
			}
			if got := r.header.Get("X-RateLimit-Remaining"); got != "0" {
				t.Errorf("denied X-RateLimit-Remaining = %q, want 0", got)
			}
			if got, want := r.header.Get("RateLimit"), fmt.Sprintf(`"api";r=0;t=%d`, ra); got != want {
				t.Errorf("denied RateLimit = %q, want %q (t equals Retry-After without jitter)", got, want)
			}
			if got := r.header.Get("X-RateLimit-Reset"); got != strconv.Itoa(ra) {
				t.Errorf("denied X-RateLimit-Reset = %q, want %d", got, ra)
			}
			if c := s.statuses(20, "/"); c[429] != 20 {
				t.Errorf("after the limit: %v, want 20 x 429", c)
			}
		})
	}
}

// TestE2EHeaderModes checks each `headers` value writes exactly its set.
func TestE2EHeaderModes(t *testing.T) {
	cases := []struct {
		mode         string
		ietf, legacy bool
	}{
		{"both", true, true},
		{"ietf", true, false},
		{"legacy", false, true},
		{"off", false, false},
	}
	for _, c := range cases {
		t.Run(c.mode, func(t *testing.T) {
			s := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		headers %s
		policy api {
			limit 1
			window 1m
		}
	}
	respond "ok"`, c.mode), nil)
			for i, want := range []int{200, 429} {
				r := s.get("/")
				if r.status != want {
					t.Fatalf("request %d: status %d, want %d", i, r.status, want)
				}
				if got := r.header.Get("RateLimit") != "" && r.header.Get("RateLimit-Policy") != ""; got != c.ietf {
					t.Errorf("request %d: IETF headers present = %v, want %v (%v)", i, got, c.ietf, r.header)
				}
				if got := r.header.Get("X-RateLimit-Limit") != "" && r.header.Get("X-RateLimit-Reset") != ""; got != c.legacy {
					t.Errorf("request %d: legacy headers present = %v, want %v", i, got, c.legacy)
				}
				if want == 429 && r.header.Get("Retry-After") == "" {
					t.Errorf("429 without Retry-After in mode %s", c.mode)
				}
			}
		})
	}
}

// TestE2ETenantIsolation: tenants from a header get separate budgets, and
// hostile tenant values neither crash nor share buckets.
func TestE2ETenantIsolation(t *testing.T) {
	s := startCaddy(t, "", `
	rate_limit {
		tenant {http.request.header.X-Tenant}
		policy api {
			limit 3
			window 1h
		}
	}
	respond "ok"`, nil)

	tenants := []string{
		"acme", "globex", "a:b", "a", "b", "a%3Ab", "{a}", "a}b{", "}", "{", ":",
		"_anonymous_x", strings.Repeat("x", 129), strings.Repeat("x", 130),
		strings.Repeat("y", 16<<10), "tab\there", "ümlaut",
	}
	for _, tenant := range tenants {
		if c := s.statuses(3, "/", "X-Tenant", tenant); c[200] != 3 {
			t.Errorf("tenant %.40q: first 3 requests %v, want 3 x 200 (someone shared its bucket)", tenant, c)
		}
	}
	for _, tenant := range tenants {
		if c := s.statuses(2, "/", "X-Tenant", tenant); c[429] != 2 {
			t.Errorf("tenant %.40q: requests 4-5 %v, want 2 x 429", tenant, c)
		}
	}
	// No tenant header: the shared anonymous bucket, separate from all.
	if c := s.statuses(4, "/"); c[200] != 3 || c[429] != 1 {
		t.Errorf("anonymous: %v, want 3 x 200 and 1 x 429", c)
	}
}

// TestE2EMissingTenantDeny: with missing_tenant deny, no identity is 429.
func TestE2EMissingTenantDeny(t *testing.T) {
	s := startCaddy(t, "", `
	rate_limit {
		tenant {http.request.header.X-Tenant}
		missing_tenant deny
		policy api {
			limit 100
			window 1h
		}
	}
	respond "ok"`, nil)
	if r := s.get("/"); r.status != 429 || r.header.Get("Retry-After") == "" {
		t.Errorf("no tenant: status %d Retry-After %q, want 429 with Retry-After", r.status, r.header.Get("Retry-After"))
	}
	if r := s.get("/", "X-Tenant", "acme"); r.status != 200 {
		t.Errorf("with tenant: status %d, want 200", r.status)
	}
}

// TestE2EMissingTenantReported: a request refused by missing_tenant deny
// is reported as a denial: one rate_limit_exceeded event (no policy,
// reason missing_tenant) and one count in requests_total under policy
// "missing_tenant", decision denied. Requests with a tenant add neither.
func TestE2EMissingTenantReported(t *testing.T) {
	s := startCaddy(t, "", metricsSite(`
			tenant {http.request.header.X-Tenant}
			missing_tenant deny
			policy mt_api {
				limit 100
				window 1h
			}`), subscribeRecorder("rate_limit_exceeded"))
	const req = "caddy_rate_limit_requests_total"
	before := scrapeMetrics(t, s.base+"/metrics")
	if got := before.labelValues(req, "decision", "policy", "missing_tenant"); !slices.Equal(got, []string{"denied"}) {
		t.Errorf("before any request: missing_tenant decisions exported %v, want [denied]", got)
	}
	takeRecordedEvents()
	if r := s.get("/"); r.status != 429 || r.header.Get("Retry-After") != "1" {
		t.Fatalf("no tenant: status %d Retry-After %q, want 429 with Retry-After 1", r.status, r.header.Get("Retry-After"))
	}
	if r := s.get("/", "X-Tenant", "acme"); r.status != 200 {
		t.Fatalf("with tenant: status %d, want 200", r.status)
	}
	events := takeRecordedEvents()
	if len(events) != 1 {
		t.Fatalf("recorded %d rate_limit_exceeded events, want 1: %v", len(events), events)
	}
	e := events[0]
	if e.Data["reason"] != "missing_tenant" || e.Data["policy"] != "" || e.Data["tenant"] != "" || e.Data["retry_after"] != int64(1) {
		t.Errorf("event data %v, want reason missing_tenant, empty policy and tenant, retry_after 1", e.Data)
	}
	after := scrapeMetrics(t, s.base+"/metrics")
	for _, w := range []struct {
		labels []string
		v      float64
	}{
		{[]string{"policy", "missing_tenant", "decision", "denied"}, 1},
		{[]string{"policy", "mt_api", "decision", "allowed"}, 1},
		{[]string{"policy", "mt_api", "decision", "denied"}, 0},
	} {
		if got := after.delta(before, req, w.labels...); got != w.v {
			t.Errorf("%s%v moved by %v, want %v", req, w.labels, got, w.v)
		}
	}
}

// TestE2ETiersAndOverrides: limit resolution override > tier > policy,
// with tiers from tenant_tier and from the tier placeholder, and unlimited.
func TestE2ETiersAndOverrides(t *testing.T) {
	s := startCaddy(t, "", `
	rate_limit {
		tenant {http.request.header.X-Tenant}
		tier {http.request.header.X-Plan}
		tenant_tier bigco enterprise
		policy api {
			limit 2
			window 1h
			tier pro 4
			tier enterprise 6
			tier free unlimited
			override vip 8
			override bigco 1
		}
	}
	respond "ok"`, nil)
	cases := []struct {
		tenant, plan string
		admitted     int
		limitHeader  string
	}{
		{"basic", "", 2, "2"},
		{"someone", "pro", 4, "4"},
		{"corp", "enterprise", 6, "6"},
		{"vip", "pro", 8, "8"},   // static override beats the tier
		{"bigco", "pro", 1, "1"}, // override beats tenant_tier and the header
		{"cheap", "free", 30, ""},
		{"nobody", "no-such-tier", 2, "2"},
	}
	for _, c := range cases {
		got := 0
		for i := range 30 {
			r := s.get("/", "X-Tenant", c.tenant, "X-Plan", c.plan)
			if r.status == 200 {
				got++
			}
			if i == 0 && r.header.Get("X-RateLimit-Limit") != c.limitHeader {
				t.Errorf("tenant %s plan %q: X-RateLimit-Limit %q, want %q", c.tenant, c.plan, r.header.Get("X-RateLimit-Limit"), c.limitHeader)
			}
		}
		if got != c.admitted {
			t.Errorf("tenant %s plan %q: admitted %d of 30, want %d", c.tenant, c.plan, got, c.admitted)
		}
	}
}

// TestE2EMultiPolicyAllOrNothing: when one policy denies, none is charged
// (caddy-ratelimit charges the zones it checked before the denying one).
func TestE2EMultiPolicyAllOrNothing(t *testing.T) {
	s := startCaddy(t, "", `
	rate_limit {
		tenant {http.request.header.X-Tenant}
		policy global {
			limit 10
			window 1h
		}
		policy search {
			match {
				path /search*
			}
			limit 2
			window 1h
		}
	}
	respond "ok"`, nil)
	// 2 searches pass and charge both policies; 5 more are denied by
	// "search" and must not charge "global".
	if c := s.statuses(7, "/search", "X-Tenant", "t1"); c[200] != 2 || c[429] != 5 {
		t.Fatalf("searches: %v, want 2 x 200 and 5 x 429", c)
	}
	r := s.get("/other", "X-Tenant", "t1")
	if r.status != 200 || r.header.Get("X-RateLimit-Remaining") != "7" {
		t.Fatalf("after denied searches: status %d remaining %q, want 200 and 7 (10 - 2 searches - this one)",
			r.status, r.header.Get("X-RateLimit-Remaining"))
	}
	// The denied response names the denying policy.
	r = s.get("/search", "X-Tenant", "t1")
	if r.status != 429 || !strings.HasPrefix(r.header.Get("RateLimit"), `"search";r=0`) {
		t.Errorf("denied search: status %d RateLimit %q, want 429 from policy search", r.status, r.header.Get("RateLimit"))
	}
	if c := s.statuses(10, "/other", "X-Tenant", "t1"); c[200] != 7 || c[429] != 3 {
		t.Errorf("global after: %v, want exactly 7 more admitted", c)
	}
}

// TestE2EShadow: shadow policies count but never block nor change headers,
// log one INFO line per would-deny and mark the access log.
func TestE2EShadow(t *testing.T) {
	dir := t.TempDir()
	logFile := filepath.Join(dir, "caddy.log")
	accessFile := filepath.Join(dir, "access.log")
	s := startCaddy(t, fmt.Sprintf(`	log {
		output file %s
		format json
		level INFO
	}`, logFile), fmt.Sprintf(`
	log {
		output file %s
		format json
	}
	rate_limit {
		tenant {http.request.header.X-Tenant}
		policy trial {
			limit 2
			window 1h
			shadow
		}
		policy tiered {
			limit 100
			window 1h
			override loud 1 shadow
		}
	}
	respond "ok {http.rate_limit.shadow_denied}"`, accessFile), nil)

	for i := range 5 {
		r := s.get("/", "X-Tenant", "acme")
		if r.status != 200 {
			t.Fatalf("request %d: status %d, want 200 (shadow never blocks)", i+1, r.status)
		}
		// Headers come from the enforced policy only.
		if got := r.header.Get("RateLimit-Policy"); got != `"tiered";q=100;w=3600` {
			t.Errorf("request %d: RateLimit-Policy %q, want the enforced policy's", i+1, got)
		}
		wantBody := "ok "
		if i >= 2 {
			wantBody = "ok trial"
		}
		if r.body != wantBody {
			t.Errorf("request %d: body %q, want %q", i+1, r.body, wantBody)
		}
	}
	// Override-level shadow: tenant "loud" has a shadow limit of 1.
	for i := range 3 {
		r := s.get("/", "X-Tenant", "loud")
		if r.status != 200 {
			t.Fatalf("loud %d: status %d", i, r.status)
		}
	}
	// The access log line is written after the response; wait for all.
	waitFor(t, func() bool { return countLogLines(t, accessFile, "rate_limit_shadow_denied") >= 5 })

	type line struct {
		Msg        string `json:"msg"`
		Tenant     string `json:"tenant"`
		Policy     string `json:"policy"`
		Limit      int64  `json:"limit"`
		Remaining  *int64 `json:"remaining"`
		RetryAfter int64  `json:"retry_after"`
	}
	var denials []line
	for _, l := range readJSONLines(t, logFile) {
		var ln line
		_ = json.Unmarshal(l, &ln)
		if ln.Msg == "rate limit would deny" {
			denials = append(denials, ln)
		}
	}
	// acme: requests 3, 4, 5 on trial; loud: requests 2, 3 on tiered; and
	// loud is over trial's 2 on request 3.
	want := map[string]int{"acme/trial": 3, "loud/tiered": 2, "loud/trial": 1}
	got := map[string]int{}
	for _, d := range denials {
		got[d.Tenant+"/"+d.Policy]++
		if d.Remaining == nil || d.RetryAfter < 1 || d.Limit == 0 {
			t.Errorf("would-deny line lacks fields: %+v", d)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("would-deny lines by tenant/policy = %v, want %v", got, want)
	}

	shadowMarked := 0
	for _, l := range readJSONLines(t, accessFile) {
		var entry map[string]any
		_ = json.Unmarshal(l, &entry)
		if v, ok := entry["rate_limit_shadow_denied"]; ok {
			shadowMarked++
			if list, ok := v.([]any); !ok || len(list) == 0 {
				t.Errorf("rate_limit_shadow_denied = %v, want a list of policy names", v)
			}
		}
	}
	if shadowMarked != 5 {
		t.Errorf("access log lines with rate_limit_shadow_denied = %d, want 5", shadowMarked)
	}
}

// TestE2EHandlerShadow: `shadow` at handler level never blocks anything.
func TestE2EHandlerShadow(t *testing.T) {
	s := startCaddy(t, "", `
	rate_limit {
		shadow
		policy api {
			limit 1
			window 1h
		}
	}
	respond "ok"`, nil)
	if c := s.statuses(5, "/"); c[200] != 5 {
		t.Errorf("handler shadow: %v, want 5 x 200", c)
	}
	if r := s.get("/"); r.header.Get("RateLimit") != "" || r.header.Get("X-RateLimit-Remaining") != "" {
		t.Errorf("shadow-only handler wrote rate limit headers: %v", r.header)
	}
}

// countLogLines counts the lines of the log file at path that contain
// substr.
func countLogLines(t *testing.T, path, substr string) int {
	t.Helper()
	n := 0
	for _, l := range readJSONLines(t, path) {
		if strings.Contains(string(l), substr) {
			n++
		}
	}
	return n
}

func readJSONLines(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	var out [][]byte
	for l := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		if l != "" {
			out = append(out, []byte(l))
		}
	}
	return out
}

// TestE2EHandleErrorsJSON: the 429 is a handler error, so handle_errors
// renders it, and the placeholders carry the decision.
func TestE2EHandleErrorsJSON(t *testing.T) {
	s := startCaddy(t, "", `
	rate_limit {
		tenant {http.request.header.X-Tenant}
		policy api {
			limit 1
			window 1m
		}
	}
	respond "ok"
	handle_errors 429 {
		header Content-Type application/json
		respond `+"`"+`{"error":"rate_limited","policy":"{http.rate_limit.policy}","tenant":"{http.rate_limit.tenant}","limit":{http.rate_limit.limit},"remaining":{http.rate_limit.remaining},"retry_after":{http.rate_limit.retry_after}}`+"`"+` 429
	}`, nil)
	s.get("/", "X-Tenant", "acme")
	r := s.get("/", "X-Tenant", "acme")
	if r.status != 429 || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d content-type %q, want 429 application/json", r.status, r.header.Get("Content-Type"))
	}
	var body struct {
		Error      string `json:"error"`
		Policy     string `json:"policy"`
		Tenant     string `json:"tenant"`
		Limit      int    `json:"limit"`
		Remaining  int    `json:"remaining"`
		RetryAfter int    `json:"retry_after"`
	}
	if err := json.Unmarshal([]byte(r.body), &body); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
	ra, _ := strconv.Atoi(r.header.Get("Retry-After"))
	if body.Error != "rate_limited" || body.Policy != "api" || body.Tenant != "acme" || body.Limit != 1 ||
		body.Remaining != 0 || body.RetryAfter != ra || ra < 1 || ra > 120 { // sliding_window: up to two windows
		t.Errorf("body %+v, Retry-After %d", body, ra)
	}
}

// TestE2EEvent: every denial emits rate_limit_exceeded with its data.
func TestE2EEvent(t *testing.T) {
	takeRecordedEvents()
	s := startCaddy(t, "", `
	rate_limit {
		tenant {http.request.header.X-Tenant}
		policy api {
			limit 2
			window 1m
		}
	}
	respond "ok"`, subscribeRecorder("rate_limit_exceeded"))
	if c := s.statuses(5, "/", "X-Tenant", "acme"); c[429] != 3 {
		t.Fatalf("%v, want 3 denials", c)
	}
	events := takeRecordedEvents()
	if len(events) != 3 {
		t.Fatalf("recorded %d events, want 3", len(events))
	}
	for _, e := range events {
		if e.Name() != "rate_limit_exceeded" || e.Data["tenant"] != "acme" || e.Data["policy"] != "api" {
			t.Errorf("event %s %v", e.Name(), e.Data)
		}
		if ra, ok := e.Data["retry_after"].(int64); !ok || ra < 1 {
			t.Errorf("event retry_after = %v", e.Data["retry_after"])
		}
	}
}

// TestE2EConcurrency: slots are held while the upstream works and freed
// when it returns, including when the client goes away.
func TestE2EConcurrency(t *testing.T) {
	release := make(chan struct{})
	stop := make(chan struct{}) // unblocks everything if the test fails early
	var started sync.WaitGroup
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			started.Done()
			select {
			case <-release:
			case <-r.Context().Done():
			case <-stop:
			}
		}
		w.Write([]byte("done"))
	}))
	defer upstream.Close()
	defer close(stop) // before upstream.Close, which waits for handlers
	s := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		tenant {http.request.header.X-Tenant}
		policy inflight {
			algorithm concurrency
			limit 2
		}
	}
	reverse_proxy %s`, strings.TrimPrefix(upstream.URL, "http://")), nil)

	started.Add(2)
	results := make(chan int, 2)
	for range 2 {
		go func() { results <- s.get("/slow", "X-Tenant", "acme").status }()
	}
	started.Wait()
	if r := s.get("/fast", "X-Tenant", "acme"); r.status != 429 {
		t.Fatalf("third in flight: status %d, want 429", r.status)
	}
	if r := s.get("/fast", "X-Tenant", "other"); r.status != 200 {
		t.Fatalf("other tenant: status %d, want 200", r.status)
	}
	close(release)
	for range 2 {
		if st := <-results; st != 200 {
			t.Errorf("slow request: %d", st)
		}
	}
	if c := s.statuses(5, "/fast", "X-Tenant", "acme"); c[200] != 5 {
		t.Fatalf("after release: %v, want 5 x 200 (slots freed)", c)
	}

	// A client that disconnects mid-request frees its slot too.
	release = make(chan struct{})
	started.Add(2)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.base+"/slow", nil)
			req.Header.Set("X-Tenant", "acme")
			if res, err := testClient.Do(req); err == nil {
				res.Body.Close()
			}
		})
	}
	started.Wait()
	if r := s.get("/fast", "X-Tenant", "acme"); r.status != 429 {
		t.Fatalf("full again: status %d, want 429", r.status)
	}
	cancel()
	wg.Wait()
	deadline := time.Now().Add(3 * time.Second)
	for {
		r := s.get("/fast", "X-Tenant", "acme")
		if r.status == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slots not freed after client disconnect: status %d", r.status)
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(release)
}

// TestE2EReload: counters survive a config reload, the new limit applies
// at once, and reloads leak no goroutines.
func TestE2EReload(t *testing.T) {
	site := func(limit int) string {
		return fmt.Sprintf(`
	rate_limit {
		tenant {http.request.header.X-Tenant}
		policy api {
			algorithm fixed_window
			limit %d
			window 1h
		}
	}
	respond "ok"`, limit)
	}
	s := startCaddy(t, "", site(3), nil)
	if c := s.statuses(2, "/", "X-Tenant", "acme"); c[200] != 2 {
		t.Fatalf("before reload: %v", c)
	}
	s.load("", site(5), nil)
	if c := s.statuses(5, "/", "X-Tenant", "acme"); c[200] != 3 || c[429] != 2 {
		t.Fatalf("after reload to limit 5: %v, want 3 more admitted (2 already counted)", c)
	}
	testClient.CloseIdleConnections()
	before := stableGoroutines()
	for i := range 20 {
		s.load("", site(5+i%2), nil)
	}
	s.get("/", "X-Tenant", "acme")
	testClient.CloseIdleConnections()
	if after := stableGoroutines(); after > before+5 {
		t.Errorf("goroutines grew from %d to %d over 20 reloads", before, after)
	}
}

// stableGoroutines waits for short-lived goroutines to finish and returns
// the goroutine count.
func stableGoroutines() int {
	n := -1
	for range 50 {
		time.Sleep(20 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m == n {
			return m
		}
		n = m
	}
	return n
}
