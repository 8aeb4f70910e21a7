package tollgate

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// redisSite is a site with one policy of limit 3 per hour per tenant on
// the Redis store configured by the given redis block body.
func redisSite(redisBody string, limit int) string {
	return fmt.Sprintf(`
	rate_limit {
		redis {
%s
		}
		tenant {http.request.header.X-Tenant}
		policy api {
			limit %d
			window 1h
		}
	}
	respond "ok"`, redisBody, limit)
}

// tollgateConnections counts the server's client connections named by
// Tollgate's client (CLIENT SETNAME tollgate).
func tollgateConnections(t *testing.T, c *redis.Client) int {
	t.Helper()
	list, err := c.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(list, "name=tollgate ")
}

// TestRedisClientSharedAcrossReloads: reloads reuse the one client, the
// connection count stays flat over 20 reloads, counters survive, and the
// client is closed when the config is unloaded.
func TestRedisClientSharedAcrossReloads(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	admin := srv.Client(t)
	body := "\t\t\taddress " + srv.Addr
	s := startCaddy(t, "", redisSite(body, 3), nil)
	if c := s.statuses(2, "/", "X-Tenant", "acme"); c[200] != 2 {
		t.Fatalf("before reloads: %v", c)
	}
	before := tollgateConnections(t, admin)
	if before == 0 {
		t.Fatal("no connection named tollgate after traffic")
	}
	for i := range 20 {
		s.load("", redisSite(body, 3), nil)
		s.get("/", "X-Tenant", fmt.Sprintf("t%d", i))
	}
	if after := tollgateConnections(t, admin); after > before+1 {
		t.Errorf("tollgate connections grew from %d to %d over 20 reloads", before, after)
	}
	if c := s.statuses(2, "/", "X-Tenant", "acme"); c[200] != 1 || c[429] != 1 {
		t.Errorf("after reloads: %v, want 1 more admitted (counters live in Redis)", c)
	}
	// Unloading the last config closes the client.
	s.load("", "\trespond \"no limits\"", nil)
	waitFor(t, func() bool { return tollgateConnections(t, admin) == 0 })
}

// TestRedisConnectionOptions: ACL user with the password from an
// environment placeholder, db and key_prefix, TLS with client
// certificates, and Sentinel.
func TestRedisConnectionOptions(t *testing.T) {
	t.Run("acl_env_password_db_prefix", func(t *testing.T) {
		srv := redistest.StartStandalone(t, redistest.Options{ACLUsers: []string{"user limiter on >s3cret ~* +@all"}})
		t.Setenv("TOLLGATE_TEST_REDIS_PASSWORD", "s3cret")
		s := startCaddy(t, "", redisSite(fmt.Sprintf(`			address %s
			username limiter
			password {env.TOLLGATE_TEST_REDIS_PASSWORD}
			db 3
			key_prefix tg`, srv.Addr), 2), nil)
		if c := s.statuses(3, "/", "X-Tenant", "acme"); c[200] != 2 || c[429] != 1 {
			t.Fatalf("%v, want 2 x 200 and 1 x 429", c)
		}
		keys := srv.CLI(t, "--user", "limiter", "--pass", "s3cret", "-n", "3", "--no-auth-warning", "KEYS", "*")
		got := strings.Fields(keys)
		slices.Sort(got)
		if want := []string{"tg:instances", "tg:sliding_window:{acme}:api"}; !slices.Equal(got, want) {
			t.Errorf("keys in db 3: %q, want %q (the bucket and the instance registry)", got, want)
		}
	})
	t.Run("tls", func(t *testing.T) {
		srv := redistest.StartStandalone(t, redistest.Options{TLS: true})
		s := startCaddy(t, "", redisSite(fmt.Sprintf(`			address %s
			tls {
				ca %s
				cert %s
				key %s
			}`, srv.Addr, srv.TLS.CA, srv.TLS.ClientCert, srv.TLS.ClientKey), 2), nil)
		if c := s.statuses(3, "/", "X-Tenant", "acme"); c[200] != 2 || c[429] != 1 {
			t.Fatalf("%v, want 2 x 200 and 1 x 429", c)
		}
	})
	t.Run("sentinel", func(t *testing.T) {
		sen := redistest.StartSentinel(t)
		s := startCaddy(t, "", redisSite(fmt.Sprintf(`			address %s
			sentinel %s`, strings.Join(sen.SentinelAddrs, " "), sen.MasterName), 2), nil)
		if c := s.statuses(3, "/", "X-Tenant", "acme"); c[200] != 2 || c[429] != 1 {
			t.Fatalf("%v, want 2 x 200 and 1 x 429", c)
		}
		if got := sen.Master.CLI(t, "EXISTS", "rl:sliding_window:{acme}:api"); got != "1" {
			t.Errorf("key not on the master: EXISTS = %q", got)
		}
	})
}

