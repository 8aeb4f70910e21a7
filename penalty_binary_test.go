package tollgate

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// penaltyCaddyfile boxes a tenant that its 5-a-second limit denied 3
// times for 2 s.
const penaltyCaddyfile = `{
	admin 127.0.0.1:{ADMIN}
	auto_https off
}
:{PORT} {
	rate_limit {
		{REDIS}
		tenant {http.request.header.X-Tenant}
		policy api {
			limit 5
			window 1s
			penalty 2s after 3
		}
	}
	respond "ok"
}
`

// TestBinaryPenaltyBox runs the built binary on the embedded store (one
// instance) and on Redis (three instances on one Redis): a tenant denied 3
// times (on three different instances with Redis) is refused by every
// instance for exactly the box's 2 s (±50 ms), without a store call, then
// admitted; another tenant is never refused; the admin API lists the box
// on every instance, the metrics and the denial stream say "penalty", and
// a lift through one instance's admin API lets the tenant in on all of
// them at once.
func TestBinaryPenaltyBox(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			cf, n := strings.Replace(penaltyCaddyfile, "{REDIS}", "", 1), 1
			if store == "redis" {
				cf = strings.Replace(penaltyCaddyfile, "{REDIS}", "redis "+srv.Addr+"\n\t\tdenials_stream", 1)
				n = 3
			}
			ps := make([]*caddyProcess, n)
			for i := range ps {
				ps[i] = startCaddyProcess(t, cf)
				ps[i].caddyServer.admin = fmt.Sprintf("127.0.0.1:%d", ps[i].admin)
			}
			get := func(i int, tenant string) response {
				return ps[i%n].request("GET", "/", "X-Tenant", tenant)
			}
			decideCalls := func() float64 {
				total := 0.0
				for _, p := range ps {
					v, _ := metricValue(p.metrics(), "caddy_rate_limit_redis_calls_total", map[string]string{"script": "decide", "result": "ok"})
					total += v
				}
				return total
			}

			for i := range 5 {
				if r := get(i, "mallory"); r.status != http.StatusOK {
					t.Fatalf("request %d: %d", i+1, r.status)
				}
			}
			// Three denials, one per instance with Redis: the fleet counts
			// them together.
			var third time.Time
			for i := range 3 {
				r := get(i, "mallory")
				if r.status != http.StatusTooManyRequests {
					t.Fatalf("denial %d: %d", i+1, r.status)
				}
				third = time.Now()
			}
			until := waitPenalty(t, ps, "mallory")
			if d := until.Sub(third); d < 2*time.Second-50*time.Millisecond || d > 2*time.Second+50*time.Millisecond {
				t.Fatalf("the box ends %v after the third denial, want 2s ±50ms", d)
			}
			for i, p := range ps { // every instance lists it
				if u := waitPenalty(t, []*caddyProcess{p}, "mallory"); !u.Equal(until) {
					t.Errorf("instance %d lists the box until %v, want %v", i, u, until)
				}
			}

			// Boxed: refused everywhere with Retry-After, without a store
			// call; another tenant passes.
			calls := decideCalls()
			boxed := 0
			for i := 0; time.Now().Before(until.Add(-50 * time.Millisecond)); i++ {
				r := get(i, "mallory")
				if r.status != http.StatusTooManyRequests {
					t.Fatalf("boxed request %d at %v before the end: %d", i+1, time.Until(until), r.status)
				}
				if ra, _ := strconv.Atoi(r.header.Get("Retry-After")); ra < 1 || ra > 2 {
					t.Fatalf("boxed request %d: Retry-After %q", i+1, r.header.Get("Retry-After"))
				}
				boxed++
				time.Sleep(20 * time.Millisecond)
			}
			if got := decideCalls(); got != calls {
				t.Errorf("%d boxed requests made %v decide calls to Redis, want 0", boxed, got-calls)
			}
			if r := get(0, "bob"); r.status != http.StatusOK {
				t.Fatalf("another tenant during the box: %d", r.status)
			}
			// Let out within 50 ms of the end, by every instance.
			var first time.Time
			for i := 0; ; i++ {
				r := get(i, "mallory")
				if r.status == http.StatusOK {
					first = time.Now()
					break
				}
				if time.Now().After(until.Add(50 * time.Millisecond)) {
					t.Fatalf("still refused %v after the end of the box", time.Since(until))
				}
				time.Sleep(2 * time.Millisecond)
			}
			if first.Before(until) {
				t.Fatalf("admitted %v before the end of the box", until.Sub(first))
			}
			for i := range n {
				if r := get(i, "mallory"); r.status != http.StatusOK {
					t.Fatalf("instance %d after the box: %d", i, r.status)
				}
			}
			penalties := 0.0
			for _, p := range ps {
				v, _ := metricValue(p.metrics(), "caddy_rate_limit_requests_total", map[string]string{"policy": "api", "decision": "penalty"})
				penalties += v
			}
			if penalties < float64(boxed) {
				t.Errorf("requests_total{decision=penalty}: %v, want at least the %d boxed requests", penalties, boxed)
			}
			if store == "redis" {
				m := ps[1].adminOK("GET", "/rate_limit/denials?tenant=mallory&count=1000", "")
				reasons := map[string]int{}
				for _, e := range m["denials"].([]any) {
					reason, _ := e.(map[string]any)["reason"].(string)
					reasons[reason]++
				}
				if reasons[""] != 3 || reasons["penalty"] < boxed {
					t.Errorf("denial stream reasons %v, want 3 without reason and at least %d penalty", reasons, boxed)
				}
			}

			// A lift through one instance lets the tenant in everywhere.
			for i := range 5 {
				get(i, "eve")
			}
			for i := range 3 {
				if r := get(i, "eve"); r.status != http.StatusTooManyRequests {
					t.Fatalf("eve's denial %d: %d", i+1, r.status)
				}
			}
			waitPenalty(t, ps, "eve")
			time.Sleep(1100 * time.Millisecond) // the window has room again; the box holds
			for i := range n {
				if r := get(i, "eve"); r.status != http.StatusTooManyRequests {
					t.Fatalf("eve on instance %d before the lift: %d", i, r.status)
				}
			}
			m := ps[n-1].adminOK("DELETE", "/rate_limit/penalties?tenant=eve", "")
			if lifted := m["lifted"].([]any); len(lifted) != 1 {
				t.Fatalf("lifted %v, want eve's box", m)
			}
			for i := range n {
				waitFor(t, func() bool { return get(i, "eve").status == http.StatusOK })
			}
			for _, p := range ps {
				if m := p.adminOK("GET", "/rate_limit/penalties?tenant=eve", ""); len(m["penalties"].([]any)) != 0 {
					t.Errorf("eve still listed after the lift: %v", m)
				}
			}
		})
	}
}

