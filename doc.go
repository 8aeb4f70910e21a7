// Package tollgate is a Caddy HTTP handler that enforces per-tenant rate limits.
package tollgate