// TestRedisDownFailModes: with redis-server killed, each policy follows
// its fail mode, quickly; the breaker opens once (one WARN, gauge 1) and
// closes once Redis is back (one INFO, gauge 0).
func TestRedisDownFailModes(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	logFile := t.TempDir() + "/caddy.log"
	block := func(mode string) string {
		return fmt.Sprintf(`
		rate_limit {
			redis {
				address %s
				timeout 50ms
				breaker_cooldown 300ms
			}
			tenant {http.request.header.X-Tenant}
			fail %s
			policy api_%s {
				limit 10
				window 1h
			}
		}`, srv.Addr, mode, mode)
	}
	s := startCaddy(t, fmt.Sprintf("\tlog {\n\t\toutput file %s\n\t\tformat json\n\t}", logFile), fmt.Sprintf(`
	route /metrics {
		metrics
	}
	route /open {%s
		respond "ok"
	}
	route /closed {%s
		respond "ok"
	}
	route /local {%s
		respond "ok"
	}`, block("open"), block("closed"), block("local")), nil)
	breakerGauge := func() string {
		for l := range strings.SplitSeq(s.get("/metrics").body, "\n") {
			if strings.HasPrefix(l, "caddy_rate_limit_breaker_open ") {
				return strings.TrimPrefix(l, "caddy_rate_limit_breaker_open ")
			}
		}
		return "missing"
	}

	// Warm up until Redis itself answers (remaining 9 of 10): the cold
	// first call (dial, SETNAME, NOSCRIPT, EVAL) may miss a 50ms deadline
	// on a loaded machine, and would then be decided by fail mode.
	for _, route := range []string{"/open", "/closed", "/local"} {
		poll := 0
		waitFor(t, func() bool {
			poll++
			r := s.get(route, "X-Tenant", fmt.Sprintf("warm-%d", poll))
			return r.header.Get("X-RateLimit-Remaining") == "9"
		})
	}
	// Redis up: every mode enforces the shared limit.
	if c := s.statuses(3, "/closed", "X-Tenant", "acme"); c[200] != 3 {
		t.Fatalf("redis up: %v", c)
	}
	srv.Kill()

	start := time.Now()
	if c := s.statuses(20, "/open", "X-Tenant", "acme"); c[200] != 20 {
		t.Errorf("fail open: %v, want 20 x 200", c)
	}
	if r := s.get("/open", "X-Tenant", "acme"); r.header.Get("RateLimit") != "" {
		t.Errorf("fail open wrote quota headers it cannot know: %q", r.header.Get("RateLimit"))
	}
	r := s.get("/closed", "X-Tenant", "acme")
	if r.status != 429 || r.header.Get("Retry-After") != "1" {
		t.Errorf("fail closed: %d Retry-After %q, want 429 and 1", r.status, r.header.Get("Retry-After"))
	}
	// local: 70% of 10 on this instance's own bucket (one live instance).
	if c := s.statuses(10, "/local", "X-Tenant", "acme"); c[200] != 7 || c[429] != 3 {
		t.Errorf("fail local: %v, want 7 x 200 and 3 x 429", c)
	}
	if elapsed := time.Since(start); elapsed > 3*time.Second {
		t.Errorf("32 requests with Redis down took %v", elapsed)
	}
	if g := breakerGauge(); g != "1" {
		t.Errorf("caddy_rate_limit_breaker_open = %s during the outage, want 1", g)
	}

	// Redis back (empty): the breaker closes after its cooldown and
	// decisions go to Redis again.
	srv.Restart(t)
	waitFor(t, func() bool { return s.get("/closed", "X-Tenant", "other").status == 200 })
	if g := breakerGauge(); g != "0" {
		t.Errorf("caddy_rate_limit_breaker_open = %s after recovery, want 0", g)
	}
	time.Sleep(100 * time.Millisecond)
	opened := countLogLines(t, logFile, "circuit breaker open")
	closed := countLogLines(t, logFile, "circuit breaker closed")
	// The three routes share one backend: one breaker, one line each way.
	if opened != 1 || closed != 1 {
		t.Errorf("breaker log lines: %d open, %d closed; want 1 and 1", opened, closed)
	}

	// Recovery accounting: the 7 units admitted locally are charged to
	// the (restarted, empty) Redis, so acme has 3 left, not a fresh 10.
	waitFor(t, func() bool {
		return countLogLines(t, logFile, "charged Redis for units admitted during the outage") > 0
	})
	if c := s.statuses(5, "/local", "X-Tenant", "acme"); c[200] != 3 || c[429] != 2 {
		t.Errorf("after recovery: %v, want 3 x 200 and 2 x 429 (outage units charged back)", c)
	}
}