// waitPenalty waits until every process lists tenant's box (policy api)
// and returns its end.
func waitPenalty(t *testing.T, ps []*caddyProcess, tenant string) time.Time {
	t.Helper()
	var until time.Time
	for _, p := range ps {
		waitFor(t, func() bool {
			m := p.adminOK("GET", "/rate_limit/penalties?tenant="+tenant, "")
			es := m["penalties"].([]any)
			if len(es) != 1 {
				return false
			}
			e := es[0].(map[string]any)
			if e["policy"] != "api" || e["tenant"] != tenant {
				t.Fatalf("penalties: %v", m)
			}
			var err error
			if until, err = time.Parse(time.RFC3339Nano, e["until"].(string)); err != nil {
				t.Fatal(err)
			}
			return true
		})
	}
	return until
}

// TestReadmePenaltyRecipe runs the README's penalty example verbatim in
// front of basic_auth: 5 wrong passwords are counted (401), the next 3
// attempts are denied by the limit (Retry-After within the 10-minute
// window), and the third of those denials boxes the IP: an hour, right
// password or not, while another IP logs in.
func TestReadmePenaltyRecipe(t *testing.T) {
	recipe := readmeBlock(t, "penalty 1h after 3")
	site := strings.ReplaceAll(strings.TrimSpace(recipe), "\n", "\n\t") + `
	basic_auth {
		alice $2a$10$1y0ggp3aup/R3N.uGkpAauA2L8aqM8Se1qNdxGvvpxb9ArsE0Lecy
	}
	respond "hello"`
	s := startCaddyAdmin(t, "\torder rate_limit before basic_auth", "\t"+site, nil)
	// The embedded store and its boxes are the process's: start clean
	// (-count=n).
	for _, ip := range []string{"127.0.0.1", "127.0.0.2"} {
		s.adminOK("DELETE", "/rate_limit/penalties?tenant="+ip, "")
		s.adminOK("POST", "/rate_limit/reset?tenant="+ip, "")
	}
	a, b := clientFrom("127.0.0.1"), clientFrom("127.0.0.2")
	for i := range 5 {
		if got := login(t, a, s.base, "guess"); got != http.StatusUnauthorized {
			t.Fatalf("wrong password %d: %d, want 401", i+1, got)
		}
	}
	retryAfter := func(password string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, s.base+"/", nil)
		req.SetBasicAuth("alice", password)
		res, err := a.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("status %d, want 429", res.StatusCode)
		}
		n, _ := strconv.Atoi(res.Header.Get("Retry-After"))
		return n
	}
	for i := range 3 {
		if ra := retryAfter("guess"); ra < 1 || ra > 1200 {
			t.Fatalf("denial %d by the limit: Retry-After %d, want within two 10m windows", i+1, ra)
		}
	}
	for _, password := range []string{"guess", "wonderland"} {
		if ra := retryAfter(password); ra < 3599 || ra > 3600 {
			t.Fatalf("boxed (%s): Retry-After %d, want the hour", password, ra)
		}
	}
	if got := login(t, b, s.base, "wonderland"); got != http.StatusOK {
		t.Fatalf("another IP: %d", got)
	}
}
