package config

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// PolicyConfig is one named rate limit (a caddy-ratelimit "zone"). Its
// name, the key of rate_limits, may be any string.
//
// Fields left out mean what they mean in caddy-ratelimit, so its JSON
// configs run unchanged: an exact sliding log, one bucket shared by every
// request (without a handler `tenant`), charged as caddy-ratelimit charges
// a zone. The Caddyfile's `policy` blocks write Tollgate's defaults
// instead: "algorithm": "sliding_window", "key": "{http.vars.client_ip}"
// (when the handler has no tenant) and "all_or_nothing": true.
type PolicyConfig struct {
	// Which requests the policy covers. Absent means every request.
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	// The partition of the tenant's budget a request counts against, as a
	// placeholder template, e.g. `{http.request.method}{http.request.uri.path}`.
	// When the handler sets `tenant`, empty means one bucket per tenant and
	// policy. Without `tenant`, the key is the tenant, and empty means one
	// bucket shared by every request, as in caddy-ratelimit; per client IP
	// is `{http.vars.client_ip}` (`{client_ip}` in a Caddyfile). A key that
	// resolves empty counts in that same shared bucket, the tenant
	// "_anonymous", which no other value (that one included) shares.
	Key string `json:"key,omitempty"`

	// How the bucket counts: token_bucket, gcra, sliding_window,
	// fixed_window, sliding_log (default: caddy-ratelimit's exact trailing
	// window) or concurrency.
	Algorithm string `json:"algorithm,omitempty"`

	// Charge this policy only when the whole request is admitted: a request
	// any policy denies charges none. Without it the policy is charged as
	// caddy-ratelimit charges a zone: policies are taken from the most to
	// the least restrictive (limit per window), and a request is charged to
	// each one that admits it until one denies it, so a zone checked before
	// the one that denies is charged although the request got a 429.
	AllOrNothing bool `json:"all_or_nothing,omitempty"`

	// Units admitted per window (concurrency: requests in flight).
	// The Caddyfile spells it `limit` or `events`.
	MaxEvents int64 `json:"max_events,omitempty"`

	// The period max_events applies to. Required except for concurrency
	// and for a calendar policy.
	Window caddy.Duration `json:"window,omitempty"`

	// Count per calendar period (day, ISO week or month of a time zone)
	// instead of per window: a fixed_window quota such as "1000000 a
	// month". Excludes window; algorithm defaults to fixed_window. Tiers
	// and tenant limits that set neither window nor calendar keep it, and
	// so do runtime overrides.
	Calendar *CalendarConfig `json:"calendar,omitempty"`

	// Capacity of a token_bucket or gcra bucket. Default: max_events.
	Burst int64 `json:"burst,omitempty"`

	// For token_bucket and gcra: the longest a request waits for its turn
	// instead of getting a 429. A request the bucket would deny, but whose
	// turn comes within this, has its turn reserved at once (fleet-wide,
	// in the store) and is passed on when it comes; requests pass in the
	// order of their turns, never faster than the rate. A turn further
	// away is a 429 whose Retry-After is that turn. Allowed 1ms to 1h; 0
	// (default) never waits. Tiers and tenant limits that set none, and
	// runtime overrides, keep it.
	Delay caddy.Duration `json:"delay,omitempty"`

	// Units one request takes: a non-negative integer (0 charges nothing)
	// or a placeholder that
	// resolves to one. Default 1. A placeholder that does not resolve to a
	// non-negative integer costs 1.
	Cost Cost `json:"cost,omitempty"`

	// Charge the real cost of each request once its response is complete,
	// read from a response header or trailer, or from JSON numbers in the
	// body (see CostAfterConfig): the request is admitted on its up-front
	// cost, and the difference is charged (or given back) afterwards. The
	// bucket may go into debt: later requests are refused (or wait, with
	// delay) until it has paid the debt back. Not for concurrency.
	CostAfter *CostAfterConfig `json:"cost_after,omitempty"`

	// What a metered request is charged when its response gave no cost
	// (no header or usage, the client gone before the drain reached it):
	// "estimate" (the request's body bytes / 4 plus the response's
	// generated text bytes / 4, see docs), or a number of units. Absent:
	// its up-front cost only. Needs cost_after.
	CostMissing Cost `json:"cost_missing,omitempty"`

	// The up-front cost of a metered request, read from its JSON request
	// body (e.g. max_tokens) instead of cost (see CostBeforeConfig).
	CostBeforeConfig *CostBeforeConfig `json:"cost_before,omitempty"`

	// Prices per model for cost_after openai|anthropic: the charge is
	// the answer's tokens at the prices of the request's model, in the
	// policy's units (see PriceConfig).
	Prices []PriceConfig `json:"prices,omitempty"`

	// Keep a request's units only when its response status is one of
	// these codes (401) or classes (4xx); any other response gives them
	// back, at the instant they were charged (every algorithm, both
	// stores, leases included). Admission checks the bucket as usual, so a
	// tenant already over the limit is refused before the work. E.g.
	// `401` on a login route keyed by client IP counts failed logins only.
	// A response the chain fails with an error counts its error's status.
	// Excludes refund_status; not for concurrency.
	CountStatus []string `json:"count_status,omitempty"`

	// Give a request's units back when its response status is one of
	// these codes or classes, e.g. `5xx`: what the upstream failed does
	// not cost the tenant. With cost_after, nothing is settled either.
	// Excludes count_status; not for concurrency.
	RefundStatus []string `json:"refund_status,omitempty"`

	// Refuse a tenant (bucket) this policy keeps denying for a while: see
	// PenaltyConfig. Not for concurrency.
	Penalty *PenaltyConfig `json:"penalty,omitempty"`

	// Webhooks for this policy's events, instead of the handler's (see
	// NotifyConfig).
	Notify *NotifyConfig `json:"notify,omitempty"`

	// For sliding_log: the smallest gap between two admitted requests.
	MinInterval caddy.Duration `json:"min_interval,omitempty"`

	// An admitted request after which less than (1 - near_limit) of the
	// limit is left counts as near the limit (metrics, admin API).
	// Default: the handler's near_limit, 0.8.
	NearLimit float64 `json:"near_limit,omitempty"`

	// Limits per tier name; a tenant's tier comes from the handler's
	// `tenant_tiers`, else its `tier` placeholder.
	Tiers map[string]*LimitConfig `json:"tiers,omitempty"`

	// Limits of single tenants (Caddyfile: tenant_limit <tenant> ...); they
	// win over tiers. Runtime overrides set through the admin API win over
	// these.
	TenantLimits map[string]*LimitConfig `json:"tenant_limits,omitempty"`

	// The older name of tenant_limits (Caddyfile: override <tenant> ...),
	// still accepted; a tenant may be in one of the two only.
	Overrides map[string]*LimitConfig `json:"overrides,omitempty"`

	// Local lease of prefetched units for this policy; overrides the
	// handler's lease. Applies to the Redis store only.
	Lease *LeaseConfig `json:"lease,omitempty"`

	// Log would-deny decisions for this policy instead of enforcing them.
	Shadow bool `json:"shadow,omitempty"`

	// What to do when the store is unreachable: open, closed or local.
	// Default: the handler's fail_mode. Applies to the Redis store only.
	FailMode string `json:"fail_mode,omitempty"`

	// When the key resolves to an IPv4 address, count it as its network of
	// this many bits (caddy-ratelimit compatible). 0 keeps the address.
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`

	// When the key resolves to an IPv6 address, count it as its network of
	// this many bits, e.g. 64. 0 keeps the address.
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`
}