// TestRedisHungBoundedLatency: a SIGSTOPped Redis never holds a request
// much longer than the deadline; once the breaker opens requests do not
// wait at all; SIGCONT brings decisions back to Redis.
func TestRedisHungBoundedLatency(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	s := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		redis {
			address %s
			timeout 50ms
			breaker_cooldown 300ms
		}
		tenant {http.request.header.X-Tenant}
		policy api {
			limit 1000
			window 1h
		}
	}
	respond "ok"`, srv.Addr), nil)
	if r := s.get("/", "X-Tenant", "acme"); r.status != 200 {
		t.Fatalf("redis up: %d", r.status)
	}
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	var slowest time.Duration
	var fastAfterOpen int
	for i := range 30 {
		start := time.Now()
		r := s.get("/", "X-Tenant", "acme")
		took := time.Since(start)
		slowest = max(slowest, took)
		if r.status != 200 {
			t.Fatalf("request %d during the hang: %d, want 200 (fail local)", i, r.status)
		}
		if i >= 5 && took < 20*time.Millisecond {
			fastAfterOpen++
		}
	}
	t.Logf("slowest request with Redis hung (timeout 50ms): %v", slowest)
	if slowest > 250*time.Millisecond {
		t.Errorf("slowest request took %v with a 50ms Redis timeout", slowest)
	}
	if fastAfterOpen < 20 {
		t.Errorf("only %d of 25 requests after the breaker opened were fast (< 20ms)", fastAfterOpen)
	}
	srv.Resume()
	resumed = true
	// A new tenant per poll: one answered by the fallback would be charged
	// to Redis later and skew the next poll.
	poll := 0
	waitFor(t, func() bool {
		poll++
		r := s.get("/", "X-Tenant", fmt.Sprintf("fresh-%d", poll))
		return r.status == 200 && r.header.Get("X-RateLimit-Remaining") == "999"
	})
}

// TestRedisLogsThroughCaddy: go-redis's own log lines go through Caddy's
// logger as JSON (logger "redis"), and the breaker's warning names the
// cause: connection refused when nothing listens, timeout when Redis
// stalls.
func TestRedisLogsThroughCaddy(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	globals := "\tlog {\n\t\toutput file " + logFile + "\n\t\tformat json\n\t}"
	down := freePort(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	s := startCaddy(t, globals, fmt.Sprintf(`
	route /down* {
		rate_limit {
			redis {
				address 127.0.0.1:%d
				breaker_failures 1
				key_prefix down
			}
			tenant {http.request.header.X-Tenant}
			policy api {
				limit 10
				window 1m
			}
		}
		respond "down"
	}
	route /stalled* {
		rate_limit {
			redis {
				address %s
				breaker_failures 1
				timeout 50ms
			}
			tenant {http.request.header.X-Tenant}
			policy api2 {
				limit 10
				window 1m
			}
		}
		respond "stalled"
	}`, down, srv.Addr), nil)
	gate.ClearRedisLogThrottle() // other tests' lines must not throttle this one's
	s.get("/down", "X-Tenant", "a")
	waitFor(t, func() bool {
		return countLogLines(t, logFile, `"logger":"http.handlers.rate_limit","msg":"rate limit store unreachable (connection refused)`) > 0
	})
	waitFor(t, func() bool { return countLogLines(t, logFile, `"logger":"redis"`) > 0 })
	s.get("/stalled", "X-Tenant", "a") // the script is loaded
	srv.Pause()
	defer srv.Resume()
	s.get("/stalled", "X-Tenant", "a")
	waitFor(t, func() bool {
		return countLogLines(t, logFile, `"msg":"rate limit store unreachable (timeout)`) > 0
	})
}

