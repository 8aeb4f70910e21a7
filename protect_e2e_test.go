package tollgate

import (
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestProtect: with the limit at 1 request in flight, a second request
// waits for the first and passes; a tenant's queue beyond queue_limit is
// shed at once with 503 and Retry-After, its rate-limit units given back;
// the metrics and the admin API show the limiter; a request the rate
// limits deny never takes a slot.
func TestProtect(t *testing.T) {
	release := make(chan struct{})
	up := newCountingUpstream(t, func() { <-release })
	s := startCaddyAdmin(t, "", `
	handle /metrics {
		metrics
	}
	handle {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			policy pr_api {
				limit 3
				window 1h
			}
			protect {
				min 1
				max 1
				initial 1
				queue_limit 1
				max_wait 10s
				target_wait 10s
			}
		}
		reverse_proxy `+up.addr+`
	}`, nil)
	s.adminOK("POST", "/rate_limit/reset?tenant=pr_a", "")
	results := make(chan int, 2)
	for range 2 {
		go func() { results <- s.get("/", "X-Tenant", "pr_a").status }()
	}
	waitFor(t, func() bool {
		m := s.adminOK("GET", "/rate_limit/protect", "")
		h := m["handlers"].([]any)
		return len(h) == 1 && h[0].(map[string]any)["in_flight"] == 1.0 && h[0].(map[string]any)["queued"] == 1.0
	})
	// The queue is full: shed at once.
	r := s.get("/", "X-Tenant", "pr_a")
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "1" {
		t.Fatalf("shed: %d, Retry-After %q", r.status, r.header.Get("Retry-After"))
	}
	close(release)
	for range 2 {
		if st := <-results; st != http.StatusOK {
			t.Fatalf("queued request: %d", st)
		}
	}
	if most := up.most(); most != 1 {
		t.Errorf("%d requests in flight at the upstream, limit 1", most)
	}
	// The shed request's unit was given back: 2 of 3 used.
	u := s.adminOK("GET", "/rate_limit/usage?tenant=pr_a&policy=pr_api", "")
	if got := adminPolicy(t, u, "pr_api")["remaining"]; got != 1.0 {
		t.Errorf("remaining %v, want 1 (the shed request costs nothing)", got)
	}
	// Denied by the rate limit: 429, no slot.
	s.get("/", "X-Tenant", "pr_a")
	if r := s.get("/", "X-Tenant", "pr_a"); r.status != http.StatusTooManyRequests {
		t.Fatalf("over the rate limit: %d", r.status)
	}
	m := scrapeMetrics(t, s.base+"/metrics")
	if m.value("caddy_rate_limit_shed_total", "reason", "queue_full") < 1 || m.value("caddy_rate_limit_protect_limit") != 1 ||
		m.value("caddy_rate_limit_requests_total", "policy", "protect", "decision", "shed") < 1 {
		t.Errorf("metrics: shed %v, limit %v", m.value("caddy_rate_limit_shed_total", "reason", "queue_full"), m.value("caddy_rate_limit_protect_limit"))
	}
	if !strings.Contains(m.text, "caddy_rate_limit_protect_inflight") {
		t.Error("no protect_inflight gauge")
	}
}

// TestProtectReserve: through Caddy, a tenant flooding the queue leaves a
// slot free while another tenant is active, and that tenant's next
// request (below its fair share) takes it at once instead of waiting
// behind the flood for one of its requests to end.
func TestProtectReserve(t *testing.T) {
	release := make(chan struct{})
	up := newCountingUpstream(t, func() { <-release })
	s := startCaddyAdmin(t, "", `
	handle {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			policy prr_api {
				limit 1000
				window 1h
			}
			protect {
				min 4
				max 4
				initial 4
				queue_limit 20
				max_wait 10s
				target_wait 10s
			}
		}
		reverse_proxy `+up.addr+`
	}`, nil)
	protectState := func() (inFlight, queued float64) {
		h := s.adminOK("GET", "/rate_limit/protect", "")["handlers"].([]any)[0].(map[string]any)
		return h["in_flight"].(float64), h["queued"].(float64)
	}
	results := make(chan int, 8)
	send := func(tenant string) { go func() { results <- s.get("/", "X-Tenant", tenant).status }() }
	send("prr_light")
	waitFor(t, func() bool { f, _ := protectState(); return f == 1 })
	// The flood: 2 slots (its share of 4 between two tenants), then it
	// leaves one free and queues the rest.
	for range 6 {
		send("prr_flood")
	}
	// In flight counts a request from its admission; wait until both of
	// the flood's have reached the upstream too.
	waitFor(t, func() bool { f, q := protectState(); return f == 3 && q == 4 && up.arrivals("prr_flood") == 2 })
	send("prr_light")
	waitFor(t, func() bool { return up.arrivals("prr_light") == 2 })
	if f, q := protectState(); f != 4 || q != 4 {
		t.Errorf("after the light tenant's second request: %v in flight, %v queued; want 4 and 4", f, q)
	}
	if n := up.arrivals("prr_flood"); n != 2 {
		t.Errorf("the flood reached the upstream %d times, want 2", n)
	}
	close(release)
	for range 8 {
		if st := <-results; st != http.StatusOK {
			t.Fatalf("status %d", st)
		}
	}
}

// TestProtectWithTheRest: protect beside the handler's other features.
//   - shadow: nothing waits and nothing is shed; a request that would have
//     waited is counted as shed_total{reason="shadow"};
//   - delay: a request the rate limit delays waits for its turn first, then
//     for a slot, and passes;
//   - metering: a metered answer through a protected slot is charged what
//     the upstream reported.
func TestProtectWithTheRest(t *testing.T) {
	t.Run("shadow", func(t *testing.T) {
		release := make(chan struct{})
		up := newCountingUpstream(t, func() { <-release })
		s := startCaddyAdmin(t, "", `
	handle /metrics {
		metrics
	}
	handle {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			shadow
			policy prs_api {
				limit 1000
				window 1h
			}
			protect {
				min 1
				max 1
				initial 1
			}
		}
		reverse_proxy `+up.addr+`
	}`, nil)
		// The metrics outlive a config (and a test): count the difference.
		before := scrapeMetrics(t, s.base+"/metrics").value("caddy_rate_limit_shed_total", "reason", "shadow")
		results := make(chan int, 3)
		for range 3 {
			go func() { results <- s.get("/", "X-Tenant", "prs_a").status }()
		}
		waitFor(t, func() bool { return up.inFlight() == 3 })
		close(release)
		for range 3 {
			if st := <-results; st != http.StatusOK {
				t.Fatalf("shadow: status %d", st)
			}
		}
		shed := scrapeMetrics(t, s.base+"/metrics").value("caddy_rate_limit_shed_total", "reason", "shadow") - before
		if most := up.most(); most != 3 || shed != 2 {
			t.Errorf("shadow, limit 1: %d in flight at once (want 3), shed_total{shadow} +%v (want +2)", most, shed)
		}
	})
	t.Run("delay", func(t *testing.T) {
		up := newCountingUpstream(t, func() { time.Sleep(50 * time.Millisecond) })
		s := startCaddy(t, "", `
	rate_limit {
		tenant {http.request.header.X-Tenant}
		policy prd_api {
			algorithm token_bucket
			limit 4
			window 1s
			burst 1
			delay 2s
		}
		protect {
			min 1
			max 1
			initial 1
		}
	}
	reverse_proxy `+up.addr, nil)
		start := time.Now()
		results := make(chan int, 3)
		for range 3 {
			go func() { results <- s.get("/", "X-Tenant", "prd_a").status }()
		}
		for range 3 {
			if st := <-results; st != http.StatusOK {
				t.Fatalf("delay: status %d", st)
			}
		}
		// Turns 250ms apart: the third passes after about 500ms.
		if took, most := time.Since(start), up.most(); most != 1 || took < 450*time.Millisecond {
			t.Errorf("delay: %d in flight at once (want 1), all done in %v (want ≥ 450ms: the rate limit's turns)", most, took)
		}
	})
	t.Run("metering", func(t *testing.T) {
		up := newLLMUpstream(t)
		s := startCaddyAdmin(t, "", `
	handle {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			policy prm_tokens {
				algorithm token_bucket
				limit 100
				window 1h
				cost_after json usage.total_tokens
			}
			protect {
				min 1
				max 1
				initial 1
			}
		}
		reverse_proxy `+up.addr+`
	}`, nil)
		for range 2 {
			if res := s.get("/json/x?tokens=30", "X-Tenant", "prm_a"); res.status != http.StatusOK {
				t.Fatalf("metering: status %d", res.status)
			}
		}
		u := s.adminOK("GET", "/rate_limit/usage?tenant=prm_a&policy=prm_tokens", "")
		if got := adminPolicy(t, u, "prm_tokens")["remaining"]; got != 40.0 {
			t.Errorf("metering: remaining %v, want 40 (two answers of 30 tokens)", got)
		}
	})
}

// countingUpstream is an upstream that counts its requests in flight,
// the most at once, and the arrivals of each X-Tenant; each request runs
// wait before it answers.
type countingUpstream struct {
	addr string

	mu             sync.Mutex
	inflight, peak int
	arrived        map[string]int
}

func newCountingUpstream(t *testing.T, wait func()) *countingUpstream {
	u := &countingUpstream{arrived: map[string]int{}}
	u.addr = newHTTPServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.inflight++
		u.peak = max(u.peak, u.inflight)
		u.arrived[r.Header.Get("X-Tenant")]++
		u.mu.Unlock()
		wait()
		u.mu.Lock()
		u.inflight--
		u.mu.Unlock()
	}))
	return u
}

