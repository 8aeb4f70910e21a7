package tollgate

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// quotaSite is a site with a monthly quota in New York and a daily one in
// Berlin, on the store the redis line configures ("" = embedded).
const quotaSite = `
	rate_limit {%s
		tenant {http.request.header.X-Tenant}
		tier {http.request.header.X-Plan}
		policy monthly {
			calendar month America/New_York
			limit 3
			tier pro 5
			tier trial 2 1h
		}
		policy daily {
			calendar day Europe/Berlin
			limit 100
		}
	}
	respond "ok"`

// nyMonth is the current month in New York, computed without Tollgate.
func nyMonth(t *testing.T, now time.Time) (start, end time.Time) {
	t.Helper()
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	lt := now.In(ny)
	return time.Date(lt.Year(), lt.Month(), 1, 0, 0, 0, 0, ny), time.Date(lt.Year(), lt.Month()+1, 1, 0, 0, 0, 0, ny)
}

// headerSeconds reads key=N from a RateLimit header item.
func headerSeconds(t *testing.T, header, key string) int64 {
	t.Helper()
	for _, part := range strings.Split(header, ";") {
		if v, ok := strings.CutPrefix(part, key+"="); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%s in %q: %v", key, header, err)
			}
			return n
		}
	}
	t.Fatalf("no %s= in %q", key, header)
	return 0
}

// near reports whether got is within slack seconds of want.
func near(got int64, want float64, slack float64) bool {
	return math.Abs(float64(got)-want) <= slack
}

