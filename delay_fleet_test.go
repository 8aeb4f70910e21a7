package tollgate

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// passLog is an upstream that records when each request reached it, by
// path and tenant: the instants the fleet let requests pass.
type passLog struct {
	mu     sync.Mutex
	passes map[string][]time.Time
}

func newPassLog(t *testing.T) (*passLog, string) {
	l := &passLog{passes: map[string][]time.Time{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		l.mu.Lock()
		k := r.URL.Path + " " + r.Header.Get("X-Tenant")
		l.passes[k] = append(l.passes[k], now)
		l.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	return l, strings.TrimPrefix(srv.URL, "http://")
}

// sorted returns the passes of path and tenant in order.
func (l *passLog) sorted(path, tenant string) []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := slices.Clone(l.passes[path+" "+tenant])
	slices.SortFunc(p, func(a, b time.Time) int { return a.Compare(b) })
	return p
}

// delayFleetCaddyfile has three smoothed routes in front of upstream:
// /token_bucket and /gcra (5 per second, burst 1, delay 1s) and /lease
// (token_bucket, 5 per second, burst 5, delay 1s, leases of up to 3).
func delayFleetCaddyfile(redisBlock, upstream string) string {
	var routes strings.Builder
	for _, r := range []struct{ path, algo, extra string }{
		{"token_bucket", "token_bucket", "burst 1"},
		{"gcra", "gcra", "burst 1"},
		{"lease", "token_bucket", "burst 5\n\t\t\t\tlease 3"},
	} {
		fmt.Fprintf(&routes, `
	route /%s {
		rate_limit {
			%s
			tenant {http.request.header.X-Tenant}
			policy smooth_%s {
				algorithm %s
				limit 5
				window 1s
				%s
				delay 1s
			}
		}
		reverse_proxy %s
	}`, r.path, redisBlock, r.path, r.algo, r.extra, upstream)
	}
	return fmt.Sprintf(`{
	admin 127.0.0.1:{ADMIN}
	auto_https off
}

http://127.0.0.1:{PORT} {
%s
}
`, routes.String())
}

// fleetRequest is one request of a fleet test and its answer.
type fleetRequest struct {
	status     int
	retryAfter int
	sent, done time.Time
	err        error
}

// spacingTolerance is how much closer than one unit two passes may reach
// the upstream: each pass's proxied request takes its own time to get
// there (the first one, undelayed, sometimes 15ms longer than the timed
// ones on a loaded 2-core machine). Two requests given one turn would pass
// within a few ms of each other, far below unit - spacingTolerance. A
// pass may also come late by up to lateTolerance (its timer fired late on
// a busy host: 52.8 ms once in a full run with other tests running), which
// brings it that much closer to the next pass, on time: the tolerance
// covers both, still far below unit.
const spacingTolerance = 50*time.Millisecond + lateTolerance

// fleetGet sends GET base+path for tenant and times it.
func fleetGet(base, path, tenant string) fleetRequest {
	return fleetGetWith(testClient, base, path, tenant)
}

// fleetGetWith is fleetGet sent with client.
func fleetGetWith(client *http.Client, base, path, tenant string) fleetRequest {
	req, _ := http.NewRequest(http.MethodGet, base+path, nil)
	req.Header.Set("X-Tenant", tenant)
	fr := fleetRequest{sent: time.Now()}
	res, err := client.Do(req)
	fr.done = time.Now()
	if err != nil {
		fr.err = err
		return fr
	}
	res.Body.Close()
	fr.status = res.StatusCode
	fr.retryAfter, _ = strconv.Atoi(res.Header.Get("Retry-After"))
	return fr
}

// checkSpacing checks passes against the bucket: in any span between two
// passes, at most burst + span x rate passes (one per unit after the
// burst), with tol for the time a reply takes to reach the upstream.
func checkSpacing(t *testing.T, what string, passes []time.Time, burst int, unit, tol time.Duration) {
	t.Helper()
	for i := range passes {
		for j := i + burst; j < len(passes); j++ {
			if least := time.Duration(j-i-burst+1) * unit; passes[j].Sub(passes[i]) < least-tol {
				t.Errorf("%s: passes %d and %d are %s apart: more than %d+%d in %s", what, i, j, passes[j].Sub(passes[i]), burst, j-i-burst+1, least)
				return
			}
		}
	}
}

// waitStats returns the median and 99th percentile of how long admitted
// requests took.
func waitStats(reqs []fleetRequest) (p50, p99 time.Duration) {
	var d []time.Duration
	for _, r := range reqs {
		if r.status == 200 {
			d = append(d, r.done.Sub(r.sent))
		}
	}
	if len(d) == 0 {
		return 0, 0
	}
	slices.Sort(d)
	return d[len(d)/2], d[min(len(d)-1, len(d)*99/100)]
}

// TestDelayFleet: two Caddy processes on one Redis (standalone, and a
// 3-master cluster) share each tenant's turns: a burst of 40 requests
// admits exactly the burst plus the turns within the delay, passing one
// unit apart fleet-wide; a sustained overload never passes more than the
// rate allows over any span.
func TestDelayFleet(t *testing.T) {
	redistest.RequireBinaries(t)
	t.Run("standalone", func(t *testing.T) {
		srv := redistest.StartStandalone(t, redistest.Options{})
		testDelayFleet(t, fleetRedisBlock(srv.Addr))
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3, 0)
		testDelayFleet(t, fleetRedisBlock(strings.Join(c.Addrs, " ")))
	})
}

