package tollgate

// What a tenant is charged when Redis fails, end to end: the built Caddy
// in front of a streaming LLM upstream, with the README's LLM example on a
// real redis-server that the tests pause (SIGSTOP), kill (SIGKILL) and
// restart; and a breaker that must tell a slow Redis from a busy host.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// gatedLLM is an OpenAI-compatible upstream whose streamed answers stop
// before their usage chunk until release is called: a test can fail Redis
// while an answer is in flight and end it then.
type gatedLLM struct {
	addr    string
	tokens  int
	sent    chan struct{} // one per answer: its content went out
	gate    chan struct{}
	release func()
}

func newGatedLLM(t *testing.T, tokens int) *gatedLLM {
	t.Helper()
	u := &gatedLLM{tokens: tokens, sent: make(chan struct{}, 16), gate: make(chan struct{})}
	var once sync.Once
	u.release = func() { once.Do(func() { close(u.gate) }) }
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = l.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		events := sseEvents(u.tokens, true)
		usage := len(events) - 2 // the usage chunk, then [DONE]
		for i, ev := range events {
			if i == usage {
				u.sent <- struct{}{}
				select {
				case <-u.gate:
				case <-r.Context().Done():
					return
				}
			}
			io.WriteString(w, ev)
			_ = rc.Flush()
		}
	})}
	go srv.Serve(l)
	t.Cleanup(func() { u.release(); srv.Close() })
	return u
}

// readmeLLMOnRedis is the README's LLM example on the Redis at addr, with
// extra lines in its redis block, run by the built Caddy.
func readmeLLMOnRedis(t *testing.T, addr, redisExtra, auth, upstream string) *caddyProcess {
	t.Helper()
	block := docBlockWith(t, "tokens_per_day", "reverse_proxy localhost:8000")
	_, rest, _ := strings.Cut(strings.TrimSpace(block), " {")
	rest = strings.Replace(rest, "rate_limit {", "rate_limit {\n\t\tredis {\n\t\t\taddress "+addr+"\n\t\t\t"+redisExtra+"\n\t\t}", 1)
	rest = strings.NewReplacer("auth:9000", auth, "localhost:8000", upstream).Replace(rest)
	p := startCaddyProcess(t, "{\n\tadmin 127.0.0.1:{ADMIN}\n\tauto_https off\n}\n\nhttp://127.0.0.1:{PORT} {"+rest+"\n")
	p.caddyServer.admin = fmt.Sprintf("127.0.0.1:%d", p.admin)
	return p
}

// chatStream sends alice's streamed chat completion asking for usage and
// returns its status and body.
func chatStream(base, user string) (int, string, error) {
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+user)
	req.Header.Set("Content-Type", "application/json")
	res, err := testClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, string(b), err
}

// remaining returns what the admin API says tenant has left, by policy,
// waiting while the API answers 503 (the breaker is still open after an
// outage, up to its cooldown).
func (s *caddyServer) remaining(tenant string) map[string]int64 {
	s.t.Helper()
	var m map[string]any
	waitFor(s.t, func() bool {
		var status int
		status, m = s.adminCall(http.MethodGet, "/rate_limit/usage?tenant="+tenant, "")
		if status != http.StatusOK && status != http.StatusServiceUnavailable {
			s.t.Fatalf("usage: %d %v", status, m)
		}
		return status == http.StatusOK
	})
	out := map[string]int64{}
	raw, _ := json.Marshal(m["policies"])
	var ps []struct {
		Policy    string `json:"policy"`
		Remaining int64  `json:"remaining"`
	}
	_ = json.Unmarshal(raw, &ps)
	for _, p := range ps {
		out[p.Policy] = p.Remaining
	}
	return out
}

// breakerOpen reads /rate_limit/status.
func (s *caddyServer) breakerOpen() bool {
	s.t.Helper()
	_, m := s.adminCall(http.MethodGet, "/rate_limit/status", "")
	raw, _ := json.Marshal(m)
	return strings.Contains(string(raw), `"breaker_open":true`)
}

// settledUnder runs one 50,000-token streamed answer for alice whose end
// (usage chunk, settlement) happens while fault holds Redis down; recover
// brings Redis back.
func settledUnder(t *testing.T, p *caddyProcess, u *gatedLLM, fault, recover func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		status, body, err := chatStream(p.base, "alice")
		if err == nil && (status != http.StatusOK || !strings.Contains(body, `"total_tokens":50000`)) {
			err = fmt.Errorf("answer: %d %q", status, body)
		}
		done <- err
	}()
	select {
	case <-u.sent:
	case err := <-done:
		t.Fatalf("the answer ended before its usage: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream never got the request")
	}
	fault()
	u.release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	recover()
}

