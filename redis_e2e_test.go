package tollgate

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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
		if keys != "tg:sliding_window:{acme}:api" {
			t.Errorf("keys in db 3: %q, want tg:sliding_window:{acme}:api", keys)
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
// its fail mode, quickly, and the store error is logged once, not per
// request.
func TestRedisDownFailModes(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	logFile := t.TempDir() + "/caddy.log"
	block := func(mode string) string {
		return fmt.Sprintf(`
		rate_limit {
			redis {
				address %s
				timeout 50ms
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
	route /open {%s
		respond "ok"
	}
	route /closed {%s
		respond "ok"
	}
	route /local {%s
		respond "ok"
	}`, block("open"), block("closed"), block("local")), nil)

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
	// local: 70% of 10 on this instance's own bucket.
	if c := s.statuses(10, "/local", "X-Tenant", "acme"); c[200] != 7 || c[429] != 3 {
		t.Errorf("fail local: %v, want 7 x 200 and 3 x 429", c)
	}
	if elapsed := time.Since(start); elapsed > 3*time.Second {
		t.Errorf("32 requests with Redis down took %v", elapsed)
	}
	time.Sleep(100 * time.Millisecond)
	warnings := 0
	for _, l := range readJSONLines(t, logFile) {
		if strings.Contains(string(l), "rate limit store failed") {
			warnings++
		}
	}
	// One per handler at most within the throttle interval.
	if warnings < 1 || warnings > 3 {
		t.Errorf("%d store failure warnings, want 1 to 3 (throttled)", warnings)
	}

	// Redis back (empty): decisions go to Redis again.
	srv.Restart(t)
	waitFor(t, func() bool { return s.get("/closed", "X-Tenant", "other").status == 200 })
}
