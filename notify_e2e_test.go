package tollgate

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// ofType returns the events of type typ received so far.
func (rc *hookReceiver) ofType(typ string) []fleet.Event {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []fleet.Event
	for _, ev := range rc.events {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

// notifySite is a site whose rate_limit sends events (only those) to
// hook, with store ("" or "redis <addr>"), the handler's tenant line and
// policy.
func notifySite(store, tenant, hook, events, policy string) string {
	site := "\trate_limit {\n"
	for _, line := range []string{store, tenant} {
		if line != "" {
			site += "\t\t" + line + "\n"
		}
	}
	return site + `		notify {
			url ` + hook + `
			secret s
			events ` + events + `
			allow_private
		}
		` + policy + `
	}
	respond "ok"`
}

// TestNotifyPenaltyOncePerBox: a penalty box sends one penalty event, when
// the box starts (the tenant need not come back to be refused by it), and
// none for the requests the box refuses; a second box later sends a
// second event. On the embedded store and on Redis, where no marker is
// written for it (the instance that made the box is the only one that
// sends).
func TestNotifyPenaltyOncePerBox(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			rc := &hookReceiver{secret: "s"}
			hook := "http://" + newHTTPServer(t, rc)
			redis, tenant := "", "np-"+store
			if store == "redis" {
				redis = "redis " + srv.Addr
			}
			s := startCaddy(t, "", notifySite(redis, "tenant {http.request.header.X-Tenant}", hook, "penalty", `policy np_api {
			limit 2
			window 1h
			penalty 1s after 2
		}`), nil)
			expect := func(want int, what string) {
				t.Helper()
				if r := s.get("/", "X-Tenant", tenant); r.status != want {
					t.Fatalf("%s: status %d, want %d", what, r.status, want)
				}
			}
			expect(http.StatusOK, "request 1")
			expect(http.StatusOK, "request 2")
			expect(http.StatusTooManyRequests, "denial 1")
			boxedAt := time.Now()
			expect(http.StatusTooManyRequests, "denial 2 (boxes)")
			// Sent when the box starts: no request is refused by it yet.
			waitFor(t, func() bool { return len(rc.ofType("penalty")) >= 1 })
			for range 5 {
				expect(http.StatusTooManyRequests, "refused by the box")
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(300 * time.Millisecond) // a second event would be here by now
			if got := rc.ofType("penalty"); len(got) != 1 {
				t.Fatalf("%d penalty events for one box, want 1: %+v", len(got), got)
			}

			// The box ends; the bucket is still empty (1h window): two more
			// denials box the tenant again.
			sleepUntil(boxedAt.Add(1200 * time.Millisecond))
			expect(http.StatusTooManyRequests, "denial 1 after the box")
			expect(http.StatusTooManyRequests, "denial 2 after the box (boxes again)")
			waitFor(t, func() bool { return len(rc.ofType("penalty")) >= 2 })
			for range 3 {
				expect(http.StatusTooManyRequests, "refused by the second box")
			}
			time.Sleep(300 * time.Millisecond)
			got := rc.ofType("penalty")
			if len(got) != 2 {
				t.Fatalf("%d penalty events for two boxes, want 2: %+v", len(got), got)
			}
			for i, ev := range got {
				start, err1 := time.Parse(time.RFC3339, ev.PeriodStart)
				end, err2 := time.Parse(time.RFC3339, ev.PeriodEnd)
				if ev.Tenant != tenant || ev.Policy != "np_api" || ev.Limit != 2 || err1 != nil || err2 != nil || !end.After(start) || ev.Reset != ev.PeriodEnd {
					t.Errorf("penalty event %d: %+v", i+1, ev)
				}
			}
			if got[0].PeriodEnd > got[1].PeriodStart {
				t.Errorf("the second box (from %s) starts before the first ends (%s)", got[1].PeriodStart, got[0].PeriodEnd)
			}
			if rc.bad != 0 {
				t.Errorf("%d deliveries with a bad signature", rc.bad)
			}
			if store == "redis" {
				if keys := srv.CLI(t, "KEYS", "rl:notified:*"); keys != "" {
					t.Errorf("penalty events wrote markers: %q", keys)
				}
			}
		})
	}
}