// LimitConfig is a tier's or a tenant's limit inside a policy.
type LimitConfig struct {
	// Units per window. Required unless unlimited.
	MaxEvents int64 `json:"max_events,omitempty"`

	// The period; default: the policy's window (or calendar).
	Window caddy.Duration `json:"window,omitempty"`

	// Count per calendar period instead (fixed_window policies only;
	// excludes window); default: the policy's window (or calendar).
	Calendar *CalendarConfig `json:"calendar,omitempty"`

	// Capacity for token_bucket and gcra; default: this max_events.
	Burst int64 `json:"burst,omitempty"`

	// The longest a request waits for its turn (token_bucket and gcra);
	// default: the policy's delay.
	Delay caddy.Duration `json:"delay,omitempty"`

	// No limit at all: such requests never touch the store.
	Unlimited bool `json:"unlimited,omitempty"`

	// Make this tier's or tenant's decisions shadow decisions.
	Shadow bool `json:"shadow,omitempty"`
}

// LeaseConfig sizes the local lease of prefetched units.
type LeaseConfig struct {
	// Most units one store call may take for local use; 0 disables leasing.
	MaxTokens int64 `json:"max_tokens,omitempty"`

	// How long leased units may be served before unused ones go back.
	// Default: a sixth of the policy's window, at least 1s and at most
	// 10s (10s for windows of a minute or longer, 1s for 6s or shorter).
	TTL caddy.Duration `json:"ttl,omitempty"`
}

