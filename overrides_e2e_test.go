package tollgate

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// ovrSite is a site with two policies of 100 per hour on the Redis at
// addr: api (every request) and web (/web only).
func ovrSite(addr string) string {
	return fmt.Sprintf(`
	rate_limit {
		redis {
			address %s
		}
		tenant {http.request.header.X-Tenant}
		policy api {
			limit 100
			window 1h
		}
		policy web {
			match {
				path /web
			}
			limit 100
			window 1h
		}
	}
	respond "ok"`, addr)
}

// commandStats returns the calls of every command in INFO commandstats.
func commandStats(t *testing.T, c *redis.Client) map[string]int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for l := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":calls=")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", l, err)
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return out
}

// TestOverridesIdleRedisCost: an idle Caddy on a Redis holding a million
// unrelated keys makes at most 10 Redis commands a second, and no SCAN.
func TestOverridesIdleRedisCost(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{Args: []string{"--enable-debug-command", "yes"}})
	c := srv.Client(t)
	ctx := context.Background()
	if err := c.Do(ctx, "DEBUG", "POPULATE", 1000000, "unrelated").Err(); err != nil {
		t.Fatal(err)
	}
	if n := c.DBSize(ctx).Val(); n != 1000000 {
		t.Fatalf("DBSIZE %d after DEBUG POPULATE", n)
	}
	// One override, so reloads have something to read.
	s := startCaddyAdmin(t, "", ovrSite(srv.Addr), nil)
	s.adminOK("PUT", "/rate_limit/overrides", `{"tenant":"idle","policy":"api","max_events":5}`)
	if r := s.get("/", "X-Tenant", "idle"); r.status != 200 || r.header.Get("X-RateLimit-Limit") != "5" {
		t.Fatalf("request with the override: %d, limit %q", r.status, r.header.Get("X-RateLimit-Limit"))
	}
	time.Sleep(1200 * time.Millisecond) // settle

	before := commandStats(t, c)
	start := time.Now()
	time.Sleep(3 * time.Second)
	after := commandStats(t, c)
	elapsed := time.Since(start)

	var total int64
	var lines []string
	for name, n := range after {
		if d := n - before[name]; d > 0 {
			total += d
			lines = append(lines, fmt.Sprintf("%s=%d", name, d))
		}
	}
	sort.Strings(lines)
	total-- // the first INFO (the second one counts itself only after it ran)
	rate := float64(total) / elapsed.Seconds()
	t.Logf("idle for %v: %d commands (%.2f/s) besides the test's INFO: %s", elapsed.Round(time.Millisecond), total, rate, strings.Join(lines, " "))
	if d := after["scan"] - before["scan"]; d != 0 {
		t.Errorf("%d SCAN calls while idle, want 0", d)
	}
	if rate > 10 {
		t.Errorf("%.1f Redis commands/s while idle, want at most 10", rate)
	}
}

