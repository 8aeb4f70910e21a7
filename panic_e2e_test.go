package tollgate

import (
	"net/http"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// panicHandler is a test-only handler that panics on /panic.
type panicHandler struct{}

func init() {
	caddy.RegisterModule(panicHandler{})
	httpcaddyfile.RegisterHandlerDirective("tollgate_test_panic", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		h.Next()
		return panicHandler{}, nil
	})
}

func (panicHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.tollgate_test_panic",
		New: func() caddy.Module { return new(panicHandler) },
	}
}

func (panicHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if r.URL.Path == "/panic" {
		panic("downstream handler panicked")
	}
	return next.ServeHTTP(w, r)
}

// TestE2EConcurrencyReleasedOnPanic: a panic downstream still frees the
// request's concurrency slot.
func TestE2EConcurrencyReleasedOnPanic(t *testing.T) {
	s := startCaddy(t, "", `
	route {
		rate_limit {
			policy inflight {
				algorithm concurrency
				limit 1
			}
		}
		tollgate_test_panic
		respond "ok"
	}`, nil)
	// Caddy does not recover panics; net/http does, and drops the
	// connection, so the client sees an error rather than a status.
	for i := range 5 {
		res, err := testClient.Get(s.base + "/panic")
		if err == nil {
			res.Body.Close()
			t.Fatalf("panic request %d: got status %d, want a dropped connection", i, res.StatusCode)
		}
	}
	// With limit 1, a leaked slot would make this 429.
	if r := s.get("/"); r.status != 200 {
		t.Fatalf("after panics: status %d, want 200 (slot released)", r.status)
	}
}
