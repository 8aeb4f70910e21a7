package tollgate

import (
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/tollgate/caddy-tollgate/internal/caddyreq"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// BenchmarkServeHTTP measures the whole handler per request on the
// embedded store. The "baseline" case prepares the same request and calls
// the next handler directly, so the difference is Tollgate's cost.
func BenchmarkServeHTTP(b *testing.B) {
	w := httptest.NewRecorder()
	b.Run("baseline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r := caddyreq.New(w, "acme")
			_ = caddyreq.OK.ServeHTTP(w, r)
		}
	})
	// The same handler per algorithm; with history off (the usage
	// history's cost); with headers on.
	const policy = `"rate_limits":{"api":{"algorithm":"%s","max_events":1000000000,"window":3600000000000}}}`
	for _, bc := range []struct{ name, cfg string }{
		{"token_bucket", `"headers":"off",` + fmt.Sprintf(policy, "token_bucket")},
		{"sliding_window", `"headers":"off",` + fmt.Sprintf(policy, "sliding_window")},
		{"token_bucket_history_off", `"headers":"off","history":{"off":true},` + fmt.Sprintf(policy, "token_bucket")},
		{"token_bucket_headers_both", fmt.Sprintf(policy, "token_bucket")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := provisionHandler(b, `{"tenant":"{http.request.header.X-Tenant}",`+bc.cfg)
			b.ReportAllocs()
			for b.Loop() {
				r := caddyreq.New(w, "acme")
				if err := h.ServeHTTP(w, r, caddyreq.OK); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkServeHTTPRedis measures the whole handler on Redis strictly
// (one script call per request) and with lease 50 (served locally, about
// one script call per 50 requests) against the embedded store, same run.
func BenchmarkServeHTTPRedis(b *testing.B) {
	srv := redistest.StartStandalone(b, redistest.Options{})
	w := httptest.NewRecorder()
	for name, store := range map[string]string{
		"embedded":     ``,
		"redis_strict": `"redis":{"addresses":["` + srv.Addr + `"]},`,
		// The usage history's cost on Redis: the same without it.
		"redis_strict_history_off": `"redis":{"addresses":["` + srv.Addr + `"]},"history":{"off":true},`,
		"redis_lease":              `"redis":{"addresses":["` + srv.Addr + `"]},"lease":{"max_tokens":50},`,
	} {
		b.Run(name, func(b *testing.B) {
			h := provisionHandler(b, `{`+store+`"tenant":"{http.request.header.X-Tenant}",
				"rate_limits":{"api":{"algorithm":"token_bucket","max_events":1000000000,"window":3600000000000}}}`)
			b.ReportAllocs()
			for b.Loop() {
				r := caddyreq.New(w, "acme")
				if err := h.ServeHTTP(w, r, caddyreq.OK); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