// TestCalendarQuotaE2E: on the embedded store and on Redis, a monthly
// quota in New York sends RateLimit-Policy w= the length of this month
// in New York, counts t=, X-RateLimit-Reset and Retry-After to the start
// of the next one; the admin API shows the calendar period and the
// quota; runtime overrides keep the period and may not set a window.
func TestCalendarQuotaE2E(t *testing.T) {
	if start, end := nyMonth(t, time.Now()); time.Since(start) < time.Minute || time.Until(end) < time.Minute {
		t.Skip("too close to a month boundary in New York")
	}
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			redisLine := ""
			if store == "redis" {
				srv := redistest.StartStandalone(t, redistest.Options{})
				redisLine = "\n\t\tredis " + srv.Addr
			}
			s := startCaddyAdmin(t, "", fmt.Sprintf(quotaSite, redisLine), nil)
			tenant := "acme-" + store
			start, end := nyMonth(t, time.Now())
			month := end.Sub(start).Seconds()
			for i := 1; i <= 3; i++ {
				r := s.get("/", "X-Tenant", tenant)
				if r.status != 200 {
					t.Fatalf("request %d: %d", i, r.status)
				}
				if got := r.header.Get("RateLimit-Policy"); got != fmt.Sprintf(`"monthly";q=3;w=%d`, int64(month)) {
					t.Fatalf("RateLimit-Policy %q, want w=%d (this month in New York)", got, int64(month))
				}
				rl := r.header.Get("RateLimit")
				if !strings.HasPrefix(rl, fmt.Sprintf(`"monthly";r=%d;`, 3-i)) || !near(headerSeconds(t, rl, "t"), time.Until(end).Seconds(), 2) {
					t.Fatalf("request %d: RateLimit %q, want r=%d, t about %.0f", i, rl, 3-i, time.Until(end).Seconds())
				}
				if reset, _ := strconv.ParseInt(r.header.Get("X-RateLimit-Reset"), 10, 64); !near(reset, time.Until(end).Seconds(), 2) {
					t.Fatalf("X-RateLimit-Reset %d, want about %.0f", reset, time.Until(end).Seconds())
				}
			}
			r := s.get("/", "X-Tenant", tenant)
			retry, _ := strconv.ParseInt(r.header.Get("Retry-After"), 10, 64)
			if r.status != 429 || !near(retry, time.Until(end).Seconds(), 2) {
				t.Fatalf("4th request: %d, Retry-After %d, want 429 and about %.0f (next month in New York)", r.status, retry, time.Until(end).Seconds())
			}
			// A tier keeps the period; a tier with a window has its own.
			if r := s.get("/", "X-Tenant", tenant+"-pro", "X-Plan", "pro"); r.header.Get("RateLimit-Policy") != fmt.Sprintf(`"monthly";q=5;w=%d`, int64(month)) {
				t.Fatalf("pro tier: %q", r.header.Get("RateLimit-Policy"))
			}
			if r := s.get("/", "X-Tenant", tenant+"-trial", "X-Plan", "trial"); r.header.Get("RateLimit-Policy") != `"monthly";q=2;w=3600` {
				t.Fatalf("trial tier: %q", r.header.Get("RateLimit-Policy"))
			}

			// The admin API: the period, the quota left and the reset.
			p := adminPolicy(t, s.adminOK("GET", "/rate_limit/policies?tenant="+tenant, ""), "monthly")
			if p["calendar"] != "month America/New_York" || p["window"] != nil || p["algorithm"] != "fixed_window" ||
				p["period_start"] != start.Format(time.RFC3339) || p["period_end"] != end.Format(time.RFC3339) {
				t.Fatalf("policies: %v", p)
			}
			u := adminPolicy(t, s.adminOK("GET", "/rate_limit/usage?tenant="+tenant, ""), "monthly")
			if reset, _ := u["reset"].(float64); u["remaining"] != 0.0 || math.Abs(reset-time.Until(end).Seconds()) > 2 {
				t.Fatalf("usage: %v, want 0 left and reset about %.0f", u, time.Until(end).Seconds())
			}
			if d := adminPolicy(t, s.adminOK("GET", "/rate_limit/usage?tenant="+tenant, ""), "daily"); d["calendar"] != "day Europe/Berlin" || d["remaining"] != 97.0 { // the denied 4th request charged nothing
				t.Fatalf("daily usage: %v", d)
			}
			hs := s.adminOK("GET", "/rate_limit/status", "")["handlers"].([]any)
			found := false
			for _, ps := range hs[0].(map[string]any)["policies"].([]any) {
				if pm := ps.(map[string]any); pm["name"] == "monthly" {
					found = pm["calendar"] == "month America/New_York" && pm["window"] == nil
				}
			}
			if !found {
				t.Fatalf("status: %v", hs)
			}

			// A per-tenant upgrade: the override keeps the month.
			if code, m := s.adminCall("PUT", "/rate_limit/overrides", `{"tenant":"`+tenant+`","policy":"monthly","max_events":10,"window":"1h"}`); code != http.StatusBadRequest ||
				!strings.Contains(fmt.Sprint(m["error"]), "counts per calendar month America/New_York: an override keeps that period") {
				t.Fatalf("override with a window: %d %v", code, m)
			}
			s.adminOK("PUT", "/rate_limit/overrides", `{"tenant":"`+tenant+`","policy":"monthly","max_events":10}`)
			waitFor(t, func() bool {
				return adminPolicy(t, s.adminOK("GET", "/rate_limit/policies?tenant="+tenant, ""), "monthly")["source"] == "runtime_override"
			})
			p = adminPolicy(t, s.adminOK("GET", "/rate_limit/policies?tenant="+tenant, ""), "monthly")
			if p["calendar"] != "month America/New_York" || p["limit"] != 10.0 {
				t.Fatalf("override: %v", p)
			}
			r = s.get("/", "X-Tenant", tenant)
			if r.status != 200 || r.header.Get("RateLimit-Policy") != fmt.Sprintf(`"monthly";q=10;w=%d`, int64(month)) || !strings.HasPrefix(r.header.Get("RateLimit"), `"monthly";r=6;`) {
				t.Fatalf("after the upgrade: %d %v", r.status, r.header)
			}
		})
	}
}
