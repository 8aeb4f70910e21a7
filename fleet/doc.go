// Package fleet is what every Tollgate instance on one Redis key prefix
// shares: the Redis connection (connection.go), the Backend built on it
// (the breaker-guarded RedisStore, the live-instance registry, recovery
// charging; backend.go), one handler's store stack over a Backend (the
// fallback of fail_mode local and the lease cache; stack.go), runtime
// overrides kept in sync across the fleet (overrides.go) and the denial
// stream (denials.go).
//
// It depends on package limiter (the engine) and on go-redis and zap, and
// on nothing of Caddy or Prometheus: the Caddy module translates its
// configuration into the options here and reports through Hooks.
//
// Connections and Backends are shared by everything that asks for the same
// settings, across config reloads, and reference counted: the last Release
// closes them.
package fleet
