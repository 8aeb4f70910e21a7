// Package caddyreq makes requests for tests and benchmarks that call a
// handler directly, prepared as Caddy's HTTP server prepares them.
package caddyreq

import (
	"net/http"
	"net/http/httptest"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// OK is a next handler that writes nothing: an empty 200.
var OK = caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })

// New returns a GET of /api/items from 192.0.2.1 with X-Tenant set to
// tenant, carrying what Caddy's server adds (replacer, vars with the
// client IP, extra log fields), writing to w.
func New(w http.ResponseWriter, tenant string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/api/items", nil)
	r.RemoteAddr = "192.0.2.1:40000"
	r.Header.Set("X-Tenant", tenant)
	return caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, &caddyhttp.Server{})
}