// TestSettlementChargedOnceUnderPause: the README's LLM example on Redis;
// a 50,000-token answer ends while Redis is paused (SIGSTOP) for 2.2s,
// longer than the 100ms timeout, so the settlement times out in Caddy and
// runs in Redis when it resumes. The day quota is charged exactly 50,000,
// once: the recovery retries the settlement with its id, and Redis
// answers it from its record.
func TestSettlementChargedOnceUnderPause(t *testing.T) {
	redistest.RequireBinaries(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	u := newGatedLLM(t, 50_000)
	p := readmeLLMOnRedis(t, srv.Addr, "", fakeAuth(t, map[string]string{"alice": "free"}), u.addr)

	settledUnder(t, p, u, srv.Pause, func() {
		time.Sleep(2200 * time.Millisecond)
		srv.Resume()
	})
	// The recovery runs every second; give it a few, then the total must
	// hold still.
	time.Sleep(4 * time.Second)
	for range 2 {
		if got := p.remaining("alice")["tokens_per_day"]; got != 1_000_000-50_000 {
			t.Fatalf("day quota left %d, want %d: the 50,000-token answer charged %d",
				got, 1_000_000-50_000, 1_000_000-got)
		}
		time.Sleep(2 * time.Second)
	}
}

// TestSettlementDebtSurvivesKill: the same answer ends while Redis is
// killed (SIGKILL) and restarted from its append-only file. The
// settlement is charged into debt once Redis is back: the tenant owes
// 30,000 tokens of its 20,000-a-minute bucket and is refused until the
// refill has paid them back (90s), and the day quota holds 50,000.
func TestSettlementDebtSurvivesKill(t *testing.T) {
	redistest.RequireBinaries(t)
	srv := redistest.StartStandalone(t, redistest.Options{Args: []string{"--appendonly", "yes"}})
	u := newGatedLLM(t, 50_000)
	p := readmeLLMOnRedis(t, srv.Addr, "breaker_cooldown 1s", fakeAuth(t, map[string]string{"alice": "free"}), u.addr)

	var killed time.Time
	settledUnder(t, p, u, func() {
		srv.Kill()
		killed = time.Now()
	}, func() {
		time.Sleep(time.Second)
		srv.Restart(t)
	})
	// Back within a breaker cooldown and a recovery tick or two.
	waitFor(t, func() bool { return p.remaining("alice")["tokens_per_day"] == 1_000_000-50_000 })
	if got := p.remaining("alice")["tokens_per_minute"]; got != 0 {
		t.Fatalf("minute bucket left %d after a 50,000-token answer, want 0 (in debt)", got)
	}
	// 30,001 tokens at 20,000 a minute: 90s after the settlement was
	// charged, which was after the kill.
	want := 90*time.Second - time.Since(killed)
	for range 3 {
		status, _, err := chatStream(p.base, "alice")
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodPost, p.base+"/v1/chat/completions", strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer alice")
		res, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		var secs int
		fmt.Sscan(res.Header.Get("Retry-After"), &secs)
		if status != http.StatusTooManyRequests || res.StatusCode != http.StatusTooManyRequests || time.Duration(secs)*time.Second < want-5*time.Second {
			t.Fatalf("after the restart: %d, then %d with Retry-After %q; want 429s until the 30,000-token debt is repaid (about %v)",
				status, res.StatusCode, res.Header.Get("Retry-After"), want.Round(time.Second))
		}
		time.Sleep(2 * time.Second)
	}
}

// tenantsOnRedis runs the built Caddy with one policy "api" of 100
// requests per window for each X-Tenant, on the Redis at addr with
// redisExtra in its redis block.
func tenantsOnRedis(t *testing.T, addr, redisExtra, window string) *caddyProcess {
	t.Helper()
	return policyOnRedis(t, addr, redisExtra, "api", fmt.Sprintf("limit 100\n\t\t\twindow %s", window))
}

// policyOnRedis starts a built Caddy with one policy, name { body }, keyed
// by the X-Tenant header, on the Redis at addr (redisExtra: more lines of
// its redis block), in front of respond "ok".
func policyOnRedis(t *testing.T, addr, redisExtra, name, body string) *caddyProcess {
	t.Helper()
	p := startCaddyProcess(t, fmt.Sprintf(`{
	admin 127.0.0.1:{ADMIN}
	auto_https off
}

http://127.0.0.1:{PORT} {
	rate_limit {
		redis {
			address %s
			%s
		}
		tenant {http.request.header.X-Tenant}
		policy %s {
			%s
		}
	}
	respond "ok"
}
`, addr, redisExtra, name, body))
	p.caddyServer.admin = fmt.Sprintf("127.0.0.1:%d", p.admin)
	return p
}

// TestBreakerClosesWithoutTraffic: an instance whose breaker opened while
// Redis was paused reports it closed again within its cooldown of Redis
// answering, though no request comes to probe it.
func TestBreakerClosesWithoutTraffic(t *testing.T) {
	redistest.RequireBinaries(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	p := tenantsOnRedis(t, srv.Addr, "breaker_cooldown 2s", "1m")
	p.get("/", "X-Tenant", "acme") // connected
	srv.Pause()
	for range 5 {
		p.get("/", "X-Tenant", "acme")
	}
	if !p.breakerOpen() {
		srv.Resume()
		t.Fatal("the breaker did not open while Redis was paused")
	}
	srv.Resume()
	resumed := time.Now()
	for p.breakerOpen() {
		if time.Since(resumed) > 2*time.Second+time.Second {
			t.Fatalf("breaker still open %v after Redis came back, with a 2s cooldown", time.Since(resumed).Round(time.Millisecond))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if v, _ := metricValue(p.metrics(), "caddy_rate_limit_breaker_open", map[string]string{}); v != 0 {
		t.Errorf("caddy_rate_limit_breaker_open %v once closed, want 0", v)
	}
	t.Logf("breaker closed %v after Redis came back, with no request", time.Since(resumed).Round(time.Millisecond))
}

// TestDelayedFloodOnBusyHost: 2,400 requests of one tenant arrive at once
// at a fleet of three Caddy processes on this one 2-core host, against a
// token bucket of 100 a second with a delay long enough for all of them.
// With the default 100ms timeout, the host is busy enough that calls wait
// in each instance's queue longer than that; they must wait, not time
// out: no breaker opens, every request is decided by Redis and passes at
// its turn, and the fleet serves them at the configured rate (within 5%).
//
// The rate is bounded from both sides, because the upstream cannot see
// the first turn: Redis gives it when the first call is decided, some
// time after the flood starts on a host this busy (a second or more), and
// requests whose turns passed while their calls waited go on at once, so
// the first passes bunch up. Measured from the first pass the rate is at
// least the fleet's, measured from the start of the flood at most; the
// fleet's rate is within 5% of 100/s when the two rates leave room for
// it. A fleet that over-admits (each instance its own bucket: 300/s)
// fails the second; one that serves too slowly fails the first.
func TestDelayedFloodOnBusyHost(t *testing.T) {
	redistest.RequireBinaries(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	var mu sync.Mutex
	var passes []time.Time
	upstream := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		passes = append(passes, time.Now())
		mu.Unlock()
	})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go upstream.Serve(l)
	defer upstream.Close()
	cfg := fmt.Sprintf(`{
	admin 127.0.0.1:{ADMIN}
	auto_https off
}

http://127.0.0.1:{PORT} {
	rate_limit {
		redis {
			address %s
		}
		tenant {http.request.header.X-Tenant}
		policy smooth {
			algorithm token_bucket
			limit 100
			window 1s
			burst 1
			delay 40s
		}
	}
	reverse_proxy %s
}
`, srv.Addr, l.Addr())
	fleet := []*caddyProcess{startCaddyProcess(t, cfg), startCaddyProcess(t, cfg), startCaddyProcess(t, cfg)}
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1000}}
	defer client.CloseIdleConnections()

	const n = 2400
	var ok, other atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodGet, fleet[i%3].base+"/", nil)
			req.Header.Set("X-Tenant", "flood")
			res, err := client.Do(req)
			if err != nil {
				other.Add(1)
				return
			}
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				ok.Add(1)
			} else {
				other.Add(1)
			}
		})
	}
	wg.Wait()

	mu.Lock()
	p := slices.Clone(passes)
	mu.Unlock()
	slices.SortFunc(p, func(a, b time.Time) int { return a.Compare(b) })
	// fromFirst is at least the fleet's rate, fromStart at most.
	var fromFirst, fromStart float64
	var firstAfter time.Duration
	if len(p) > 0 {
		firstAfter = p[0].Sub(start).Round(time.Millisecond)
	}
	if len(p) > 1 {
		fromFirst = float64(len(p)-1) / p[len(p)-1].Sub(p[0]).Seconds()
		fromStart = float64(len(p)-1) / p[len(p)-1].Sub(start).Seconds()
	}
	var opened []string
	for i, c := range fleet {
		if strings.Contains(c.logs.String(), "circuit breaker open") {
			opened = append(opened, fmt.Sprint(i))
		}
		fams := c.metrics()
		var failed []string
		for _, f := range fams["caddy_rate_limit_redis_calls_total"].GetMetric() {
			var script, result string
			for _, l := range f.Label {
				switch l.GetName() {
				case "script":
					script = l.GetValue()
				case "result":
					result = l.GetValue()
				}
			}
			if result != "ok" && f.Counter.GetValue() > 0 {
				failed = append(failed, fmt.Sprintf("%s/%s %v", script, result, f.Counter.GetValue()))
			}
		}
		shed, _ := metricValue(fams, "caddy_rate_limit_redis_queue_shed_total", map[string]string{})
		queued, _ := metricValue(fams, "caddy_rate_limit_redis_queue_seconds", map[string]string{})
		t.Logf("instance %d: %v calls queued, %v shed, failed calls %v", i, queued, shed, failed)
		for _, d := range []string{"fallback_allowed", "fallback_denied", "failed_open", "failed_closed"} {
			if v, _ := metricValue(fams, "caddy_rate_limit_requests_total", map[string]string{"policy": "smooth", "decision": d}); v > 0 {
				t.Errorf("instance %d: %v requests decided %s", i, v, d)
			}
		}
	}
	t.Logf("%d of %d passed (%d not), %d reached the upstream at %.1f/s from the first pass, %.1f/s from the start (first pass %v after the start)",
		ok.Load(), n, other.Load(), len(p), fromFirst, fromStart, firstAfter)
	if len(opened) > 0 {
		t.Errorf("the breaker opened on instances %v", opened)
	}
	if ok.Load() != n || len(p) != n {
		t.Errorf("%d of %d passed, %d reached the upstream; want all of them, at their turns", ok.Load(), n, len(p))
	}
	if fromFirst < 95 || fromStart > 105 {
		t.Errorf("served at %.1f requests/s from the first pass and %.1f from the start, want 100/s within 5%% between them", fromFirst, fromStart)
	}
}