func testDelayFleet(t *testing.T, redisBlock string) {
	passes, upstream := newPassLog(t)
	cfg := delayFleetCaddyfile(redisBlock, upstream)
	fleet := []*caddyProcess{startCaddyProcess(t, cfg), startCaddyProcess(t, cfg)}
	const unit = 200 * time.Millisecond // 5 per second

	// A burst: 20 requests on each process at once. burst 1: one passes
	// at once and five take the turns at 200, ..., 1000ms; burst 5 (with
	// leases): five at once and five turns.
	for _, tc := range []struct {
		path         string
		burst, admit int
	}{{"/token_bucket", 1, 6}, {"/gcra", 1, 6}, {"/lease", 5, 10}} {
		tenant := "burst"
		reqs := make([]fleetRequest, 40)
		var wg sync.WaitGroup
		for i := range reqs {
			wg.Go(func() { reqs[i] = fleetGet(fleet[i%2].base, tc.path, tenant) })
		}
		wg.Wait()
		admitted, denied := 0, 0
		for _, r := range reqs {
			switch {
			case r.err != nil:
				t.Fatalf("%s: %v", tc.path, r.err)
			case r.status == 200:
				admitted++
			case r.status == 429:
				denied++
				if r.retryAfter < 2 {
					t.Errorf("%s: Retry-After %d, want at least 2 (the next turn is 1.2s away)", tc.path, r.retryAfter)
				}
			}
		}
		p := passes.sorted(tc.path, tenant)
		if admitted != tc.admit || denied != 40-tc.admit || len(p) != tc.admit {
			t.Errorf("%s burst: %d admitted, %d denied, %d passed the upstream; want exactly %d admitted and passed", tc.path, admitted, denied, len(p), tc.admit)
		}
		checkSpacing(t, tc.path+" burst", p, tc.burst, unit, spacingTolerance)
		if len(p) == tc.admit {
			if last := p[len(p)-1].Sub(p[0]); last < 5*unit-spacingTolerance || last > 5*unit+lateTolerance {
				t.Errorf("%s burst: the last turn passed %s after the first, want 1s", tc.path, last)
			}
		}
		var late time.Duration // the latest pass after its turn
		for k := tc.burst; k < len(p); k++ {
			late = max(late, p[k].Sub(p[0])-time.Duration(k-tc.burst+1)*unit)
		}
		p50, p99 := waitStats(reqs)
		t.Logf("%s burst: 2 processes x 20 requests: %d admitted, %d denied; admitted took p50 %s, p99 %s; passed at most %s after their turns",
			tc.path, admitted, denied, p50.Round(time.Millisecond), p99.Round(time.Millisecond), late.Round(100*time.Microsecond))
	}

	// Sustained overload: each process gets a request every 40ms for 3s
	// (50 per second against 5): every admitted request passes the
	// upstream, never faster than the bucket allows, and the fleet keeps
	// the queue full (about 20 admitted: one per unit over 3s plus 1s of
	// turns).
	for _, path := range []string{"/token_bucket", "/gcra"} {
		tenant := "sustained"
		var mu sync.Mutex
		var reqs []fleetRequest
		var wg sync.WaitGroup
		tick := time.NewTicker(20 * time.Millisecond)
		start := time.Now()
		for i := 0; time.Since(start) < 3*time.Second; i++ {
			<-tick.C
			wg.Go(func() {
				r := fleetGet(fleet[i%2].base, path, tenant)
				mu.Lock()
				reqs = append(reqs, r)
				mu.Unlock()
			})
		}
		tick.Stop()
		wg.Wait()
		admitted := 0
		var first, last time.Time
		for _, r := range reqs {
			if r.err != nil {
				t.Fatalf("%s: %v", path, r.err)
			}
			if r.status == 200 {
				admitted++
			}
			if first.IsZero() || r.sent.Before(first) {
				first = r.sent
			}
			if r.sent.After(last) {
				last = r.sent
			}
		}
		p := passes.sorted(path, tenant)
		if len(p) != admitted {
			t.Errorf("%s sustained: %d admitted but %d passed the upstream", path, admitted, len(p))
		}
		checkSpacing(t, path+" sustained", p, 1, unit, spacingTolerance)
		// Turns were handed out up to 1s past the last request.
		want := 1 + int((last.Sub(first)+time.Second)/unit)
		if admitted < want-1 || admitted > want+1 {
			t.Errorf("%s sustained: %d of %d admitted, want %d (one per 200ms over %s plus 1s of turns)", path, admitted, len(reqs), want, last.Sub(first).Round(time.Millisecond))
		}
		p50, p99 := waitStats(reqs)
		t.Logf("%s sustained: 2 processes, %d requests over %s: %d admitted, %d denied; admitted took p50 %s, p99 %s",
			path, len(reqs), last.Sub(first).Round(time.Millisecond), admitted, len(reqs)-admitted, p50.Round(time.Millisecond), p99.Round(time.Millisecond))
	}
}

