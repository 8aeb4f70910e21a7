package tollgate

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/goleak"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// Timing tolerances of the delay tests, for a loaded 2-core machine: a
// request never passes before its turn (exact), and at most lateTolerance
// after it.
const lateTolerance = 60 * time.Millisecond

// timedResponse is one answer of timedGets.
type timedResponse struct {
	status  int
	elapsed time.Duration // from the common start to the answer
	body    string
	header  http.Header
	err     error
}

// waited parses a body "waited <duration>" (the {http.rate_limit.delay}
// placeholder).
func (r timedResponse) waited(t *testing.T) time.Duration {
	t.Helper()
	s, ok := strings.CutPrefix(r.body, "waited ")
	if !ok {
		t.Fatalf("body %q, want \"waited <duration>\"", r.body)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
	return d
}

// timedGets sends n GETs to url at once (tenant in X-Tenant), each on its
// own connection, and returns the answers sorted by elapsed time.
func timedGets(t *testing.T, url, tenant string, n int) []timedResponse {
	t.Helper()
	out := make([]timedResponse, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	var t0 time.Time
	for i := range n {
		wg.Go(func() {
			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
			defer client.CloseIdleConnections()
			req, _ := http.NewRequest(http.MethodGet, url, nil)
			req.Header.Set("X-Tenant", tenant)
			<-start
			out[i] = doTimed(client, req, t0)
		})
	}
	t0 = time.Now()
	close(start)
	wg.Wait()
	slices.SortFunc(out, func(a, b timedResponse) int { return int(a.elapsed - b.elapsed) })
	for _, r := range out {
		if r.err != nil {
			t.Fatalf("GET %s: %v", url, r.err)
		}
	}
	return out
}

func doTimed(client *http.Client, req *http.Request, t0 time.Time) timedResponse {
	res, err := client.Do(req)
	if err != nil {
		return timedResponse{err: err, elapsed: time.Since(t0)}
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	return timedResponse{status: res.StatusCode, elapsed: time.Since(t0), body: string(body), header: res.Header, err: err}
}

// delaySite is a site with one delayed policy on /smooth per algorithm
// (/token_bucket, /gcra) and the decision's wait in the body.
func delaySite(storeBlock, policyBody string) string {
	var b strings.Builder
	for _, algo := range []string{"token_bucket", "gcra"} {
		fmt.Fprintf(&b, `
	route /%[1]s {
		rate_limit {
			%[2]s
			tenant {http.request.header.X-Tenant}
			policy smooth_%[1]s {
				algorithm %[1]s
				%[3]s
			}
		}
		respond "waited {http.rate_limit.delay}"
	}`, algo, storeBlock, policyBody)
	}
	return b.String()
}

// checkTurns checks that admitted requests (sorted by elapsed) passed at
// their turns, unit apart: never before (a request cannot pass before its
// turn, and every turn is at least k units after the start), at most
// lateTolerance after the undelayed one's latency plus k units.
func checkTurns(t *testing.T, admitted []timedResponse, unit time.Duration) {
	t.Helper()
	base := admitted[0].elapsed
	for k, r := range admitted {
		turn := time.Duration(k) * unit
		if r.elapsed < turn || r.elapsed > base+turn+lateTolerance {
			t.Errorf("request %d passed after %s, want its turn %s (+%s, at most %s late)", k, r.elapsed, turn, base, lateTolerance)
		}
		// A turn never comes early, but a wait may exceed its turn: it
		// counts from the instant the request read the clock, and a
		// concurrent request that read it a little later may have been
		// decided first (100.098ms for a 100ms turn seen in a loop of
		// -short runs). Waits are also rounded up, never down.
		if w := r.waited(t); w > turn+lateTolerance || w < turn-lateTolerance {
			t.Errorf("request %d: {http.rate_limit.delay} %s, want %s ± %s", k, w, turn, lateTolerance)
		}
	}
	if admitted[0].body != "waited 0s" {
		t.Errorf("first request body %q, want \"waited 0s\"", admitted[0].body)
	}
}

// TestDelayTurnsInOrder: limit 10/s, burst 1: ten concurrent requests pass
// at 0, 100, ..., 900ms, on the embedded store and on Redis, for both
// algorithms.
func TestDelayTurnsInOrder(t *testing.T) {
	policy := "limit 10\n\t\t\t\twindow 1s\n\t\t\t\tburst 1\n\t\t\t\tdelay 2s"
	stores := map[string]func(t *testing.T) string{
		"embedded": func(*testing.T) string { return "" },
		"redis": func(t *testing.T) string {
			redistest.RequireBinaries(t)
			srv := redistest.StartStandalone(t, redistest.Options{})
			return fmt.Sprintf("redis {\n\t\t\t\taddress %s\n\t\t\t\ttimeout 5s\n\t\t\t}", srv.Addr)
		},
	}
	for _, name := range []string{"embedded", "redis"} {
		t.Run(name, func(t *testing.T) {
			s := startCaddy(t, "", delaySite(stores[name](t), policy), nil)
			for _, algo := range []string{"token_bucket", "gcra"} {
				res := timedGets(t, s.base+"/"+algo, "acme-"+name, 10)
				for _, r := range res {
					if r.status != 200 {
						t.Fatalf("%s: status %d %q, want every request admitted", algo, r.status, r.body)
					}
				}
				checkTurns(t, res, 100*time.Millisecond)
			}
		})
	}
}

// TestDelayBeyondMaxWait: limit 4/s, burst 1, delay 1s: of ten concurrent
// requests five pass (at 0, 250, ..., 1000ms) and five get a 429 whose
// Retry-After is their turn (1.25s to 2.25s away: 2 or 3 seconds).
func TestDelayBeyondMaxWait(t *testing.T) {
	s := startCaddy(t, "", delaySite("", "limit 4\n\t\t\t\twindow 1s\n\t\t\t\tburst 1\n\t\t\t\tdelay 1s"), nil)
	for _, algo := range []string{"token_bucket", "gcra"} {
		res := timedGets(t, s.base+"/"+algo, "acme", 10)
		var admitted []timedResponse
		denied := 0
		for _, r := range res {
			switch r.status {
			case 200:
				admitted = append(admitted, r)
			case 429:
				denied++
				if ra := r.header.Get("Retry-After"); ra != "2" && ra != "3" {
					t.Errorf("%s: Retry-After %q, want 2 or 3 (a turn 1.25s to 2.25s away)", algo, ra)
				}
			}
		}
		if len(admitted) != 5 || denied != 5 {
			t.Fatalf("%s: %d admitted, %d denied, want exactly 5 and 5", algo, len(admitted), denied)
		}
		checkTurns(t, admitted, 250*time.Millisecond)
	}
}

// TestDelayDisconnect: a client that goes away while waiting gives its
// turn back: the request behind it keeps its turn, and a later request
// takes the freed one.
func TestDelayDisconnect(t *testing.T) {
	s := startCaddy(t, "", delaySite("", "limit 4\n\t\t\t\twindow 1s\n\t\t\t\tburst 1\n\t\t\t\tdelay 2s"), nil)
	for _, algo := range []string{"token_bucket", "gcra"} {
		t.Run(algo, func(t *testing.T) {
			url := s.base + "/" + algo
			tenant := "leaver-" + algo
			send := func(ctx context.Context) chan timedResponse {
				ch := make(chan timedResponse, 1)
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				req.Header.Set("X-Tenant", tenant)
				client := &http.Client{Transport: &http.Transport{}}
				t0 := time.Now()
				go func() { ch <- doTimed(client, req, t0) }()
				return ch
			}
			t0 := time.Now()
			if r := <-send(context.Background()); r.status != 200 || r.body != "waited 0s" {
				t.Fatalf("A: %d %q", r.status, r.body)
			}
			// B's turn is 250ms after A's, C's 500ms.
			ctxB, cancelB := context.WithCancel(context.Background())
			b := send(ctxB)
			time.Sleep(30 * time.Millisecond)
			c := send(context.Background())
			time.Sleep(70 * time.Millisecond)
			cancelB()
			if r := <-b; r.err == nil {
				t.Fatalf("B: answered %d %q, want the request cancelled", r.status, r.body)
			}
			time.Sleep(50 * time.Millisecond)
			// D arrives about 150ms after A: without B's refund its turn
			// would be 750ms after A's; with it, 500ms (C's).
			d := <-send(context.Background())
			sinceA := time.Since(t0)
			if d.status != 200 {
				t.Fatalf("D: %d %q", d.status, d.body)
			}
			if w := d.waited(t); w > 500*time.Millisecond || w < 250*time.Millisecond {
				t.Errorf("D waited %s, want B's freed turn (about 350ms, under 500ms)", w)
			}
			if sinceA < 500*time.Millisecond {
				t.Errorf("D passed %s after A, before its turn at 500ms", sinceA)
			}
			r := <-c
			if r.status != 200 || r.elapsed < 400*time.Millisecond {
				t.Errorf("C: %d after %s, want its own turn (about 470ms after it was sent), not B's", r.status, r.elapsed)
			}
		})
	}
}

// TestDelaySeveralPolicies: a request waits for the latest turn of its
// policies, and its turns are taken all or none: requests that one policy
// refuses take no turn in the other.
func TestDelaySeveralPolicies(t *testing.T) {
	s := startCaddy(t, "", `
	route /both {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			policy fast {
				algorithm token_bucket
				limit 10
				window 1s
				burst 1
				delay 2s
			}
			policy slow {
				algorithm gcra
				limit 4
				window 1s
				burst 1
				delay 1s
			}
		}
		respond "waited {http.rate_limit.delay}"
	}
	route /fast {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			policy fast {
				algorithm token_bucket
				limit 10
				window 1s
				burst 1
				delay 2s
			}
		}
		respond "waited {http.rate_limit.delay}"
	}`, nil)
	res := timedGets(t, s.base+"/both", "acme", 10)
	var admitted []timedResponse
	for _, r := range res {
		if r.status == 200 {
			admitted = append(admitted, r)
		}
	}
	// slow admits 5 (0, 250, ..., 1000ms), fast would take all 10: each
	// admitted request waits for slow's turn, the later one.
	if len(admitted) != 5 {
		t.Fatalf("%d admitted, want exactly 5 (slow's turns)", len(admitted))
	}
	checkTurns(t, admitted, 250*time.Millisecond)

	// fast is charged for the admitted requests only. Another burst, and
	// while it waits, a request on /fast alone (the same bucket): five
	// turns of fast were taken (0 to 400ms), so this one is the sixth,
	// 500ms after the burst; ten would put it at 1s.
	burst := make(chan []timedResponse, 1)
	go func() { burst <- timedGets(t, s.base+"/both", "globex", 10) }()
	time.Sleep(50 * time.Millisecond)
	r := s.get("/fast", "X-Tenant", "globex")
	w, err := time.ParseDuration(strings.TrimPrefix(r.body, "waited "))
	if r.status != 200 || err != nil || w < 350*time.Millisecond || w > 500*time.Millisecond {
		t.Errorf("/fast during a burst of 10 of which slow admits 5: %d %q, want a wait of about 450ms (5 turns taken, not 10)", r.status, r.body)
	}
	n := 0
	for _, r := range <-burst {
		if r.status == 200 {
			n++
		}
	}
	if n != 5 {
		t.Errorf("second burst: %d admitted, want 5", n)
	}
}

// TestDelayObservability: the decision label delayed, the histogram
// caddy_rate_limit_delay_seconds, the access-log field rate_limit_delay;
// a shadow policy never waits and logs "rate limit would delay".
func TestDelayObservability(t *testing.T) {
	dir := t.TempDir()
	logFile, accessFile := filepath.Join(dir, "caddy.log"), filepath.Join(dir, "access.log")
	s := startCaddy(t, fmt.Sprintf("\tlog {\n\t\toutput file %s\n\t\tformat json\n\t\tlevel INFO\n\t}", logFile), fmt.Sprintf(`
	log {
		output file %s
		format json
	}
	handle /metrics {
		metrics
	}
	route /enforced {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			policy obs_enforced {
				algorithm token_bucket
				limit 10
				window 1s
				burst 1
				delay 1s
			}
		}
		respond "waited {http.rate_limit.delay}"
	}
	route /shadow {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			policy obs_shadow {
				algorithm gcra
				limit 10
				window 1s
				burst 1
				delay 1s
				shadow
			}
		}
		respond "waited {http.rate_limit.delay}"
	}`, accessFile), nil)
	before := scrapeMetrics(t, s.base+"/metrics")

	res := timedGets(t, s.base+"/enforced", "acme", 3)
	checkTurns(t, res, 100*time.Millisecond)
	shadow := timedGets(t, s.base+"/shadow", "acme", 3)
	for _, r := range shadow {
		if r.status != 200 || r.body != "waited 0s" || r.elapsed > shadow[0].elapsed+lateTolerance {
			t.Errorf("shadow: %d %q after %s, want passed at once", r.status, r.body, r.elapsed)
		}
	}

	m := scrapeMetrics(t, s.base+"/metrics")
	const req = "caddy_rate_limit_requests_total"
	for _, w := range []struct {
		labels []string
		v      float64
	}{
		{[]string{"policy", "obs_enforced", "decision", "allowed"}, 1},
		{[]string{"policy", "obs_enforced", "decision", "delayed"}, 2},
		{[]string{"policy", "obs_shadow", "decision", "allowed"}, 3},
		{[]string{"policy", "obs_shadow", "decision", "delayed"}, 0},
	} {
		if got := m.delta(before, req, w.labels...); got != w.v {
			t.Errorf("%s%v = %v, want %v", req, w.labels, got, w.v)
		}
	}
	const hist = "caddy_rate_limit_delay_seconds"
	if got := m.delta(before, hist, "policy", "obs_enforced"); got != 2 {
		t.Errorf("%s count = %v, want 2", hist, got)
	}
	sum := m.metric(hist, "policy", "obs_enforced").Histogram.GetSampleSum()
	if b := before.metric(hist, "policy", "obs_enforced"); b != nil {
		sum -= b.Histogram.GetSampleSum()
	}
	// Each wait is its turn, give or take the time a concurrent request
	// took to be decided first (0.300034 s once in 30 -short runs).
	if math.Abs(sum-0.3) > 2*lateTolerance.Seconds() {
		t.Errorf("%s sum = %v, want 0.3 (100ms + 200ms) within %v", hist, sum, 2*lateTolerance)
	}
	if m.metric(hist, "policy", "obs_shadow") != nil {
		t.Errorf("%s has a series for the shadow policy", hist)
	}

	// Access log: the two delayed requests carry rate_limit_delay.
	waitFor(t, func() bool { return countLogLines(t, accessFile, `"uri":"/enforced"`) >= 3 })
	var delays []float64
	for _, l := range readJSONLines(t, accessFile) {
		var e struct {
			URI   string   `json:"uri"`
			Delay *float64 `json:"rate_limit_delay"`
		}
		_ = json.Unmarshal(l, &e)
		if strings.Contains(string(l), `"uri":"/enforced"`) && e.Delay != nil {
			delays = append(delays, *e.Delay)
		}
	}
	slices.Sort(delays)
	// Each wait is its turn, give or take what checkTurns allows: it counts
	// from the request's own clock reading, and is rounded up (a
	// clean-clone run logged 0.200000006, a loop of runs 0.100098077).
	tol := lateTolerance.Seconds()
	if len(delays) != 2 || math.Abs(delays[0]-0.1) > tol || math.Abs(delays[1]-0.2) > tol {
		t.Errorf("access log rate_limit_delay: %v, want two, 0.1 and 0.2 ± %v", delays, tol)
	}
	// The shadow policy would have delayed two requests.
	var would []time.Duration
	for _, l := range readJSONLines(t, logFile) {
		var e struct {
			Msg    string  `json:"msg"`
			Policy string  `json:"policy"`
			Delay  float64 `json:"delay"`
		}
		_ = json.Unmarshal(l, &e)
		if e.Msg == "rate limit would delay" && e.Policy == "obs_shadow" {
			would = append(would, time.Duration(e.Delay*float64(time.Second)))
		}
	}
	if len(would) != 2 {
		t.Errorf("%d 'rate limit would delay' lines, want 2", len(would))
	}
}

// TestDelayFailLocal: with Redis unreachable, fail local hands out turns
// on the fallback bucket, at its share of the limit (0.7 of 10/s with
// one instance: 7/s, a turn every 143ms). Redis comes back at the end, so
// the breaker closes (its gauge is process-wide).
func TestDelayFailLocal(t *testing.T) {
	redistest.RequireBinaries(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	s := startCaddy(t, "", fmt.Sprintf(`
	handle /metrics {
		metrics
	}
	handle {
		rate_limit {
			redis {
				address %s
				timeout 50ms
				breaker_cooldown 200ms
			}
			tenant {http.request.header.X-Tenant}
			fail local
			policy fb {
				algorithm gcra
				limit 10
				window 1s
				burst 1
				delay 2s
			}
		}
		respond "waited {http.rate_limit.delay}"
	}`, srv.Addr), nil)
	srv.Stop()
	// Open the breaker first, so the turns are not spread by failed calls.
	for range 3 {
		s.get("/", "X-Tenant", "warmup")
	}
	res := timedGets(t, s.base+"/", "acme", 5)
	for _, r := range res {
		if r.status != 200 {
			t.Fatalf("status %d %q", r.status, r.body)
		}
	}
	checkTurns(t, res, time.Second/7+1) // GCRA's interval, rounded up
	srv.Restart(t)
	waitFor(t, func() bool {
		s.get("/", "X-Tenant", "probe")
		return scrapeMetrics(t, s.base+"/metrics").value("caddy_rate_limit_breaker_open") == 0
	})
}

// TestDelayReload: a config reload does not cut waits short: requests
// waiting in the old config pass at their turns, through the old handler
// chain, and the new config's requests queue behind them (the embedded
// store's buckets outlive the reload). Stopping Caddy lets waiting
// requests pass at their turns too, and leaves no goroutine behind.
func TestDelayReload(t *testing.T) {
	site := func(version string) string {
		return `
	rate_limit {
		tenant {http.request.header.X-Tenant}
		policy reload {
			algorithm token_bucket
			limit 4
			window 1s
			burst 1
			delay 2s
		}
	}
	respond "` + version + ` {http.rate_limit.delay}"`
	}
	s := startCaddy(t, "", site("v1"), nil)
	done := make(chan []timedResponse, 1)
	go func() { done <- timedGets(t, s.base+"/", "acme", 4) }()
	time.Sleep(100 * time.Millisecond)
	s.load("", site("v2"), nil)
	r := s.get("/", "X-Tenant", "acme")
	old := <-done
	for k, o := range old {
		turn := time.Duration(k) * 250 * time.Millisecond
		if o.status != 200 || !strings.HasPrefix(o.body, "v1 ") || o.elapsed < turn || o.elapsed > old[0].elapsed+turn+lateTolerance {
			t.Errorf("request %d of the old config: %d %q after %s, want v1 at its turn %s", k, o.status, o.body, o.elapsed, turn)
		}
	}
	// The fifth turn (1s after the first) went to the new config: it
	// arrived after the reload, so it waited at most 1s, and it queued
	// behind the four old requests, so more than 600ms (alone, it would
	// not have waited at all). How long the reload took moves it within
	// those bounds.
	w, err := time.ParseDuration(strings.TrimPrefix(r.body, "v2 "))
	if r.status != 200 || !strings.HasPrefix(r.body, "v2 ") || err != nil || w < 600*time.Millisecond || w > time.Second {
		t.Errorf("new config: %d %q, want v2 after the fifth turn (600ms to 1s)", r.status, r.body)
	}

	// Stopping Caddy while requests wait: they pass at their turns too,
	// and once they have, nothing the test started is left running.
	leaks := goleak.IgnoreCurrent()
	go func() { done <- timedGets(t, s.base+"/", "stopper", 3) }()
	time.Sleep(100 * time.Millisecond)
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	for k, o := range <-done {
		turn := time.Duration(k) * 250 * time.Millisecond
		if o.status != 200 || o.elapsed < turn {
			t.Errorf("request %d waiting at shutdown: %d %q after %s, want passed at its turn %s", k, o.status, o.body, o.elapsed, turn)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for goleak.Find(leaks) != nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	goleak.VerifyNone(t, leaks)
}

// TestDelayAdmin: the admin API shows each limit's delay, a tier's own
// or the policy's.
func TestDelayAdmin(t *testing.T) {
	s := startCaddyAdmin(t, "", `
	rate_limit {
		tenant {http.request.header.X-Tenant}
		policy adm_delay {
			algorithm gcra
			limit 10
			window 1s
			delay 2s
			tier batch 2 1s delay 30s
			tier pro 50
		}
	}
	respond "ok"`, nil)
	for tier, want := range map[string]string{"batch": "30s", "pro": "2s", "": "2s"} {
		p := adminPolicy(t, s.adminOK("GET", "/rate_limit/policies?tenant=acme&tier="+tier, ""), "adm_delay")
		if p["delay"] != want {
			t.Errorf("tier %q: delay %v, want %s", tier, p["delay"], want)
		}
	}
	var found bool
	for _, h := range s.adminOK("GET", "/rate_limit/status", "")["handlers"].([]any) {
		for _, p := range h.(map[string]any)["policies"].([]any) {
			if pm := p.(map[string]any); pm["name"] == "adm_delay" {
				found = pm["delay"] == "2s"
			}
		}
	}
	if !found {
		t.Error("status does not show adm_delay's delay 2s")
	}
}
