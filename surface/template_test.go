package surface

import (
	"net/http/httptest"
	"testing"

	"github.com/tollgate/caddy-tollgate/internal/caddyreq"

	"github.com/caddyserver/caddy/v2"
)

// TestTemplateExpandsAsReplacer: a compiled template expands exactly as
// Caddy's replacer does, whatever its shape.
func TestTemplateExpandsAsReplacer(t *testing.T) {
	w := httptest.NewRecorder()
	r := caddyreq.New(w, "acme")
	r.Header.Add("X-Multi", "a")
	r.Header.Add("X-Multi", "b")
	r.Header.Set("x-lower-case", "lc")
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	repl.Set("custom.value", "cv")
	for _, raw := range []string{
		"static",
		"",
		"{http.request.header.X-Tenant}",
		"{http.request.header.x-tenant}",
		"{http.request.header.X-Multi}",
		"{http.request.header.X-Lower-Case}",
		"{http.request.header.Absent}",
		"{custom.value}",
		"{no.such.placeholder}",
		"{http.request.method}{http.request.uri.path}",
		"tenant-{http.request.header.X-Tenant}",
		"{http.request.header.X-Tenant}:{custom.value}",
		`\{http.request.header.X-Tenant}`,
		"{}",
	} {
		tmpl := compileTemplate(raw)
		if got, want := tmpl.expand(repl, r), repl.ReplaceAll(raw, ""); got != want {
			t.Errorf("%q (kind %d): %q, want %q", raw, tmpl.kind, got, want)
		}
	}
	if k := compileTemplate("{http.request.header.X-Tenant}").kind; k != templateHeader {
		t.Errorf("a header template compiled to kind %d", k)
	}
}