// TestDelayShutdown: SIGTERM while requests wait for their turns: Caddy
// exits gracefully, after every waiting request passed at its turn.
func TestDelayShutdown(t *testing.T) {
	passes, upstream := newPassLog(t)
	p := startCaddyProcess(t, fmt.Sprintf(`{
	admin 127.0.0.1:{ADMIN}
	auto_https off
}

http://127.0.0.1:{PORT} {
	rate_limit {
		tenant {http.request.header.X-Tenant}
		policy smooth {
			algorithm gcra
			limit 4
			window 1s
			burst 1
			delay 2s
		}
	}
	reverse_proxy %s
}
`, upstream))
	// The test's own client: after the requests it closes its idle
	// connections. net/http's Shutdown waits up to 5s for a connection on
	// which no request was sent (the transport can dial one more than it
	// uses), which would measure the client rather than Caddy.
	client := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	reqs := make([]fleetRequest, 4)
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Go(func() { reqs[i] = fleetGetWith(client, p.base, "/", "acme") })
	}
	time.Sleep(100 * time.Millisecond)
	stopped := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	client.CloseIdleConnections()
	if err, ok := p.waitExit(5 * time.Second); !ok {
		t.Fatal("caddy did not exit within 5s of SIGTERM")
	} else if err != nil {
		t.Errorf("caddy exited with %v", err)
	}
	for i, r := range reqs {
		if r.err != nil || r.status != 200 {
			t.Errorf("request %d: %d %v, want passed at its turn", i, r.status, r.err)
		}
	}
	pass := passes.sorted("/", "acme")
	if len(pass) != 4 {
		t.Fatalf("%d passed the upstream, want 4", len(pass))
	}
	checkSpacing(t, "shutdown", pass, 1, 250*time.Millisecond, 10*time.Millisecond)
	if last := pass[3].Sub(stopped); last < 600*time.Millisecond {
		t.Errorf("the last turn passed %s after SIGTERM, want about 650ms (its turn)", last)
	}
}
