package tollgate

import (
	"encoding/json"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler enforces per-tenant rate limits. Requests are counted in the
// bucket (tenant, policy, key) of every policy that matches them; the
// request passes only if every enforcing policy admits it.
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
	// the request in one "_anonymous" bucket, "deny" answers 429.
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

	// Per-tenant metric series for the n busiest tenants; the rest are
	// counted as "_other". 0 disables per-tenant series.
	MetricsTenants int `json:"metrics_tenants,omitempty"`

	// Include the resolved tenant and key in log lines.
	LogKey bool `json:"log_key,omitempty"`

	// The policies, by name.
	RateLimits map[string]*PolicyConfig `json:"rate_limits,omitempty"`

	// How often the embedded store deletes expired buckets. Default 1m.
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

	// Do not record this handler's metrics.
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// Accepted for caddy-ratelimit compatibility and ignored with a
	// warning: `redis` supersedes it.
	Distributed json.RawMessage `json:"distributed,omitempty"`

	// Accepted for caddy-ratelimit compatibility and ignored with a
	// warning: `redis` supersedes it.
	StorageRaw json.RawMessage `json:"storage,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
)

// Provision sets up the handler. (Work in progress.)
func (h *Handler) Provision(ctx caddy.Context) error { return nil }

// Validate checks the configuration. (Work in progress.)
func (h *Handler) Validate() error { return nil }

// Cleanup releases the handler's resources.
func (h *Handler) Cleanup() error { return nil }

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	return next.ServeHTTP(w, r)
}

// UnmarshalCaddyfile is replaced by caddyfile.go.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error { return nil }