// TestClientGoneDuringDecision: clients that go away while their decision
// waits for Redis (paused, SIGSTOP, with a timeout longer than the
// clients wait) are not a store failure. Their requests are not decided by
// the fail mode, which counted them fallback_allowed and, once Redis
// answered again, charged them to it through the recorder: on top of the
// call that was already on the wire and ran when Redis resumed. Nor are
// the calls they left counted as Redis errors, nor by the breaker.
//
// Which calls reach Redis is made certain by the batcher's two batches in
// flight: a client that stays takes the first, one that goes away the
// second (its call is written, Redis runs it on resuming: charged once),
// and five more that go away wait in the queue behind them, never sent
// (charged nothing).
func TestClientGoneDuringDecision(t *testing.T) {
	redistest.RequireBinaries(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	p := tenantsOnRedis(t, srv.Addr, "timeout 5s", "1h")
	if r := p.get("/", "X-Tenant", "acme"); r.status != http.StatusOK {
		t.Fatalf("first request: %d", r.status)
	}
	// send sends a request that waits at most wait for its answer, and
	// reports its status (0: it went away).
	send := func(wait time.Duration, status chan<- int) {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.base+"/", nil)
		req.Header.Set("X-Tenant", "acme")
		res, err := testClient.Do(req)
		if err != nil {
			status <- 0
			return
		}
		res.Body.Close()
		status <- res.StatusCode
	}
	srv.Pause()
	stayed, inFlight, queued := make(chan int, 1), make(chan int, 1), make(chan int, 5)
	go send(20*time.Second, stayed)
	time.Sleep(150 * time.Millisecond)
	go send(600*time.Millisecond, inFlight)
	time.Sleep(150 * time.Millisecond)
	for range 5 {
		go send(300*time.Millisecond, queued)
	}
	for range 5 {
		if s := <-queued; s != 0 {
			t.Errorf("a request answered %d while Redis was paused", s)
		}
	}
	if s := <-inFlight; s != 0 {
		t.Errorf("a request answered %d while Redis was paused", s)
	}
	time.Sleep(200 * time.Millisecond) // the handlers see their clients gone
	srv.Resume()
	if s := <-stayed; s != http.StatusOK {
		t.Fatalf("the request that waited for Redis: %d", s)
	}
	if r := p.get("/", "X-Tenant", "acme"); r.status != http.StatusOK {
		t.Fatalf("request after Redis resumed: %d", r.status)
	}
	fams := p.metrics()
	for _, decision := range []string{"fallback_allowed", "fallback_denied", "failed_open", "failed_closed"} {
		if v, _ := metricValue(fams, "caddy_rate_limit_requests_total", map[string]string{"policy": "api", "decision": decision}); v != 0 {
			t.Errorf("requests_total{decision=%q} = %v: clients that went away were decided by the fail mode", decision, v)
		}
	}
	if v, _ := metricValue(fams, "caddy_rate_limit_requests_total", map[string]string{"policy": "api", "decision": "allowed"}); v != 3 {
		t.Errorf("requests_total{decision=\"allowed\"} = %v, want 3 (the requests whose clients stayed)", v)
	}
	for _, result := range []string{"error", "timeout"} {
		if v, _ := metricValue(fams, "caddy_rate_limit_redis_calls_total", map[string]string{"script": "decide", "result": result}); v != 0 {
			t.Errorf("redis_calls_total{result=%q} = %v for calls whose clients went away", result, v)
		}
	}
	if p.breakerOpen() {
		t.Error("the breaker opened for clients that went away")
	}
	// What Redis holds: the three requests served and the one whose call
	// was on the wire. Give a recorder that would charge the fail mode's
	// admissions time to do it.
	time.Sleep(1500 * time.Millisecond)
	if got := p.remaining("acme")["api"]; got != 100-4 {
		t.Errorf("Redis remaining %d, want %d: 3 requests served and 1 whose call ran, each charged once", got, 100-4)
	}
}

