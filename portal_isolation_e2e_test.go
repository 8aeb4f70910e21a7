package tollgate

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// TestPortalTenantsDisagree: a page without a tenant of its own, behind
// basic_auth, takes the caller's tenant from the handlers' templates; one
// of them reads a header any client can send. Alice, authenticated, sends
// that header naming bob: the two templates disagree, and she gets a 409
// that names no one, not bob's view (she got it: policies, remaining,
// history). Without the header she gets her own.
func TestPortalTenantsDisagree(t *testing.T) {
	hash, _ := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	site := fmt.Sprintf(`
	basic_auth {
		alice %s
		bob %s
	}
	handle /limits {
		rate_limit_usage
	}
	handle /api/* {
		rate_limit {
			tenant {http.auth.user.id}
			policy rv_api {
				limit 10
				window 1h
			}
		}
		respond "ok"
	}
	handle /p/* {
		rate_limit {
			tenant {http.request.header.X-Partner}
			policy rv_partner {
				limit 5
				window 1h
			}
		}
		respond "ok"
	}`, hash, hash)
	s := startCaddyAdmin(t, "", site, nil)
	auth := func(u string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(u+":pw")) }
	// bob uses the partner API (his own header) 5 times, and is denied once.
	if c := s.statuses(6, "/p/x", "Authorization", auth("bob"), "X-Partner", "rv_bob"); c[200] != 5 || c[429] != 1 {
		t.Fatalf("bob: %v", c)
	}
	// alice asks for her own limits, adding a header.
	r := s.get("/limits", "Authorization", auth("alice"), "Accept", "application/json", "X-Partner", "rv_bob")
	if r.status != http.StatusConflict || strings.Contains(r.body, "rv_bob") || strings.Contains(r.body, "rv_partner") {
		t.Errorf("alice with X-Partner: rv_bob: %d %s, want a 409 that shows nothing of rv_bob", r.status, r.body)
	}
	r = s.get("/limits", "Authorization", auth("alice"), "Accept", "application/json")
	if r.status != http.StatusOK || !strings.Contains(r.body, `"tenant":"alice"`) || !strings.Contains(r.body, "rv_api") {
		t.Errorf("alice alone: %d %s, want her own view", r.status, r.body)
	}
}

// TestPortalDenialsOfLongTenants: two tenants of 200 bytes that share
// their first 128 bytes (the denial stream cuts tenants there, as logs
// do) see their own denials only: the stream tells them apart by digest.
// (The second saw the first's.)
func TestPortalDenialsOfLongTenants(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	site := `
	handle /limits {
		rate_limit_usage
	}
	handle {
		` + rateLimitBlock(srv.Addr, "", "\t\tdenials_stream", "policy rv_api {\n\t\t\tlimit 1\n\t\t\twindow 1h\n\t\t}") + `
		respond "ok"
	}`
	s := startCaddy(t, "", site, nil)
	prefix := strings.Repeat("p", 128)
	victim := prefix + strings.Repeat("V", 72)
	other := prefix + strings.Repeat("O", 72)
	if c := s.statuses(3, "/", "X-Tenant", victim); c[429] != 2 {
		t.Fatalf("victim: %v", c)
	}
	time.Sleep(300 * time.Millisecond) // the stream writer
	_, m := portalView(t, s, "/limits", other, "")
	if ds, _ := m["denials"].([]any); len(ds) != 0 {
		t.Errorf("tenant %q...O sees %d denials it never had (the victim's): %v", prefix[:8], len(ds), ds)
	}
	if _, m := portalView(t, s, "/limits", victim, ""); len(m["denials"].([]any)) != 2 {
		t.Errorf("the victim sees denials %v, want its 2", m["denials"])
	}
	p := portalPolicy(t, m, "rv_api")
	if p["remaining"] != float64(1) {
		t.Errorf("remaining %v", p["remaining"])
	}
}

// TestPortalLiteralAnonymousDenials: a tenant whose identity is literally
// "_anonymous" is the engine's empty tenant, which handlers without a
// tenant (and without log_key) write to the shared denial stream too:
// its page lists no denials. (It listed another handler's per-IP ones.)
func TestPortalLiteralAnonymousDenials(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	site := `
	handle /limits {
		rate_limit_usage
	}
	handle /ip/* {
		rate_limit {
			redis {
				address ` + srv.Addr + `
			}
			denials_stream
			policy rv_login_per_ip {
				limit 1
				window 1h
			}
		}
		respond "ok"
	}
	handle {
		` + rateLimitBlock(srv.Addr, "", "\t\tdenials_stream", "policy rv_api {\n\t\t\tlimit 5\n\t\t\twindow 1h\n\t\t}") + `
		respond "ok"
	}`
	s := startCaddy(t, "", site, nil)
	if c := s.statuses(3, "/ip/login"); c[429] != 2 {
		t.Fatalf("per-ip: %v", c)
	}
	time.Sleep(300 * time.Millisecond)
	_, m := portalView(t, s, "/limits", "_anonymous", "")
	if ds, _ := m["denials"].([]any); len(ds) != 0 {
		t.Errorf("the literal _anonymous tenant sees %d denials of another handler", len(ds))
	}
}
