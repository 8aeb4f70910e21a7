// Package limiter is Tollgate's rate-limiting engine, usable without Caddy.
//
// A Policy names an algorithm and a limit, with per-tier and per-tenant
// exceptions; a Decision resolves the limit of each Item of a request (a
// runtime override first, then the tenant's own limit, its tier, the
// policy) and asks a Store for one all-or-nothing answer. Stores:
//
//   - MemoryStore: in-process, exact, bounded in memory;
//   - RedisStore: one atomic Lua script per decision (package lua), for a
//     fleet sharing one budget;
//   - BreakerStore: a circuit breaker around another store;
//   - LeaseStore: serves units leased ahead of demand from a LeaseTaker.
//
// Every algorithm is a pure function of a bucket's state, an instant, a
// Rate and a cost (algorithms.go, one file per algorithm); the Lua scripts
// mirror the same arithmetic in microseconds. DecideOrFallback applies the
// policies' fail modes when the store fails; a Recorder charges what the
// fallback admitted back to the store once it answers; a Registry counts
// the live instances. Numbers stay inside one domain (domain.go), so every
// store computes the same answer.
package limiter
