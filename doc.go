// Package tollgate is the Caddy module http.handlers.rate_limit (Caddyfile
// directive rate_limit) and its admin API, admin.api.rate_limit: per-tenant,
// per-endpoint request budgets, exact across a fleet of Caddy servers that
// share a Redis, or on an embedded in-process store.
//
// This package only translates between Caddy and the engine. It reads the
// configuration (config.go, caddyfile.go), validates it in one place
// (validate.go), maps each request onto the engine's items (request.go),
// answers with headers, placeholders, logs and events (respond.go), and
// exports metrics (metrics.go) and admin routes (admin.go). Deciding is the
// job of package limiter; what instances on one Redis share (connections,
// the store stack, runtime overrides, the denial stream) is package fleet.
// ARCHITECTURE.md walks through a request.
package tollgate
