package tollgate

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// droppedDenials reads caddy_rate_limit_denials_dropped_total{reason}.
func droppedDenials(t testing.TB, reason string) float64 {
	t.Helper()
	return gathered(t, "caddy_rate_limit_denials_dropped_total", "reason", reason)
}

func allDroppedDenials(t testing.TB) float64 {
	t.Helper()
	sum := 0.0
	for _, r := range fleet.DropReasons {
		sum += droppedDenials(t, r)
	}
	return sum
}

// denialWriters counts the running denial stream writer goroutines.
func denialWriters(t testing.TB) int {
	t.Helper()
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "fleet.(*DenialStream).run(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// liveStreams returns the distinct denial streams of the live handlers.
func liveStreams() []*fleet.DenialStream {
	gate.RLock()
	defer gate.RUnlock()
	var out []*fleet.DenialStream
	for _, h := range gate.Gates() {
		if d := h.Store.Denials(); d != nil && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// entriesAdded is XINFO STREAM's entries-added: every entry ever written,
// trimmed ones included.
func entriesAdded(t testing.TB, c *redis.Client, stream string) int64 {
	t.Helper()
	info, err := c.XInfoStream(context.Background(), stream).Result()
	if err != nil {
		if strings.Contains(err.Error(), "no such key") {
			return 0
		}
		t.Fatal(err)
	}
	return info.EntriesAdded
}

// rateLimitBlock is a rate_limit handler on Redis at addr with the given
// handler-level lines and one policy body.
func rateLimitBlock(addr, redisExtra, lines, policy string) string {
	return fmt.Sprintf(`rate_limit {
		redis {
			address %s
%s
		}
		tenant {http.request.header.X-Tenant}
%s
		%s
	}`, addr, redisExtra, lines, policy)
}

// TestDenialStreamEntries: each enforced denial is one stream entry with
// the documented fields; shadow would-denies write nothing; the key is
// there only with log_key; handlers with different maxlen share one writer
// that trims with the largest.
func TestDenialStreamEntries(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	c := srv.Client(t)
	site := fmt.Sprintf(`
	route /enf/* {
		%s
	}
	route /key/* {
		%s
	}
	route /shadow/* {
		%s
	}
	respond "ok"`,
		rateLimitBlock(srv.Addr, "", "\t\tdenials_stream 500", "policy api {\n\t\t\tlimit 2\n\t\t\twindow 1h\n\t\t}"),
		rateLimitBlock(srv.Addr, "", "\t\tdenials_stream 1000\n\t\tlog_key", "policy keyed {\n\t\t\tkey {http.request.uri.path}\n\t\t\tlimit 1\n\t\t\twindow 1h\n\t\t}"),
		rateLimitBlock(srv.Addr, "", "\t\tdenials_stream", "policy sh {\n\t\t\tlimit 1\n\t\t\twindow 1h\n\t\t\tshadow\n\t\t}"),
	)
	s := startCaddy(t, "", site, nil)
	start := time.Now().UnixMilli()

	if got := s.statuses(7, "/enf/x", "X-Tenant", "acme"); got[200] != 2 || got[429] != 5 {
		t.Fatalf("/enf: %v, want 2 x 200 and 5 x 429", got)
	}
	if got := s.statuses(2, "/key/a", "X-Tenant", "beta"); got[200] != 1 || got[429] != 1 {
		t.Fatalf("/key: %v, want 1 x 200 and 1 x 429", got)
	}
	if got := s.statuses(5, "/shadow/x", "X-Tenant", "gamma"); got[200] != 5 {
		t.Fatalf("/shadow: %v, want 5 x 200 (shadow never blocks)", got)
	}
	waitFor(t, func() bool { return entriesAdded(t, c, "rl:denials") >= 6 })
	time.Sleep(100 * time.Millisecond) // anything extra would show now
	end := time.Now().UnixMilli()

	entries, err := c.XRange(context.Background(), "rl:denials", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 6 {
		t.Fatalf("%d entries, want 6 (5 + 1 denials, no shadow): %v", len(entries), entries)
	}
	instances, err := c.ZRange(context.Background(), "rl:instances", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range entries {
		v := e.Values
		ts, err := strconv.ParseInt(fmt.Sprint(v["ts"]), 10, 64)
		if err != nil || ts < start-1000 || ts > end {
			t.Errorf("entry %d: ts %v is not a unix ms time of the test", i, v["ts"])
		}
		if !slices.Contains(instances, fmt.Sprint(v["instance"])) {
			t.Errorf("entry %d: instance %v is not in rl:instances %v", i, v["instance"], instances)
		}
		if ra, err := strconv.Atoi(fmt.Sprint(v["retry_after"])); err != nil || ra < 1 || ra > 7200 {
			t.Errorf("entry %d: retry_after %v, want 1..7200 seconds (sliding window of 1h)", i, v["retry_after"])
		}
		want := map[string]any{"tenant": "acme", "policy": "api", "limit": "2"}
		if i == 5 {
			want = map[string]any{"tenant": "beta", "policy": "keyed", "limit": "1", "key": "/key/a"}
		}
		for k, w := range want {
			if v[k] != w {
				t.Errorf("entry %d: %s = %v, want %v", i, k, v[k], w)
			}
		}
		var names []string
		for k := range v {
			names = append(names, k)
		}
		sort.Strings(names)
		wantNames := []string{"instance", "limit", "policy", "retry_after", "tenant", "ts"}
		if i == 5 {
			wantNames = []string{"instance", "key", "limit", "policy", "retry_after", "tenant", "ts"}
		}
		if !slices.Equal(names, wantNames) {
			t.Errorf("entry %d: fields %v, want %v", i, names, wantNames)
		}
	}

	// One writer for the three handlers, trimming with the largest maxlen.
	streams := liveStreams()
	if len(streams) != 1 {
		t.Fatalf("%d streams, want 1", len(streams))
	}
	if got := streams[0].MaxLen(); got != config.DefaultDenialsStream {
		t.Errorf("maxlen %d, want %d (the largest asked for)", got, config.DefaultDenialsStream)
	}
	if got := denialWriters(t); got != 1 {
		t.Errorf("%d writers running, want 1", got)
	}
}

// TestDenialStreamTenantCut: tenants are cut like in logs.
func TestDenialStreamTenantCut(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	c := srv.Client(t)
	site := rateLimitBlock(srv.Addr, "", "\t\tdenials_stream", "policy api {\n\t\t\tlimit 1\n\t\t\twindow 1h\n\t\t}") + "\n\trespond \"ok\""
	s := startCaddy(t, "", site, nil)
	long := strings.Repeat("t", 300)
	if got := s.statuses(2, "/", "X-Tenant", long); got[429] != 1 {
		t.Fatalf("%v, want one 429", got)
	}
	waitFor(t, func() bool { return entriesAdded(t, c, "rl:denials") == 1 })
	entries, err := c.XRange(context.Background(), "rl:denials", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := entries[0].Values["tenant"], gate.Loggable(long); got != want || len(want) > 128+20 {
		t.Errorf("tenant %q, want %q", got, want)
	}
}

// TestDenialStreamNeedsRedis: without a redis block the config is refused
// with a message that says why.
func TestDenialStreamNeedsRedis(t *testing.T) {
	// The Caddyfile refuses it with the line (see TestCaddyfileErrors);
	// a JSON config is refused when it loads.
	cfg := `{"apps":{"http":{"servers":{"s":{"listen":[":0"],"routes":[{"handle":[{"handler":"rate_limit","denials_stream":10,"rate_limits":{"api":{"max_events":1,"window":60000000000}}}]}]}}}}}`
	err := validateConfig([]byte(cfg))
	if err == nil || !strings.Contains(err.Error(), "denials_stream: needs a redis block") {
		t.Fatalf("error %v, want denials_stream: needs a redis block", err)
	}
}

// TestDenialStreamHungRedis: with Redis paused, the stream costs the deny
// path nothing: fail-closed 429s take as long with denials_stream as
// without it (the decision's own timeout), and after Redis is back every
// denial is either in the stream or counted as dropped.
func TestDenialStreamHungRedis(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	c := srv.Client(t)
	// The breaker never opens here, so every decision waits out the 50ms
	// timeout and the writer keeps trying (and hanging) too.
	redisExtra := "\t\t\ttimeout 50ms\n\t\t\tbreaker_failures 1000000"
	site := func(stream string) string {
		return rateLimitBlock(srv.Addr, redisExtra, stream+"\n\t\tfail closed",
			"policy api {\n\t\t\tlimit 1000\n\t\t\twindow 1h\n\t\t}") + "\n\trespond \"ok\""
	}
	const n, workers = 200, 20
	run := func(s *caddyServer) (latencies []time.Duration, denied int) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < n; i += workers {
					t0 := time.Now()
					st := s.get("/", "X-Tenant", fmt.Sprintf("t%d", i)).status
					d := time.Since(t0)
					mu.Lock()
					latencies = append(latencies, d)
					if st == 429 {
						denied++
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		slices.Sort(latencies)
		return latencies, denied
	}
	pct := func(l []time.Duration, p float64) time.Duration { return l[int(float64(len(l)-1)*p)] }

	s := startCaddy(t, "", site(""), nil)
	s.get("/", "X-Tenant", "warm")
	srv.Pause()
	off, deniedOff := run(s)
	srv.Resume()

	s.load("", site("\t\tdenials_stream"), nil)
	s.get("/", "X-Tenant", "warm")
	before := entriesAdded(t, c, "rl:denials")
	dropped := allDroppedDenials(t)
	srv.Pause()
	on, deniedOn := run(s)
	// Longer than a batch's deadline (1s): the writer's batch fails.
	time.Sleep(1500 * time.Millisecond)
	srv.Resume()

	t.Logf("fail-closed 429s with Redis paused, %d requests, %d workers: stream off p50 %v p99 %v max %v; stream on p50 %v p99 %v max %v",
		n, workers, pct(off, .5), pct(off, .99), off[len(off)-1], pct(on, .5), pct(on, .99), on[len(on)-1])
	if deniedOff != n || deniedOn != n {
		t.Fatalf("denied %d (off) and %d (on) of %d, want all (fail closed)", deniedOff, deniedOn, n)
	}
	if p99on, p99off := pct(on, .99), pct(off, .99); p99on > p99off+p99off/2+25*time.Millisecond {
		t.Errorf("p99 with the stream %v, without %v: the stream slows the deny path", p99on, p99off)
	}
	if on[len(on)-1] > time.Second {
		t.Errorf("slowest request took %v with a 50ms timeout", on[len(on)-1])
	}
	// Every denial was either written or dropped and counted. A batch that
	// timed out may still have reached Redis once it resumed (it was on
	// the wire), so written + dropped can exceed the denials, never fall
	// short of them.
	waitFor(t, func() bool {
		return float64(entriesAdded(t, c, "rl:denials")-before)+allDroppedDenials(t)-dropped >= n
	})
	if w := entriesAdded(t, c, "rl:denials") - before; w > n {
		t.Errorf("%d entries written for %d denials", w, n)
	}
	t.Logf("written %d, dropped %v (error %v, buffer_full %v, breaker_open %v)",
		entriesAdded(t, c, "rl:denials")-before, allDroppedDenials(t)-dropped,
		droppedDenials(t, "error"), droppedDenials(t, "buffer_full"), droppedDenials(t, "breaker_open"))
}

// TestDenialStreamNoLeakAcrossReloads: reloads between stream configs keep
// one writer; unloading Redis stops it; no goroutines pile up.
func TestDenialStreamNoLeakAcrossReloads(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	c := srv.Client(t)
	site := func(maxlen int) string {
		return rateLimitBlock(srv.Addr, "", fmt.Sprintf("\t\tdenials_stream %d", maxlen),
			"policy api {\n\t\t\tlimit 1\n\t\t\twindow 1h\n\t\t}") + "\n\trespond \"ok\""
	}
	plain := "\trespond \"no limits\""
	s := startCaddy(t, "", plain, nil)
	s.get("/")
	testClient.CloseIdleConnections()
	before := stableGoroutines()
	denied := 0
	for i := range 10 {
		s.load("", site(100+i), nil)
		s.load("", site(200+i), nil) // reload with another maxlen: same writer
		if got := denialWriters(t); got != 1 {
			t.Fatalf("reload %d: %d writers, want 1", i, got)
		}
		if got := liveStreams()[0].MaxLen(); got != int64(200+i) {
			t.Errorf("reload %d: maxlen %d, want %d", i, got, 200+i)
		}
		for range 2 {
			if s.get("/", "X-Tenant", "acme").status == 429 {
				denied++
			}
		}
		s.load("", plain, nil) // no Redis: the backend and its writer go
		testClient.CloseIdleConnections()
		// The writer has finished when Release returns; its goroutine
		// may still be on its way out.
		waitFor(t, func() bool { return denialWriters(t) == 0 })
	}
	if denied != 19 {
		t.Errorf("%d denials, want 19 (limit 1 per hour, 20 requests)", denied)
	}
	// Destruct flushed the buffered denials before closing the client.
	if got := entriesAdded(t, c, "rl:denials"); got != int64(denied) {
		t.Errorf("%d entries, want %d", got, denied)
	}
	s.get("/")
	testClient.CloseIdleConnections()
	if after := stableGoroutines(); after > before+5 {
		t.Errorf("goroutines grew from %d to %d over 10 reload cycles", before, after)
	}
}