// TestNotifyOncePerTenant: a policy partitioned by key inside the tenant
// sends near_limit and exceeded once per tenant, policy, threshold and
// period, however many of the tenant's keys cross them; another tenant
// gets its own. On the embedded store and on Redis (one marker per
// event).
func TestNotifyOncePerTenant(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			rc := &hookReceiver{secret: "s"}
			hook := "http://" + newHTTPServer(t, rc)
			redis := ""
			if store == "redis" {
				redis = "redis " + srv.Addr
			}
			s := startCaddy(t, "", notifySite(redis, "tenant {http.request.header.X-Tenant}", hook, "near_limit 0.5 exceeded", `policy nt_api {
			key {http.request.header.X-Key}
			limit 2
			window 1h
		}`), nil)
			// The events fire once per hour window: stay inside one.
			if now := time.Now(); now.Minute() == 59 && now.Second() > 50 {
				sleepUntil(now.Truncate(time.Hour).Add(time.Hour + time.Second))
			}
			one, two := "nt-one-"+store, "nt-two-"+store
			for _, c := range []struct{ tenant, key string }{{one, "a"}, {one, "b"}, {one, "c"}, {two, "a"}} {
				for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
					if r := s.get("/", "X-Tenant", c.tenant, "X-Key", c.key); r.status != want {
						t.Fatalf("%s/%s request %d: %d, want %d", c.tenant, c.key, i+1, r.status, want)
					}
				}
			}
			want := []string{"exceeded " + one, "exceeded " + two, "near_limit " + one + " 0.5", "near_limit " + two + " 0.5"}
			waitFor(t, func() bool { return len(rc.names()) >= len(want) })
			time.Sleep(300 * time.Millisecond) // anything sent twice would be here by now
			if got := rc.names(); strings.Join(got, "|") != strings.Join(want, "|") {
				t.Errorf("events\n got %q\nwant %q", got, want)
			}
			if store == "redis" {
				keys := strings.Fields(srv.CLI(t, "KEYS", "rl:notified:*"))
				if len(keys) != len(want) {
					t.Errorf("markers %q, want one per event", keys)
				}
			}
		})
	}
}

// TestNearLimitBoundary: near_limit 0.8 of a limit of 10 means less than
// 2 units left, for the near_limit metric and the near_limit webhook
// alike: 3 left is not near, 2 left (exactly 20%) is not, 1 left is. It is
// measured against the limit, not a token bucket's burst: with burst 20,
// near is still less than 2 left (not less than 4).
func TestNearLimitBoundary(t *testing.T) {
	rc := &hookReceiver{secret: "s"}
	hook := "http://" + newHTTPServer(t, rc)
	s := startCaddy(t, "", metricsSite(`
			tenant {http.request.header.X-Tenant}
			notify {
				url `+hook+`
				secret s
				events near_limit
				allow_private
			}
			policy nb_fixed {
				match {
					path /fixed
				}
				limit 10
				window 1h
			}
			policy nb_bucket {
				match {
					path /bucket
				}
				algorithm token_bucket
				limit 10
				burst 20
				window 1h
			}`), nil)
	// The events fire once per hour window: stay inside one.
	if now := time.Now(); now.Minute() == 59 && now.Second() > 50 {
		sleepUntil(now.Truncate(time.Hour).Add(time.Hour + time.Second))
	}
	for _, tc := range []struct {
		policy, path string
		capacity     int
	}{{"nb_fixed", "/fixed", 10}, {"nb_bucket", "/bucket", 20}} {
		tenant := "nb-" + tc.policy
		before := scrapeMetrics(t, s.base+"/metrics")
		near := func() float64 {
			return scrapeMetrics(t, s.base+"/metrics").delta(before, "caddy_rate_limit_near_limit_total", "policy", tc.policy)
		}
		if c := s.statuses(tc.capacity-3, tc.path, "X-Tenant", tenant); c[http.StatusOK] != tc.capacity-3 {
			t.Fatalf("%s: %v", tc.policy, c)
		}
		// 3 left now; then one request at a time: 2, 1, 0 left.
		for i, step := range []struct {
			left int
			near float64
		}{{3, 0}, {2, 0}, {1, 1}, {0, 2}} {
			if i > 0 {
				if r := s.get(tc.path, "X-Tenant", tenant); r.status != http.StatusOK {
					t.Fatalf("%s: status %d", tc.policy, r.status)
				}
			}
			if got := near(); got != step.near {
				t.Errorf("%s: %d left: near_limit_total grew by %v, want %v", tc.policy, step.left, got, step.near)
			}
		}
	}
	waitFor(t, func() bool { return len(rc.ofType("near_limit")) >= 2 })
	time.Sleep(300 * time.Millisecond)
	got := map[string]fleet.Event{}
	for _, ev := range rc.ofType("near_limit") {
		if _, dup := got[ev.Policy]; dup {
			t.Errorf("near_limit sent twice for %s", ev.Policy)
		}
		got[ev.Policy] = ev
	}
	for policy, used := range map[string]int64{"nb_fixed": 9, "nb_bucket": 19} {
		ev := got[policy]
		if ev.Threshold != 0.8 || ev.Remaining == nil || *ev.Remaining != 1 || ev.Used != used || ev.Limit != 10 {
			t.Errorf("%s: near_limit event %+v, want it at 1 left (used %d)", policy, ev, used)
		}
	}
}

