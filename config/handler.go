package config

import (
	"encoding/json"

	"github.com/caddyserver/caddy/v2"
)

// Handler is the configuration of a rate_limit handler: the JSON fields
// of module http.handlers.rate_limit (the module embeds it), which the
// Caddyfile directive fills (UnmarshalCaddyfile) and Validate checks.
type Handler struct {
	// Shared Redis store. Absent: the embedded in-process store.
	Redis *RedisConfig `json:"redis,omitempty"`

	// Tenant identity, a placeholder template such as
	// `{http.auth.user.id}`. Absent: each policy's key is the tenant.
	// Take it from an authenticated source, never from a header any client
	// can set.
	Tenant string `json:"tenant,omitempty"`

	// Tier of the tenant, a placeholder template such as
	// `{http.request.header.X-Plan}` set by an auth layer.
	Tier string `json:"tier,omitempty"`

	// Static tenant -> tier mapping; wins over the tier placeholder.
	TenantTiers map[string]string `json:"tenant_tiers,omitempty"`

	// When tenant resolves to an empty string: "shared" (default) counts
	// the request in one bucket per policy, the tenant "_anonymous"'s (a
	// request sending that value literally has a bucket of its own),
	// "deny" answers 429.
	MissingTenant string `json:"missing_tenant,omitempty"`

	// Default lease for every policy. Applies to the Redis store only.
	Lease *LeaseConfig `json:"lease,omitempty"`

	// Make every policy a shadow policy: would-deny decisions are logged,
	// never enforced.
	Shadow bool `json:"shadow,omitempty"`

	// Store unreachable: "open" allows, "closed" denies, "local" (default)
	// decides from an in-process fallback bucket. Redis store only.
	FailMode string `json:"fail_mode,omitempty"`

	// Rate-limit response headers: "both" (default), "ietf", "legacy" or
	// "off".
	Headers string `json:"headers,omitempty"`

	// Random extra on Retry-After, as a fraction of it: 0.2 adds up to 20%.
	Jitter float64 `json:"jitter,omitempty"`

	// Append each denial to the Redis stream <prefix>:denials, capped at
	// this many entries (approximately). 0 disables it.
	DenialsStream int `json:"denials_stream,omitempty"`

	// The usage history kept for tenants (see HistoryConfig). Default:
	// minute points for 48h, hour points for 90d.
	History *HistoryConfig `json:"history,omitempty"`

	// Webhooks for the handler's events (see NotifyConfig).
	Notify *NotifyConfig `json:"notify,omitempty"`

	// An adaptive concurrency limit with fair queues in front of the
	// upstream (see ProtectConfig).
	Protect *ProtectConfig `json:"protect,omitempty"`

	// Per-tenant metric series for the n busiest tenants; the rest are
	// counted as "_other". 0 disables per-tenant series.
	MetricsTenants int `json:"metrics_tenants,omitempty"`

	// An admitted request after which less than (1 - near_limit) of the
	// limit is left counts as near the limit: in
	// caddy_rate_limit_near_limit_total and the admin API's near_limit
	// list. A fraction above 0 and at most 1 (1: never near). Default 0.8.
	NearLimit float64 `json:"near_limit,omitempty"`

	// How metered responses are read on after their client went away, so
	// that the usage at their end is charged (see DrainConfig). Absent:
	// the defaults.
	Drain *DrainConfig `json:"drain,omitempty"`

	// Include the resolved tenant and key in log lines.
	LogKey bool `json:"log_key,omitempty"`

	// The policies, by name.
	RateLimits map[string]*PolicyConfig `json:"rate_limits,omitempty"`

	// How often the embedded store deletes expired buckets. Default 1m.
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

	// The most memory, in bytes, the embedded store's buckets may take
	// (estimated Go heap: key, entry and sliding-log buffer). When full,
	// expired buckets are evicted first, then the least recently used.
	// Default 256 MiB; allowed 1 MiB to 1 TiB. Handlers with the same
	// sweep_interval and max_memory share one store. Ignored with a redis
	// block.
	MaxMemory int64 `json:"max_memory,omitempty"`

	// Do not record this handler's metrics.
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// caddy-ratelimit's approximate distributed mode: share zone usage
	// with the other instances through storage (see DistributedConfig).
	// Ignored with a warning when `redis` is set: Redis is exact.
	Distributed *DistributedConfig `json:"distributed,omitempty"`

	// The storage module distributed uses. Default: Caddy's storage.
	StorageRaw json.RawMessage `json:"storage,omitempty" caddy:"namespace=caddy.storage inline_key=module"`
}