// Cost is a request's cost: a constant or a placeholder. In JSON it is a
// number (3) or a string ("3", "{http.request.header.X-Cost}").
type Cost string

// UnmarshalJSON accepts a JSON number or string.
func (c *Cost) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*c = Cost(s)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("cost: want a number or a placeholder string: %w", err)
	}
	*c = Cost(n.String())
	return nil
}

// MarshalJSON writes a constant cost as a number, a placeholder as a string.
func (c Cost) MarshalJSON() ([]byte, error) {
	if _, err := strconv.ParseInt(string(c), 10, 64); err == nil {
		return []byte(c), nil
	}
	return json.Marshal(string(c))
}

// constant returns the cost when it is a literal integer.
func (c Cost) Constant() (int64, bool) {
	if c == "" {
		return 1, true
	}
	if strings.Contains(string(c), "{") {
		return 0, false
	}
	n, err := strconv.ParseInt(string(c), 10, 64)
	return n, err == nil
}

// RedisConfig connects the handler to a shared Redis. Without it, Tollgate
// uses the embedded in-process store.
type RedisConfig struct {
	// host:port of the server; several addresses are cluster seeds, or the
	// sentinels when sentinel_master is set.
	Addresses []string `json:"addresses,omitempty"`

	// Use cluster mode even with a single seed address.
	Cluster bool `json:"cluster,omitempty"`

	// Name of the master monitored by the sentinels in addresses.
	SentinelMaster string `json:"sentinel_master,omitempty"`

	// ACL user name. Placeholders such as {env.REDIS_USER} resolve.
	Username string `json:"username,omitempty"`

	// Password. Placeholders such as {env.REDIS_PASSWORD} resolve.
	Password string `json:"password,omitempty"`

	// Database number (standalone and Sentinel only).
	DB int `json:"db,omitempty"`

	// TLS to Redis. Absent means plain TCP.
	TLS *RedisTLSConfig `json:"tls,omitempty"`

	// Connections per node. Default: go-redis's default (10 per CPU).
	PoolSize int `json:"pool_size,omitempty"`

	// Deadline of every Redis call. Default 100ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// First segment of every key. Default "rl".
	KeyPrefix string `json:"key_prefix,omitempty"`

	// Consecutive failures that open the circuit breaker. Default 3.
	BreakerFailures int `json:"breaker_failures,omitempty"`

	// How long the breaker stays open before a probe. Default 5s.
	BreakerCooldown caddy.Duration `json:"breaker_cooldown,omitempty"`

	// Run the scripts as functions of a Redis 7 function library that
	// Tollgate loads on each node (FUNCTION LOAD, then FCALL) instead of
	// EVALSHA: measured 7-38% less Redis time per decision. Default true:
	// a server or ACL user that refuses functions (Redis 6, an ACL without
	// +fcall and +function) is detected at its first call and called with
	// EVALSHA from then on. false: always EVALSHA.
	Functions *bool `json:"functions,omitempty"`
}

// RedisTLSConfig configures TLS to Redis.
type RedisTLSConfig struct {
	// Accept any server certificate. For testing only.
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`

	// PEM file of the CA that signed the server certificate. Default: the
	// system roots.
	CA string `json:"ca,omitempty"`

	// PEM client certificate for mutual TLS.
	Cert string `json:"cert,omitempty"`

	// PEM private key of cert.
	Key string `json:"key,omitempty"`

	// Name to verify the server certificate against. Default: the host of
	// the address.
	ServerName string `json:"server_name,omitempty"`
}

// DefaultKey is the key the Caddyfile writes for a `policy` block that
// sets none when the handler sets no tenant: one bucket per client IP. It
// is the runtime name of the Caddyfile shorthand {client_ip}, which only
// the Caddyfile adapter expands. (A JSON policy without key, like a
// caddy-ratelimit zone, is one bucket shared by every request.)
const DefaultKey = "{http.vars.client_ip}"
