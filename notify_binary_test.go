package tollgate

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// hookReceiver is a webhook receiver in the test: it verifies every
// delivery's signature and keeps the events.
type hookReceiver struct {
	secret string
	mu     sync.Mutex
	events []fleet.Event
	bad    int
}

func (rc *hookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if err := fleet.Verify(r.Header.Get("Tollgate-Signature"), rc.secret, body, time.Now(), time.Minute); err != nil {
		rc.bad++
	}
	var ev fleet.Event
	if json.Unmarshal(body, &ev) == nil && ev.Type == r.Header.Get("Tollgate-Event") {
		rc.events = append(rc.events, ev)
	}
	w.WriteHeader(http.StatusNoContent)
}

// names lists the events received as "type tenant threshold state",
// sorted.
func (rc *hookReceiver) names() []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []string
	for _, ev := range rc.events {
		parts := []string{ev.Type}
		if ev.Tenant != "" {
			parts = append(parts, ev.Tenant)
		}
		if ev.Threshold > 0 {
			parts = append(parts, fmt.Sprint(ev.Threshold))
		}
		if ev.State != "" {
			parts = append(parts, ev.State)
		}
		out = append(out, strings.Join(parts, " "))
	}
	sort.Strings(out)
	return out
}

const notifyFleetCaddyfile = `{
	admin 127.0.0.1:{ADMIN}
	auto_https off
}
:{PORT} {
	rate_limit {
		redis {REDIS}
		tenant {http.request.header.X-Tenant}
		notify {
			url {HOOK}
			secret {env.TOLLGATE_TEST_SECRET}
			events near_limit 0.5 0.9 exceeded override
			allow_private
			allow_private_tenants
		}
		policy api {
			algorithm fixed_window
			limit 10
			window 1h
		}
	}
	respond "ok"
}
`

// TestBinaryNotifyFleet: three instances on one Redis, tenants whose
// requests go round them. Each near_limit threshold and the exceeded
// event reach the receiver exactly once per tenant and period,
// fleet-wide, signed with the secret from the environment; a tenant's own
// webhook (a runtime override's notify_url) gets that tenant's events
// instead; an override change is an event too.
func TestBinaryNotifyFleet(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	const secret = "whsec-test-123"
	main, own := &hookReceiver{secret: secret}, &hookReceiver{secret: secret}
	hook, ownHook := "http://"+newHTTPServer(t, main), "http://"+newHTTPServer(t, own)
	cf := strings.NewReplacer("{REDIS}", srv.Addr, "{HOOK}", hook).Replace(notifyFleetCaddyfile)
	env := []string{"TOLLGATE_TEST_SECRET=" + secret}
	ps := []*caddyProcess{startCaddyProcessEnv(t, env, cf), startCaddyProcessEnv(t, env, cf), startCaddyProcessEnv(t, env, cf)}
	ps[0].caddyServer.admin = fmt.Sprintf("127.0.0.1:%d", ps[0].admin)
	// The events fire once per hour window: stay inside one.
	if now := time.Now(); now.Minute() == 59 && now.Second() > 30 {
		time.Sleep(time.Until(now.Truncate(time.Hour).Add(time.Hour + time.Second)))
	}
	ps[0].adminOK("PUT", "/rate_limit/overrides", `{"tenant":"nf_three","policy":"api","notify_url":"`+ownHook+`"}`)
	time.Sleep(1500 * time.Millisecond) // every instance has the override (1 s)
	for tenant, n := range map[string]int{"nf_one": 12, "nf_two": 6, "nf_three": 12} {
		for i := range n {
			r := ps[i%3].request("GET", "/", "X-Tenant", tenant)
			if want := http.StatusOK; i >= 10 {
				want = http.StatusTooManyRequests
				if r.status != want {
					t.Fatalf("%s request %d: %d", tenant, i+1, r.status)
				}
			} else if r.status != want {
				t.Fatalf("%s request %d: %d", tenant, i+1, r.status)
			}
		}
	}
	want := []string{"exceeded nf_one", "near_limit nf_one 0.5", "near_limit nf_one 0.9", "near_limit nf_two 0.5", "override nf_three set"}
	wantOwn := []string{"exceeded nf_three", "near_limit nf_three 0.5", "near_limit nf_three 0.9"}
	waitFor(t, func() bool { return len(main.names()) >= len(want) && len(own.names()) >= len(wantOwn) })
	time.Sleep(500 * time.Millisecond) // anything sent twice would be here by now
	if got := main.names(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("events\n got %q\nwant %q", got, want)
	}
	if got := own.names(); strings.Join(got, "|") != strings.Join(wantOwn, "|") {
		t.Errorf("the tenant's own webhook got\n %q\nwant %q", got, wantOwn)
	}
	if main.bad != 0 || own.bad != 0 {
		t.Errorf("%d and %d deliveries with a bad signature", main.bad, own.bad)
	}
	main.mu.Lock()
	defer main.mu.Unlock()
	for _, ev := range main.events {
		// 0.9 of 10: less than 1 left, that is none.
		if ev.Type == "near_limit" && ev.Tenant == "nf_one" && ev.Threshold == 0.9 {
			if ev.Limit != 10 || ev.Used != 10 || ev.Remaining == nil || *ev.Remaining != 0 || ev.Instance == "" || ev.ID == "" ||
				ev.PeriodStart != time.Now().UTC().Truncate(time.Hour).Format(time.RFC3339) {
				t.Errorf("near_limit 0.9 payload %+v", ev)
			}
		}
	}
}

// TestNotifyFailMode: an instance whose Redis stops answering sends
// fail_mode open when its breaker opens, and fail_mode closed when Redis
// is back (SIGSTOP, SIGCONT on a real redis-server).
func TestNotifyFailMode(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	rc := &hookReceiver{secret: "s"}
	hook := "http://" + newHTTPServer(t, rc)
	s := startCaddy(t, "", `
	rate_limit {
		redis {
			address `+srv.Addr+`
			timeout 100ms
			breaker_failures 1
			breaker_cooldown 200ms
		}
		tenant {http.request.header.X-Tenant}
		notify {
			url `+hook+`
			secret s
			events fail_mode
			allow_private
		}
		policy fm_api {
			limit 100
			window 1m
			fail open
		}
	}
	respond "ok"`, nil)
	if r := s.get("/", "X-Tenant", "acme"); r.status != http.StatusOK {
		t.Fatalf("status %d", r.status)
	}
	srv.Pause()
	if r := s.get("/", "X-Tenant", "acme"); r.status != http.StatusOK {
		t.Fatalf("fail open: status %d", r.status)
	}
	waitFor(t, func() bool { return strings.Join(rc.names(), "|") == "fail_mode open" })
	srv.Resume()
	waitFor(t, func() bool { return len(rc.names()) >= 2 })
	if got := rc.names(); strings.Join(got, "|") != "fail_mode closed|fail_mode open" || rc.bad != 0 {
		t.Fatalf("events %q, %d bad signatures", got, rc.bad)
	}
}