// TestNotifyTenantURLNotPrivate: allow_private lets the operator's
// receiver be inside the network, not a tenant's own URL (a runtime
// override's notify_url): a tenant whose URL is a loopback address gets
// nothing sent there unless allow_private_tenants; with it, it does.
// (The tenant's URL inherited allow_private: anyone who could set one
// reached internal services.)
func TestNotifyTenantURLNotPrivate(t *testing.T) {
	for extra, want := range map[string]int{"": 0, "allow_private_tenants": 1} {
		t.Run("with "+extra, func(t *testing.T) {
			operator, internal := &hookReceiver{secret: "s"}, &hookReceiver{secret: "s"}
			hook, internalURL := "http://"+newHTTPServer(t, operator), "http://"+newHTTPServer(t, internal)+"/admin/internal"
			site := notifySite("", "tenant {http.request.header.X-Tenant}", hook, "exceeded", `policy nt_p {
			limit 1
			window 1h
		}`)
			if extra != "" {
				site = strings.Replace(site, "allow_private\n", "allow_private\n\t\t\t"+extra+"\n", 1)
			}
			s := startCaddyAdmin(t, "", site, nil)
			s.adminOK("PUT", "/rate_limit/overrides", `{"tenant":"nt_tenant","policy":"nt_p","notify_url":"`+internalURL+`"}`)
			s.get("/", "X-Tenant", "nt_tenant")
			if r := s.get("/", "X-Tenant", "nt_tenant"); r.status != http.StatusTooManyRequests {
				t.Fatalf("second request %d, want 429", r.status)
			}
			if want > 0 {
				waitFor(t, func() bool { return len(internal.ofType("exceeded")) >= want })
			} else {
				time.Sleep(500 * time.Millisecond) // a delivery would have come by now
			}
			if got := len(internal.ofType("exceeded")); got != want {
				t.Errorf("the tenant's loopback URL got %d exceeded events, want %d", got, want)
			}
			if got := len(operator.ofType("exceeded")); got != 0 {
				t.Errorf("the operator's receiver got %d of the tenant's events, want 0", got)
			}
		})
	}
}

// TestNotifyEmbeddedReload: on the embedded store, a config reload does
// not send again the events the config before it sent this period (the
// table of events fired is the process's, like the store). (Every reload
// sent them again, each with a new id.)
func TestNotifyEmbeddedReload(t *testing.T) {
	rc := &hookReceiver{secret: "s"}
	hook := "http://" + newHTTPServer(t, rc)
	site := func(body string) string {
		return strings.Replace(notifySite("", "tenant {http.request.header.X-Tenant}", hook, "near_limit 0.5 exceeded", `policy rl_n {
			limit 10
			window 1h
		}`), `respond "ok"`, `respond "`+body+`"`, 1)
	}
	if now := time.Now(); now.Minute() == 59 && now.Second() > 40 {
		sleepUntil(now.Truncate(time.Hour).Add(time.Hour + time.Second))
	}
	s := startCaddy(t, "", site("ok"), nil)
	for range 6 {
		s.get("/", "X-Tenant", "rl_reload")
	}
	waitFor(t, func() bool { return len(rc.ofType("near_limit")) >= 1 })
	s.load("", site("ok2"), nil) // any reload: a changed route, a new site...
	s.get("/", "X-Tenant", "rl_reload")
	time.Sleep(500 * time.Millisecond) // a second delivery would have come by now
	if got := rc.ofType("near_limit"); len(got) != 1 {
		t.Errorf("near_limit sent %d times for one tenant, threshold and period, across a reload; want 1", len(got))
	}
}
