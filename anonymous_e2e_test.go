package tollgate

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// TestE2EAnonymousBucketNamed: requests whose tenant (or, without
// `tenant`, whose key) resolves empty count in the bucket named
// "_anonymous" everywhere it shows (its Redis keys, the placeholder, the
// admin API), and requests sending the literal value "_anonymous" count
// in a bucket of their own. On the embedded store and on a real Redis.
func TestE2EAnonymousBucketNamed(t *testing.T) {
	for _, store := range []string{"embedded", "redis"} {
		t.Run(store, func(t *testing.T) {
			var srv *redistest.Server
			redisBlock := ""
			if store == "redis" {
				srv = redistest.StartStandalone(t, redistest.Options{})
				redisBlock = "\n\t\t\tredis {\n\t\t\t\taddress " + srv.Addr + "\n\t\t\t}\n\t\t\tdenials_stream"
			}
			// Policy names differ per store: the embedded store outlives
			// the config, and same-named policies share buckets.
			pt, pk := "anon_t_"+store, "anon_k_"+store
			s := startCaddyAdmin(t, "", fmt.Sprintf(`
	route /t {
		rate_limit {%[3]s
			tenant {http.request.header.X-Tenant}
			missing_tenant shared
			policy %[1]s {
				limit 3
				window 1h
			}
		}
		respond "[{http.rate_limit.tenant}]"
	}
	route /k {
		rate_limit {%[3]s
			policy %[2]s {
				key {http.request.header.X-Key}
				limit 2
				window 1h
			}
		}
		respond "[{http.rate_limit.tenant}]"
	}`, pt, pk, redisBlock), nil)

			keys := func() []string {
				if srv == nil {
					return nil
				}
				ks, err := srv.Client(t).Keys(context.Background(), "rl:*:{*}:anon_*").Result()
				if err != nil {
					t.Fatal(err)
				}
				slices.Sort(ks)
				return ks
			}
			remaining := func(tenant, policy string) any {
				t.Helper()
				m := s.adminOK(http.MethodGet, "/rate_limit/usage?tenant="+tenant+"&policy="+policy, "")
				if m["tenant"] != tenant {
					t.Errorf("usage of %q answers for tenant %v", tenant, m["tenant"])
				}
				return adminPolicy(t, m, policy)["remaining"]
			}

			// No tenant header: the "_anonymous" bucket, shown by that name.
			for i := range 2 {
				if r := s.get("/t"); r.status != 200 || r.body != "[_anonymous]" {
					t.Fatalf("request %d without tenant: %d %q, want 200 [_anonymous]", i+1, r.status, r.body)
				}
			}
			if got := remaining("_anonymous", pt); got != 1.0 {
				t.Fatalf("usage?tenant=_anonymous: remaining %v, want 1 (2 of 3 used)", got)
			}
			if srv != nil {
				if got, want := keys(), []string{"rl:sliding_window:{_anonymous}:" + pt}; !slices.Equal(got, want) {
					t.Fatalf("Redis keys %q, want %q", got, want)
				}
			}

			// The literal value "_anonymous" is a bucket of its own: 3
			// more admitted, then 429; the anonymous bucket is untouched.
			if c := s.statuses(4, "/t", "X-Tenant", "_anonymous"); c[200] != 3 || c[429] != 1 {
				t.Fatalf("literal _anonymous: %v, want 3 x 200 and 1 x 429", c)
			}
			if got := remaining("_anonymous", pt); got != 1.0 {
				t.Fatalf("after the literal _anonymous: remaining %v, want 1", got)
			}
			if srv != nil {
				if got, want := keys(), []string{
					"rl:sliding_window:{%5Fanonymous}:" + pt,
					"rl:sliding_window:{_anonymous}:" + pt,
				}; !slices.Equal(got, want) {
					t.Fatalf("Redis keys %q, want %q", got, want)
				}
			}

			// The admin reset of "_anonymous" clears the anonymous bucket
			// only.
			if m := s.adminOK(http.MethodPost, "/rate_limit/reset?tenant=_anonymous&policy="+pt, ""); m["tenant"] != "_anonymous" || m["reset"] != true {
				t.Fatalf("reset: %v", m)
			}
			if got := remaining("_anonymous", pt); got != 3.0 {
				t.Fatalf("after reset: remaining %v, want 3", got)
			}
			if srv != nil {
				if got, want := keys(), []string{"rl:sliding_window:{%5Fanonymous}:" + pt}; !slices.Equal(got, want) {
					t.Fatalf("Redis keys after reset %q, want %q", got, want)
				}
			}
			if c := s.statuses(4, "/t"); c[200] != 3 || c[429] != 1 {
				t.Fatalf("without tenant after reset: %v, want 3 x 200 and 1 x 429", c)
			}
			if c := s.statuses(1, "/t", "X-Tenant", "_anonymous"); c[429] != 1 {
				t.Fatalf("literal _anonymous after the anonymous reset: %v, want 429 (not reset)", c)
			}
			if srv != nil {
				// One denial each: the anonymous tenant's is listed under
				// its name, the literal value's is not.
				waitFor(t, func() bool {
					m := s.adminOK(http.MethodGet, "/rate_limit/denials?tenant=_anonymous", "")
					return len(m["denials"].([]any)) == 1
				})
				time.Sleep(200 * time.Millisecond)
				ds := s.adminOK(http.MethodGet, "/rate_limit/denials?tenant=_anonymous", "")["denials"].([]any)
				if len(ds) != 1 || ds[0].(map[string]any)["tenant"] != "_anonymous" || ds[0].(map[string]any)["policy"] != pt {
					t.Fatalf("denials of _anonymous: %v, want 1 of tenant _anonymous", ds)
				}
			}

			// A runtime override of "_anonymous" applies to it.
			s.adminOK(http.MethodPut, "/rate_limit/overrides", `{"tenant":"_anonymous","policy":"`+pt+`","max_events":5,"window":"1h"}`)
			if p := adminPolicy(t, s.adminOK(http.MethodGet, "/rate_limit/policies?tenant=_anonymous&policy="+pt, ""), pt); p["source"] != "runtime_override" || p["limit"] != 5.0 {
				t.Fatalf("override of _anonymous: %v", p)
			}
			if c := s.statuses(3, "/t"); c[200] != 2 || c[429] != 1 {
				t.Fatalf("without tenant, override of 5 with 3 used: %v, want 2 x 200 and 1 x 429", c)
			}

			// Without `tenant`, an empty key is the anonymous tenant too.
			for i := range 2 {
				if r := s.get("/k"); r.status != 200 || r.body != "[_anonymous]" {
					t.Fatalf("request %d without key: %d %q, want 200 [_anonymous]", i+1, r.status, r.body)
				}
			}
			if r := s.get("/k"); r.status != 429 {
				t.Fatalf("third request without key: %d, want 429", r.status)
			}
			if c := s.statuses(3, "/k", "X-Key", "_anonymous"); c[200] != 2 || c[429] != 1 {
				t.Fatalf("literal key _anonymous: %v, want 2 x 200 and 1 x 429", c)
			}
			if got := remaining("_anonymous", pk); got != 0.0 {
				t.Fatalf("usage of the empty key: remaining %v, want 0", got)
			}
			if srv != nil {
				var got []string
				for _, k := range keys() {
					if strings.HasSuffix(k, ":"+pk) {
						got = append(got, k)
					}
				}
				if want := []string{"rl:sliding_window:{%5Fanonymous}:" + pk, "rl:sliding_window:{_anonymous}:" + pk}; !slices.Equal(got, want) {
					t.Fatalf("Redis keys of %s %q, want %q", pk, got, want)
				}
			}
		})
	}
}

