// Package tollgate is the Caddy module http.handlers.rate_limit (Caddyfile
// directive rate_limit): per-tenant request budgets, exact across a fleet
// of Caddy servers that share a Redis, or on an embedded in-process store;
// with it come the admin API (admin.api.rate_limit) and the tenant's own
// view (http.handlers.rate_limit_usage).
//
// This package holds no rule of its own: it registers the module, builds a
// handler's parts from its validated configuration in Provision, hands each
// request to them, and lets them go in Cleanup. ARCHITECTURE.md maps the
// layers below it and walks through a request.
package tollgate
