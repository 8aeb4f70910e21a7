package surface

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/caddyreq"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// decidedState decides one request of tenant in h's policy name on h's
// store, as ServeHTTP would.
func decidedState(tb testing.TB, h *Server, policy, tenant string) *requestState {
	tb.Helper()
	st := new(requestState)
	for _, p := range h.policies {
		if p.Engine.Name == policy {
			st.items = append(st.items, limiter.Item{Policy: p.Engine, Tenant: tenant, Cost: 1})
			st.policies = append(st.policies, p)
		}
	}
	if err := h.gate.Store.Decide(context.Background(), &st.decision, st.items); err != nil {
		tb.Fatal(err)
	}
	return st
}

const allocPolicies = `"rate_limits":{
	"alloc_allow":{"max_events":1000000000,"window":3600000000000},
	"alloc_deny":{"max_events":1,"window":3600000000000},
	"alloc_shadow":{"max_events":1,"window":3600000000000,"shadow":true}}`

// TestRecordingAllocatesNothing: recording allowed, denied and shadow
// decisions, with and without per-tenant series, allocates nothing, and
// a whole request allocates no more with metrics than without.
func TestRecordingAllocatesNothing(t *testing.T) {
	for _, tenants := range []int{0, 5} {
		h := provisionServer(t, fmt.Sprintf(`{"tenant":"{http.request.header.X-Tenant}","metrics_tenants":%d,%s}`, tenants, allocPolicies))
		for _, tc := range []struct{ policy, tenant string }{
			{"alloc_allow", "acme"}, {"alloc_deny", "acme"}, {"alloc_shadow", "acme"},
		} {
			decidedState(t, h, tc.policy, tc.tenant) // use up the quota
			st := decidedState(t, h, tc.policy, tc.tenant)
			start := time.Now()
			if n := testing.AllocsPerRun(5000, func() { h.recordDecision(st, start) }); n != 0 {
				t.Errorf("metrics_tenants %d, %s: %v allocations per decision", tenants, tc.policy, n)
			}
		}
	}

	if poolsDropItems() {
		t.Log("sync.Pool drops items (race detector): not comparing whole requests")
		return
	}
	w := httptest.NewRecorder()
	perRequest := func(cfg string) float64 {
		h := provisionServer(t, cfg)
		return testing.AllocsPerRun(2000, func() {
			r := caddyreq.New(w, "acme")
			_ = h.ServeHTTP(w, r, caddyreq.OK)
		})
	}
	const cfg = `{"tenant":"{http.request.header.X-Tenant}","headers":"off",%s
		"rate_limits":{"alloc_req":{"algorithm":"token_bucket","max_events":1000000000,"window":3600000000000}}}`
	off := perRequest(fmt.Sprintf(cfg, `"disable_metrics":true,`))
	on := perRequest(fmt.Sprintf(cfg, ""))
	if on > off {
		t.Errorf("a request allocates %v times with metrics, %v without", on, off)
	}
}

// BenchmarkRecordDecision is the cost of recording one decision.
func BenchmarkRecordDecision(b *testing.B) {
	for _, tenants := range []int{0, 10} {
		b.Run(fmt.Sprintf("metrics_tenants=%d", tenants), func(b *testing.B) {
			h := provisionServer(b, fmt.Sprintf(`{"tenant":"{http.request.header.X-Tenant}","metrics_tenants":%d,%s}`, tenants, allocPolicies))
			st := decidedState(b, h, "alloc_allow", "acme")
			start := time.Now()
			b.ReportAllocs()
			for b.Loop() {
				h.recordDecision(st, start)
			}
		})
	}
}
