package tollgate

import (
	"bufio"
	"context"
	"net/http"
	"testing"
	"time"
)

// TestMeteredDrainBounds: a metered response whose client left is read on
// within the drain bounds of its handler: one at a time here, so a second
// client leaving meanwhile has its upstream
// request cancelled at once; a drain that outlives the timeout, or reads
// past max_bytes, is cut. Each request is charged its usage when the
// drain reached it, else its up-front unit, counted as client_gone.
func TestMeteredDrainBounds(t *testing.T) {
	up := newLLMUpstream(t)
	globals := "\tservers {\n\t\tprotocols h1 h2c\n\t}\n\tlog {\n\t\toutput file " + testLogFile(t) + "\n\t}"
	s := startCaddy(t, globals, `
	handle /metrics {
		metrics
	}
	route /sse/* {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			drain {
				timeout 1s
				max_concurrent 1
			}
			policy d_sse {
				algorithm token_bucket
				limit 100
				window 1h
				cost_after json usage.total_tokens
			}
		}
		reverse_proxy `+up.addr+`
	}
	route /big/* {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			drain {
				max_bytes 1MiB
			}
			policy d_big {
				algorithm token_bucket
				limit 100
				window 1h
				cost_after json usage.total_tokens
			}
		}
		reverse_proxy `+up.addr+`
	}`, nil)
	h2c := &http.Transport{Protocols: new(http.Protocols)}
	h2c.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(h2c.CloseIdleConnections)
	before := scrapeMetrics(t, s.base+"/metrics")
	delta := func(name string, labels ...string) float64 {
		return scrapeMetrics(t, s.base+"/metrics").value(name, labels...) - before.value(name, labels...)
	}
	waitFor := func(what string, want float64, name string, labels ...string) {
		t.Helper()
		got := delta(name, labels...)
		for deadline := time.Now().Add(5 * time.Second); got != want && time.Now().Before(deadline); got = delta(name, labels...) {
			time.Sleep(20 * time.Millisecond)
		}
		if got != want {
			t.Fatalf("%s: %s%v grew by %v, want %v", what, name, labels, got, want)
		}
	}
	// leave reads the first n lines of path's answer, then hangs up.
	leave := func(rt http.RoundTripper, path, tenant string, n int) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.base+path, nil)
		req.Header.Set("X-Tenant", tenant)
		res, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		if rt == h2c && res.ProtoMajor != 2 {
			t.Fatalf("%s: answered over %s, want HTTP/2", tenant, res.Proto)
		}
		br := bufio.NewReader(res.Body)
		for range n {
			if _, err := br.ReadString('\n'); err != nil {
				t.Fatalf("%s: %v", tenant, err)
			}
		}
		cancel()
		res.Body.Close()
	}
	release := func(gate chan struct{}, n int) {
		t.Helper()
		for i := range n {
			select {
			case gate <- struct{}{}:
			case <-time.After(5 * time.Second):
				t.Fatalf("the upstream did not ask for event %d after its client left", i)
			}
		}
	}
	remaining := func(tenant, want string) {
		t.Helper()
		// The probe costs 0 in the end: its header shows the bucket.
		if got := s.get("/sse/x?tokens=0", "X-Tenant", tenant).header.Get("X-Ratelimit-Remaining"); got != want {
			t.Errorf("%s: remaining %s, want %s", tenant, got, want)
		}
	}
	tr := testClient.Transport.(*http.Transport)

	// a resets its HTTP/2 stream before the usage event: drained (the
	// only slot).
	leave(h2c, "/sse/x?tokens=30&gated", "a", 2)
	waitFor("a left", 1, "caddy_rate_limit_drains_total", "event", "started")
	// b closes its HTTP/1.1 connection meanwhile: no slot, its upstream
	// request is cancelled (it stops waiting for its gate).
	leave(tr, "/sse/x?tokens=30&gated=2", "b", 2)
	waitFor("b left", 1, "caddy_rate_limit_drains_total", "event", "refused")
	// a's upstream goes on and ends: 30 tokens charged.
	release(up.gate, len(sseEvents(30, true))-1)
	waitFor("a drained", 1, "caddy_rate_limit_drains_total", "event", "completed")
	remaining("a", "69")
	remaining("b", "98")

	// c leaves and its upstream stalls past the 1s timeout: cut.
	leave(h2c, "/sse/x?tokens=30&gated", "c", 2)
	waitFor("c cut", 1, "caddy_rate_limit_drains_total", "event", "cut_time")
	remaining("c", "98")

	// d hangs up on a 50 MiB answer once it has its headers: cut after 1 MiB.
	leave(tr, "/big/x?tokens=30", "d", 0)
	waitFor("d cut", 1, "caddy_rate_limit_drains_total", "event", "cut_bytes")

	waitFor("b and c", 2, "caddy_rate_limit_cost_missing_total", "policy", "d_sse", "reason", "client_gone")
	waitFor("d", 1, "caddy_rate_limit_cost_missing_total", "policy", "d_big", "reason", "client_gone")
	for event, want := range map[string]float64{"started": 3, "completed": 1, "refused": 1, "cut_time": 1, "cut_bytes": 1} {
		if got := delta("caddy_rate_limit_drains_total", "event", event); got != want {
			t.Errorf("drains_total{event=%s} grew by %v, want %v", event, got, want)
		}
	}
	// Nobody waits on the gates: the cut upstream requests were
	// cancelled.
	select {
	case up.gate <- struct{}{}:
		t.Error("c's upstream request is still waiting for its next event: not cancelled")
	case up.gate2 <- struct{}{}:
		t.Error("b's upstream request is still waiting for its next event: not cancelled")
	case <-time.After(200 * time.Millisecond):
	}
}