// TestSharedBackendPerHandlerHooks: handlers share one Redis backend (same
// connection and prefix), but the backend does not keep the choices of
// the handler that created it. A `disable_metrics` on the first handler
// does not silence the redis_* metrics of the others, and after a reload
// the backend logs through the new config's logger, not the unloaded one.
func TestSharedBackendPerHandlerHooks(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	dir := t.TempDir()
	logAt := func(file string) string {
		return fmt.Sprintf("\tlog rl {\n\t\toutput file %s/%s\n\t\tinclude http.handlers.rate_limit\n\t\tformat json\n\t}\n\tlog default {\n\t\toutput discard\n\t\texclude http.handlers.rate_limit\n\t}", dir, file)
	}
	site := fmt.Sprintf(`
	handle /metrics {
		metrics
	}
	route /quiet* {
		rate_limit {
			redis {
				address %[1]s
				breaker_failures 1
				timeout 50ms
			}
			tenant {http.request.header.X-Tenant}
			disable_metrics
			policy quiet {
				limit 100
				window 1h
			}
		}
		respond "quiet"
	}
	route /loud* {
		rate_limit {
			redis {
				address %[1]s
				breaker_failures 1
				timeout 50ms
			}
			tenant {http.request.header.X-Tenant}
			policy loud {
				limit 100
				window 1h
			}
		}
		respond "loud"
	}`, srv.Addr)
	s := startCaddy(t, logAt("first.log"), site, nil)
	before := scrapeMetrics(t, s.base+"/metrics")
	for range 5 {
		if res := s.get("/loud", "X-Tenant", "a"); res.status != http.StatusOK {
			t.Fatalf("status %d", res.status)
		}
	}
	m := scrapeMetrics(t, s.base+"/metrics")
	if got := m.delta(before, "caddy_rate_limit_redis_calls_total", "script", "decide", "result", "ok") +
		m.delta(before, "caddy_rate_limit_redis_calls_total", "script", "decide", "result", "noscript"); got < 5 {
		t.Errorf("decide calls counted: %v, want at least 5 (the metrics of /loud's handler)", got)
	}

	// Reload with the log in another file; then Redis goes away and the
	// breaker's WARN must reach the new file only.
	s.load(logAt("second.log"), site, nil)
	srv.Stop()
	s.get("/loud", "X-Tenant", "a")
	waitFor(t, func() bool { return countLogLines(t, dir+"/second.log", "circuit breaker open") > 0 })
	if n := countLogLines(t, dir+"/first.log", "circuit breaker open"); n != 0 {
		t.Errorf("the unloaded config's log got %d breaker lines", n)
	}
}