// TestPortalLiteralAnonymous: a request sending the literal tenant
// "_anonymous" sees its own bucket in the tenant's view, not the
// anonymous one, and a request without a tenant still has no view.
func TestPortalLiteralAnonymous(t *testing.T) {
	s := startCaddyAdmin(t, "", `
	handle /limits {
		rate_limit_usage
	}
	handle {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			policy pt_anon {
				limit 10
				window 1h
			}
		}
		respond "ok"
	}`, nil)
	s.adminOK(http.MethodPost, "/rate_limit/reset?tenant=_anonymous", "")
	if c := s.statuses(4, "/"); c[200] != 4 {
		t.Fatalf("without tenant: %v", c)
	}
	if c := s.statuses(1, "/", "X-Tenant", "_anonymous"); c[200] != 1 {
		t.Fatalf("literal _anonymous: %v", c)
	}
	status, m := portalView(t, s, "/limits", "_anonymous", "")
	if status != http.StatusOK || m["tenant"] != "_anonymous" {
		t.Fatalf("view of the literal _anonymous: %d %v", status, m)
	}
	if p := portalPolicy(t, m, "pt_anon"); p["remaining"] != 9.0 {
		t.Fatalf("literal _anonymous sees remaining %v, want 9 (its own bucket, not the anonymous one's 6)", p["remaining"])
	}
	if p := adminPolicy(t, s.adminOK(http.MethodGet, "/rate_limit/usage?tenant=_anonymous&policy=pt_anon", ""), "pt_anon"); p["remaining"] != 6.0 {
		t.Fatalf("anonymous: remaining %v, want 6", p["remaining"])
	}
	if status, _ := portalView(t, s, "/limits", "", ""); status != http.StatusUnauthorized {
		t.Fatalf("view without tenant: %d, want 401", status)
	}
}
