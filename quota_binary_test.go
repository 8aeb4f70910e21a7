package tollgate

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// TestBinaryCalendarNewYork runs the built binary (in a process whose own
// time zone is Tokyo's) with daily and weekly quotas in New York, on the
// embedded store and on Redis, and checks the headers against the real
// next local midnight in New York, computed here without Tollgate: w= is
// the length of today (23, 24 or 25 hours) or of this ISO week, t= and
// X-RateLimit-Reset count to the next period start, and a 429's
// Retry-After is the time until then.
func TestBinaryCalendarNewYork(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().In(ny)
	dayStart := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, ny)
	dayEnd := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, ny)
	monday := now.Day() - (int(now.Weekday())+6)%7
	weekStart := time.Date(now.Year(), now.Month(), monday, 0, 0, 0, 0, ny)
	weekEnd := time.Date(now.Year(), now.Month(), monday+7, 0, 0, 0, 0, ny)
	if time.Until(dayEnd) < 30*time.Second || time.Since(dayStart) < 30*time.Second {
		t.Skip("too close to midnight in New York")
	}

	srv := redistest.StartStandalone(t, redistest.Options{})
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			redisLine := ""
			if store == "redis" {
				redisLine = "redis " + srv.Addr
			}
			p := startCaddyProcessEnv(t, []string{"TZ=Asia/Tokyo"}, `{
	admin 127.0.0.1:{ADMIN}
	auto_https off
	log {
		output discard
	}
}

http://127.0.0.1:{PORT} {
	rate_limit {
		`+redisLine+`
		tenant {http.request.header.X-Tenant}
		policy daily {
			calendar day America/New_York
			limit 2
		}
		policy weekly {
			calendar week America/New_York
			limit 1000
		}
	}
	respond "ok"
}
`)
			tenant := "ny-" + store
			for i := 1; i <= 2; i++ {
				r := p.get("/", "X-Tenant", tenant)
				if r.status != 200 {
					t.Fatalf("request %d: %d", i, r.status)
				}
				want := fmt.Sprintf(`"daily";q=2;w=%d`, int64(dayEnd.Sub(dayStart).Seconds()))
				if got := r.header.Get("RateLimit-Policy"); got != want {
					t.Fatalf("RateLimit-Policy %q, want %q (today in New York)", got, want)
				}
				secs := time.Until(dayEnd).Seconds()
				if tt := headerSeconds(t, r.header.Get("RateLimit"), "t"); !near(tt, secs, 2) {
					t.Fatalf("RateLimit %q: t=%d, want about %.0f (until midnight in New York)", r.header.Get("RateLimit"), tt, secs)
				}
				if reset, _ := strconv.ParseInt(r.header.Get("X-RateLimit-Reset"), 10, 64); !near(reset, secs, 2) {
					t.Fatalf("X-RateLimit-Reset %d, want about %.0f", reset, secs)
				}
			}
			r := p.get("/", "X-Tenant", tenant)
			retry, _ := strconv.ParseInt(r.header.Get("Retry-After"), 10, 64)
			if secs := time.Until(dayEnd).Seconds(); r.status != 429 || !near(retry, secs, 2) {
				t.Fatalf("3rd request: %d, Retry-After %d, want 429 and about %.0f (until midnight in New York)", r.status, retry, secs)
			}
			// The weekly quota has 998 left; its headers describe it once
			// the daily one is out of the way for another tenant.
			r = p.get("/", "X-Tenant", tenant+"-w")
			if !strings.HasPrefix(r.header.Get("RateLimit"), `"daily";r=1;`) {
				t.Fatalf("other tenant: %v", r.header)
			}
			p.caddyServer.admin = fmt.Sprintf("127.0.0.1:%d", p.admin)
			waitListening(t, p.admin)
			u := adminPolicy(t, p.adminOK("GET", "/rate_limit/usage?tenant="+tenant, ""), "weekly")
			if u["remaining"] != 998.0 || u["period_start"] != weekStart.Format(time.RFC3339) || u["period_end"] != weekEnd.Format(time.RFC3339) {
				t.Fatalf("weekly usage: %v, want 998 left in %s..%s", u, weekStart.Format(time.RFC3339), weekEnd.Format(time.RFC3339))
			}
		})
	}
}

// TestBinaryEmbedsZoneDatabase: the built binary carries the IANA zone
// database (time/tzdata), so calendar zones resolve on hosts without
// /usr/share/zoneinfo (minimal and distroless images).
func TestBinaryEmbedsZoneDatabase(t *testing.T) {
	bin := caddyBinary(t)
	out, err := exec.Command("go", "tool", "nm", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool nm: %v\n%.2000s", err, out)
	}
	if !strings.Contains(string(out), " time/tzdata.") {
		t.Fatal("the built binary does not contain time/tzdata")
	}
}