func (u *countingUpstream) inFlight() int { u.mu.Lock(); defer u.mu.Unlock(); return u.inflight }
func (u *countingUpstream) most() int     { u.mu.Lock(); defer u.mu.Unlock(); return u.peak }
func (u *countingUpstream) arrivals(tenant string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.arrived[tenant]
}

// TestProtectWithoutPolicy: a rate_limit with protect and no policy (or
// none that matches the request) queues requests by tenant and tier as
// one with policies does: a tenant_tier's weight shows in the admin API;
// without tenant, each client IP is its own tenant (two loopback
// addresses, two queues). Such a config is not warned about as limiting
// nothing, nor its tenant_tier as naming an unknown tier.
func TestProtectWithoutPolicy(t *testing.T) {
	queues := func(s *caddyServer) map[string]float64 {
		out := map[string]float64{}
		h := s.adminOK("GET", "/rate_limit/protect", "")["handlers"].([]any)[0].(map[string]any)
		for _, q := range h["queues"].([]any) {
			q := q.(map[string]any)
			out[q["tenant"].(string)] = q["weight"].(float64)
		}
		return out
	}
	site := func(tenant, upstream string) string {
		if tenant != "" {
			tenant = "\n\t\t\t" + tenant
		}
		return `
	handle {
		rate_limit {` + tenant + `
			tenant_tier acme gold
			tenant_tier 127.0.0.2 gold
			protect {
				min 1
				max 1
				initial 1
				queue_limit 10
				max_wait 10s
				target_wait 10s
				weight gold 4
			}
		}
		reverse_proxy ` + upstream + `
	}`
	}
	t.Run("tier", func(t *testing.T) {
		release := make(chan struct{})
		up := newCountingUpstream(t, func() { <-release })
		logFile := filepath.Join(t.TempDir(), "caddy.log")
		globals := "\tlog {\n\t\toutput file " + logFile + "\n\t\tformat json\n\t}"
		s := startCaddyWith(t, fmt.Sprintf("127.0.0.1:%d", freePort(t)), globals, site("tenant {http.request.header.X-Tenant}", up.addr), nil)
		results := make(chan int, 4)
		send := func(tenant string) { go func() { results <- s.get("/", "X-Tenant", tenant).status }() }
		send("pw_first")
		waitFor(t, func() bool { return up.inFlight() == 1 })
		send("acme")
		send("acme")
		send("pw_other")
		waitFor(t, func() bool { return len(queues(s)) == 2 })
		if got := queues(s); got["acme"] != 4 || got["pw_other"] != 1 {
			t.Errorf("queues %v, want acme (tier gold) weighing 4 and pw_other 1", got)
		}
		close(release)
		for range 4 {
			if st := <-results; st != http.StatusOK {
				t.Fatalf("status %d", st)
			}
		}
		for _, warning := range []string{"rate_limit defines no zone or policy", "tenant_tier names a tier that no policy defines"} {
			if n := countLogLines(t, logFile, warning); n != 0 {
				t.Errorf("%d warnings %q for a protect-only config", n, warning)
			}
		}
	})
	t.Run("client IP", func(t *testing.T) {
		release := make(chan struct{})
		up := newCountingUpstream(t, func() { <-release })
		s := startCaddyAdmin(t, "", site("", up.addr), nil)
		from := func(ip string) *http.Client {
			d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
			return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
		}
		results := make(chan int, 5)
		send := func(ip string) {
			go func() {
				res, err := from(ip).Get(s.base + "/")
				if err != nil {
					t.Error(err)
					results <- 0
					return
				}
				res.Body.Close()
				results <- res.StatusCode
			}()
		}
		send("127.0.0.1")
		waitFor(t, func() bool { return up.inFlight() == 1 })
		send("127.0.0.1")
		send("127.0.0.1")
		send("127.0.0.2")
		send("127.0.0.2")
		waitFor(t, func() bool { return len(queues(s)) == 2 })
		if got := queues(s); got["127.0.0.1"] != 1 || got["127.0.0.2"] != 4 {
			t.Errorf("queues %v, want 127.0.0.1 weighing 1 and 127.0.0.2 (tenant_tier gold) 4", got)
		}
		close(release)
		for range 5 {
			if st := <-results; st != http.StatusOK {
				t.Fatalf("status %d", st)
			}
		}
	})
}
