package tollgate

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// provisionHandler builds a Handler from JSON outside a running Caddy.
func provisionHandler(tb testing.TB, cfg string) *Handler {
	tb.Helper()
	var h Handler
	if err := json.Unmarshal([]byte(cfg), &h); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	tb.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { h.Cleanup() })
	return &h
}

var okHandler = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil })

// newCaddyRequest prepares a request as Caddy's server does: replacer,
// vars (client IP), extra log fields.
func newCaddyRequest(w http.ResponseWriter, tenant string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/api/items", nil)
	r.RemoteAddr = "192.0.2.1:40000"
	r.Header.Set("X-Tenant", tenant)
	return caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, &caddyhttp.Server{})
}

// BenchmarkServeHTTP measures the whole handler per request on the
// embedded store. The "baseline" case prepares the same request and calls
// the next handler directly, so the difference is Tollgate's cost.
func BenchmarkServeHTTP(b *testing.B) {
	w := httptest.NewRecorder()
	b.Run("baseline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r := newCaddyRequest(w, "acme")
			_ = okHandler.ServeHTTP(w, r)
		}
	})
	for _, algo := range []string{"token_bucket", "sliding_window"} {
		b.Run(algo, func(b *testing.B) {
			h := provisionHandler(b, `{"tenant":"{http.request.header.X-Tenant}","headers":"off",
				"rate_limits":{"api":{"algorithm":"`+algo+`","max_events":1000000000,"window":3600000000000}}}`)
			b.ReportAllocs()
			for b.Loop() {
				r := newCaddyRequest(w, "acme")
				if err := h.ServeHTTP(w, r, okHandler); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("token_bucket_headers_both", func(b *testing.B) {
		h := provisionHandler(b, `{"tenant":"{http.request.header.X-Tenant}",
			"rate_limits":{"api":{"algorithm":"token_bucket","max_events":1000000000,"window":3600000000000}}}`)
		b.ReportAllocs()
		for b.Loop() {
			r := newCaddyRequest(w, "acme")
			if err := h.ServeHTTP(w, r, okHandler); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkServeHTTPRedis measures the whole handler on Redis with
// lease 50 (served locally, about one script call per 50 requests)
// against the embedded store, same run.
func BenchmarkServeHTTPRedis(b *testing.B) {
	srv := redistest.StartStandalone(b, redistest.Options{})
	w := httptest.NewRecorder()
	for name, store := range map[string]string{
		"embedded":    ``,
		"redis_lease": `"redis":{"addresses":["` + srv.Addr + `"]},"lease":{"max_tokens":50},`,
	} {
		b.Run(name, func(b *testing.B) {
			h := provisionHandler(b, `{`+store+`"tenant":"{http.request.header.X-Tenant}",
				"rate_limits":{"api":{"algorithm":"token_bucket","max_events":1000000000,"window":3600000000000}}}`)
			b.ReportAllocs()
			for b.Loop() {
				r := newCaddyRequest(w, "acme")
				if err := h.ServeHTTP(w, r, okHandler); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