// writeOverrideLikeAdmin writes an override the way the admin API does,
// but publishes nothing: HSET, SADD to the index, INCR of the version.
func writeOverrideLikeAdmin(t *testing.T, c *redis.Client, tenant, policy, value string) {
	t.Helper()
	ctx := context.Background()
	for _, err := range []error{
		c.HSet(ctx, "rl:ovr:{"+tenant+"}", policy, value).Err(),
		c.SAdd(ctx, "rl:ovr-index", tenant).Err(),
		c.Incr(ctx, "rl:ovr-version").Err(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestOverridesPropagateWithoutPubSub: an override written to Redis with
// no message on <prefix>:events reaches a running instance through the
// version poll, within about a second. SCAN is denied to the Redis user,
// so no scanning reload can find it either.
func TestOverridesPropagateWithoutPubSub(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{ACLUsers: []string{"default on nopass ~* &* +@all -scan"}})
	c := srv.Client(t)
	ctx := context.Background()
	if err := c.Scan(ctx, 0, "*", 10).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("SCAN not denied: %v", err)
	}
	s := startCaddy(t, "", ovrSite(srv.Addr), nil)
	limit := func(tenant string) string { return s.get("/", "X-Tenant", tenant).header.Get("X-RateLimit-Limit") }
	if l := limit("quiet"); l != "100" {
		t.Fatalf("limit before the override: %q, want 100", l)
	}
	time.Sleep(1500 * time.Millisecond) // past the initial loads

	for round, want := range []string{"7", "3"} {
		writeOverrideLikeAdmin(t, c, "quiet", "api", `{"tenant":"quiet","policy":"api","max_events":`+want+`}`)
		start := time.Now()
		for limit("quiet") != want {
			if time.Since(start) > 3*time.Second {
				t.Fatalf("round %d: override of %s not applied within 3s", round, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("round %d: override applied after %v without pub/sub", round, time.Since(start).Round(time.Millisecond))
	}
}

// TestOverridesIndexOnDelete: the index holds a tenant while it has an
// override and loses it with its last one; every change bumps the
// version.
func TestOverridesIndexOnDelete(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	c := srv.Client(t)
	ctx := context.Background()
	s := startCaddyAdmin(t, "", ovrSite(srv.Addr), nil)
	// The index holds the tenant as escaped in keys.
	indexed := func() bool { return c.SIsMember(ctx, "rl:ovr-index", "a%3Ab").Val() }
	version := func() int64 { v, _ := c.Get(ctx, "rl:ovr-version").Int64(); return v }

	v0 := version()
	s.adminOK("PUT", "/rate_limit/overrides", `{"tenant":"a:b","policy":"api","max_events":5}`)
	s.adminOK("PUT", "/rate_limit/overrides", `{"tenant":"a:b","policy":"web","max_events":5}`)
	if !indexed() || c.HLen(ctx, "rl:ovr:{a%3Ab}").Val() != 2 {
		t.Fatalf("after two PUTs: indexed %v, hash %v", indexed(), c.HGetAll(ctx, "rl:ovr:{a%3Ab}").Val())
	}
	s.adminOK("DELETE", "/rate_limit/overrides?tenant=a:b&policy=api", "")
	if !indexed() {
		t.Fatal("tenant left the index with an override left")
	}
	s.adminOK("DELETE", "/rate_limit/overrides?tenant=a:b&policy=web", "")
	if indexed() || c.Exists(ctx, "rl:ovr:{a%3Ab}").Val() != 0 {
		t.Fatalf("after the last DELETE: indexed %v, members %v", indexed(), c.SMembers(ctx, "rl:ovr-index").Val())
	}
	if v := version(); v != v0+4 {
		t.Fatalf("version %d after 4 changes from %d", v, v0)
	}
}

// TestOverridesReloadFailureLogged: with Redis down the failed reloads are
// logged at WARN once (not every second), and at INFO once when Redis is
// back.
func TestOverridesReloadFailureLogged(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	logFile := t.TempDir() + "/caddy.log"
	s := startCaddy(t, fmt.Sprintf("\tlog {\n\t\toutput file %s\n\t\tformat json\n\t}", logFile), ovrSite(srv.Addr), nil)
	if r := s.get("/", "X-Tenant", "x"); r.status != 200 {
		t.Fatal(r.status)
	}
	time.Sleep(500 * time.Millisecond)
	const failedMsg, backMsg = "runtime overrides: reading them from Redis failed", "runtime overrides: reading them from Redis works again"
	srv.Stop()
	time.Sleep(4500 * time.Millisecond)
	warns := 0
	for _, l := range readJSONLines(t, logFile) {
		if strings.Contains(string(l), failedMsg) {
			warns++
			if !strings.Contains(string(l), `"level":"warn"`) {
				t.Errorf("not a WARN: %s", l)
			}
		}
	}
	if warns != 1 {
		t.Fatalf("%d WARN lines about failed reloads in 4.5s with Redis down, want 1", warns)
	}
	srv.Restart(t)
	waitFor(t, func() bool { return countLogLines(t, logFile, backMsg) == 1 })
	time.Sleep(1500 * time.Millisecond)
	if n := countLogLines(t, logFile, failedMsg); n != 1 {
		t.Errorf("%d WARN lines after Redis came back, want still 1", n)
	}
	if n := countLogLines(t, logFile, backMsg); n != 1 {
		t.Errorf("%d INFO lines about Redis being back, want 1", n)
	}
}
