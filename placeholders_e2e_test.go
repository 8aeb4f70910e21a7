package tollgate

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// handleErrorsTemplate returns the handle_errors 429 block of the first
// documentation example that has one, verbatim.
func handleErrorsTemplate(t *testing.T) string {
	t.Helper()
	re := regexp.MustCompile("(?s)\thandle_errors 429 \\{\n.*?\n\t\\}\n")
	for _, b := range docCaddyfileBlocks(t) {
		if m := re.FindString(b); m != "" {
			return m
		}
	}
	t.Fatal("no handle_errors 429 example in the documentation")
	return ""
}

// TestDenialPlaceholdersRenderJSON: the documented handle_errors JSON body
// renders as valid JSON for every kind of 429 Tollgate produces, with
// every {http.rate_limit.*} placeholder filled.
func TestDenialPlaceholdersRenderJSON(t *testing.T) {
	errorsBlock := handleErrorsTemplate(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	site := fmt.Sprintf(`
	route /embedded* {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			policy api {
				limit 1
				window 1m
				cost {http.request.header.X-Cost}
			}
		}
		respond "ok"
	}
	route /deny* {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			missing_tenant deny
			policy api {
				limit 1
				window 1m
			}
		}
		respond "ok"
	}
	route /inflight* {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			policy slots {
				algorithm concurrency
				limit 1
			}
		}
		respond "ok"
	}
	route /redis* {
		rate_limit {
			redis {
				address %s
				timeout 50ms
			}
			tenant {http.request.header.X-Tenant}
			lease 5
			policy leased {
				algorithm token_bucket
				limit 1
				window 1h
			}
			policy strict {
				match {
					path /redis/closed*
				}
				limit 100
				window 1h
				fail closed
			}
		}
		respond "ok"
	}
%s`, srv.Addr, errorsBlock)
	s := startCaddy(t, "", site, nil)
	type denial struct {
		name, path string
		headers    []string
		prepare    func()
	}
	denials := []denial{
		{"limit", "/embedded", []string{"X-Tenant", "a"}, func() { s.get("/embedded", "X-Tenant", "a") }},
		{"hostile cost", "/embedded", []string{"X-Tenant", "b", "X-Cost", "99999999999999999999"}, nil},
		{"missing tenant", "/deny", nil, nil},
		{"denial cache", "/redis", []string{"X-Tenant", "c"}, func() {
			s.get("/redis", "X-Tenant", "c")
			s.get("/redis", "X-Tenant", "c") // denied by Redis, cached
		}},
		{"fail closed", "/redis/closed", []string{"X-Tenant", "d"}, srv.Stop},
	}
	for _, d := range denials {
		if d.prepare != nil {
			d.prepare()
		}
		res := s.get(d.path, d.headers...)
		if res.status != http.StatusTooManyRequests {
			t.Errorf("%s: status %d, want 429", d.name, res.status)
			continue
		}
		if strings.Contains(res.body, "{http.rate_limit.") {
			t.Errorf("%s: a placeholder was not replaced: %s", d.name, res.body)
		}
		var body map[string]any
		if err := json.Unmarshal([]byte(res.body), &body); err != nil {
			t.Errorf("%s: body is not JSON: %v\n%s", d.name, err, res.body)
			continue
		}
		if ra, ok := body["retry_after"].(float64); !ok || fmt.Sprint(ra) != res.header.Get("Retry-After") {
			t.Errorf("%s: retry_after %v, Retry-After header %q: want the same number", d.name, body["retry_after"], res.header.Get("Retry-After"))
		}
	}
}

// TestConcurrencyDenialPlaceholders: a concurrency 429 (the slot is held
// by a request in flight) fills the placeholders too.
func TestConcurrencyDenialPlaceholders(t *testing.T) {
	errorsBlock := handleErrorsTemplate(t)
	upstream := make(chan struct{})
	slow := newSlowUpstream(t, upstream)
	s := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		policy slots {
			key static
			algorithm concurrency
			limit 1
		}
	}
	reverse_proxy %s
%s`, slow, errorsBlock), nil)
	done := make(chan response, 1)
	go func() { done <- s.get("/") }()
	time.Sleep(200 * time.Millisecond) // the first request holds the slot
	res := s.get("/")
	close(upstream)
	<-done
	var body map[string]any
	if res.status != http.StatusTooManyRequests || json.Unmarshal([]byte(res.body), &body) != nil || body["policy"] != "slots" {
		t.Fatalf("status %d body %q, want a 429 with the JSON body of policy slots", res.status, res.body)
	}
}

// docCaddyfileBlocks returns every ```caddyfile block of the README and
// the docs.
func docCaddyfileBlocks(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range caddyfileBlock.FindAllStringSubmatch(string(b), -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// docFiles lists the documentation whose examples are tested: the README
// and every Markdown file under docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md"}
	more, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append(files, more...)
}

// newSlowUpstream serves HTTP on a free loopback port and answers each
// request once release is closed. It returns the address.
func newSlowUpstream(t *testing.T, release <-chan struct{}) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		fmt.Fprint(w, "slow ok")
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// docBlockWith returns the documentation's Caddyfile example that contains
// all of marks.
func docBlockWith(t *testing.T, marks ...string) string {
	t.Helper()
outer:
	for _, b := range docCaddyfileBlocks(t) {
		for _, m := range marks {
			if !strings.Contains(b, m) {
				continue outer
			}
		}
		return b
	}
	t.Fatalf("no documentation example contains %q", marks)
	return ""
}

// startSiteBlock runs a whole documented site block in Caddy, its site
// address replaced by a loopback one and the other addresses by the
// replacements (old, new pairs).
func startSiteBlock(t *testing.T, block string, replacements ...string) *caddyServer {
	t.Helper()
	s := &caddyServer{t: t, port: freePort(t)}
	s.base = fmt.Sprintf("http://127.0.0.1:%d", s.port)
	caddyMu.Lock()
	t.Cleanup(caddyMu.Unlock)
	t.Cleanup(func() { stopCaddy(t) })
	site, rest, _ := strings.Cut(strings.TrimSpace(block), " {")
	src := fmt.Sprintf("{\n\tadmin off\n\tpersist_config off\n\tauto_https off\n\tlog {\n\t\toutput discard\n\t}\n}\n\n%s {%s\n", s.base, rest)
	src = strings.NewReplacer(replacements...).Replace(src)
	if strings.Contains(site, " ") || site == "" {
		t.Fatalf("unexpected site address %q", site)
	}
	if err := loadConfig(t, adaptCaddyfile(t, src)); err != nil {
		t.Fatalf("loading: %v\n%s", err, src)
	}
	testClient.CloseIdleConnections()
	waitListening(t, s.port)
	return s
}

// fakeAuth is an auth service for forward_auth: "Authorization: Bearer
// <user>" is valid for the users given (user -> plan); it answers with the
// tenant and plan headers the documented example copies.
func fakeAuth(t *testing.T, plans map[string]string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		plan, known := plans[user]
		if !ok || !known {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("X-Tenant-Id", user)
		w.Header().Set("X-Plan", plan)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// TestDocExamplesCannotBeSpoofed: the documented tiers example (tenant
// and tier from headers forward_auth copies) and the basic_auth example
// run as written: a client sending its own X-Tenant-Id and X-Plan gets its
// authenticated tenant and tier, because rate_limit runs after the auth
// handlers.
func TestDocExamplesCannotBeSpoofed(t *testing.T) {
	upstream := make(chan struct{})
	close(upstream)
	backend := newSlowUpstream(t, upstream)

	t.Run("forward_auth tiers", func(t *testing.T) {
		block := docBlockWith(t, "forward_auth auth:9000", "tier {http.request.header.X-Plan}")
		auth := fakeAuth(t, map[string]string{"alice": "free", "bob": "pro"})
		s := startSiteBlock(t, block, "auth:9000", auth, "localhost:9000", backend)
		spoof := []string{"X-Tenant-Id", "spoof-1", "X-Plan", "pro"}
		first := s.get("/", append([]string{"Authorization", "Bearer alice"}, spoof...)...)
		second := s.get("/", append([]string{"Authorization", "Bearer alice"}, "X-Tenant-Id", "spoof-2", "X-Plan", "enterprise")...)
		bob := s.get("/", "Authorization", "Bearer bob", "X-Tenant-Id", "alice")
		if first.status != 200 || first.header.Get("X-Ratelimit-Limit") != "100" || first.header.Get("X-Ratelimit-Remaining") != "99" {
			t.Errorf("alice claiming tier pro: %d limit %q remaining %q, want her own tier (100) and bucket", first.status, first.header.Get("X-Ratelimit-Limit"), first.header.Get("X-Ratelimit-Remaining"))
		}
		if second.header.Get("X-Ratelimit-Remaining") != "98" {
			t.Errorf("alice claiming another tenant: remaining %q, want 98 (still her bucket)", second.header.Get("X-Ratelimit-Remaining"))
		}
		if bob.header.Get("X-Ratelimit-Limit") != "1000" || bob.header.Get("X-Ratelimit-Remaining") != "999" {
			t.Errorf("bob claiming to be alice: limit %q remaining %q, want his own bucket of tier pro", bob.header.Get("X-Ratelimit-Limit"), bob.header.Get("X-Ratelimit-Remaining"))
		}
		if res := s.get("/", spoof...); res.status != http.StatusUnauthorized {
			t.Errorf("no credentials: status %d, want 401 from forward_auth", res.status)
		}
	})
	t.Run("basic_auth", func(t *testing.T) {
		block := docBlockWith(t, "basic_auth", "tenant {http.auth.user.id}", "bob ")
		// The documented hashes have bcrypt's cost 14 (caddy
		// hash-password): seconds per first check under -race. Same
		// passwords, cost 4.
		hashes := map[string]string{"alice": "hunter2", "bob": "swordfish"}
		var repl []string
		for user, pw := range hashes {
			m := regexp.MustCompile(user + ` (\$2a\$14\$\S+)`).FindStringSubmatch(block)
			if m == nil {
				t.Fatalf("no bcrypt hash for %s in the example", user)
			}
			if bcrypt.CompareHashAndPassword([]byte(m[1]), []byte(pw)) != nil {
				t.Fatalf("the documented hash of %s is not of %q", user, pw)
			}
			cheap, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.MinCost)
			if err != nil {
				t.Fatal(err)
			}
			repl = append(repl, m[1], string(cheap))
		}
		s := startSiteBlock(t, block, append(repl, "localhost:9000", backend)...)
		get := func(user, pass string) response {
			req, _ := http.NewRequest(http.MethodGet, s.base+"/", nil)
			req.SetBasicAuth(user, pass)
			req.Header.Set("X-Tenant-Id", "spoof")
			res, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			return response{status: res.StatusCode, header: res.Header}
		}
		a1, a2, b1 := get("alice", "hunter2"), get("alice", "hunter2"), get("bob", "swordfish")
		for _, c := range []struct {
			name string
			res  response
			want string
		}{{"alice 1", a1, "99"}, {"alice 2", a2, "98"}, {"bob 1", b1, "99"}} {
			if c.res.status != 200 || c.res.header.Get("X-Ratelimit-Remaining") != c.want {
				t.Errorf("%s: status %d remaining %q, want 200 and %s (one bucket per authenticated user)", c.name, c.res.status, c.res.header.Get("X-Ratelimit-Remaining"), c.want)
			}
		}
	})
}