// TestConcurrencySlotsAfterPause: requests of a concurrency policy whose
// acquires time out on a paused Redis (SIGSTOP) are admitted by `fail
// open`; when Redis resumes it runs those acquires, and the instance then
// releases the slots they took. What Redis holds once the requests are
// done is no slot at all; before, each such acquire kept its slot until
// the bucket was idle for 10 minutes.
func TestConcurrencySlotsAfterPause(t *testing.T) {
	redistest.RequireBinaries(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	p := policyOnRedis(t, srv.Addr, "timeout 100ms", "slots", "algorithm concurrency\n\t\t\tlimit 3\n\t\t\tfail open")
	key := string(limiter.AppendKey(nil, limiter.DefaultPrefix, limiter.Concurrency, "acme", "slots", ""))
	inFlight := func() int64 {
		n, err := client.Get(context.Background(), key).Int64()
		if err != nil {
			return 0 // no key: no slot taken
		}
		return n
	}
	if r := p.get("/", "X-Tenant", "acme"); r.status != http.StatusOK {
		t.Fatalf("first request: %d", r.status)
	}
	if n := inFlight(); n != 0 {
		t.Fatalf("in flight %d after a request ended, want 0", n)
	}
	srv.Pause()
	for i := range 2 {
		if r := p.get("/", "X-Tenant", "acme"); r.status != http.StatusOK {
			t.Fatalf("request %d with Redis paused: %d, want 200 (fail open)", i, r.status)
		}
	}
	srv.Resume()
	// Redis runs the acquires it had received (reading the count at once
	// may come before them); the instance's recovery loop (every second)
	// sends their releases.
	time.Sleep(2500 * time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for inFlight() != 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	fams := p.metrics()
	if n := inFlight(); n != 0 {
		for _, k := range client.Keys(context.Background(), "rl:once:*").Val() {
			t.Logf("%s = %q", k, client.Get(context.Background(), k).Val())
		}
		for _, f := range fams {
			if strings.Contains(f.GetName(), "redis_calls") || strings.Contains(f.GetName(), "breaker") {
				for _, m := range f.GetMetric() {
					t.Logf("%s %v %v", f.GetName(), m.GetLabel(), m.GetCounter().GetValue())
				}
			}
		}
		t.Fatalf("in flight %d once every request ended, want 0", n)
	}
	timeouts, _ := metricValue(fams, "caddy_rate_limit_redis_calls_total", map[string]string{"script": "decide", "result": "timeout"})
	releases, _ := metricValue(fams, "caddy_rate_limit_redis_calls_total", map[string]string{"script": "release", "result": "ok"})
	t.Logf("decide calls timed out: %v; releases answered: %v", timeouts, releases)
	if timeouts < 1 {
		t.Fatalf("no acquire timed out (%v): the test did not lose a reply", timeouts)
	}
}
