package tollgate

import (
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// Allowed values of the enumerated fields ("" always means the default).
var (
	missingTenantValues = []string{"shared", "deny"}
	headersValues       = []string{"both", "ietf", "legacy", "off"}
	failModeValues      = []string{"open", "closed", "local"}
)

// maxJitter bounds jitter. caddy-ratelimit only requires jitter >= 0 and
// its README calls it a percentage, so configs such as `jitter 20` exist
// and must keep working; anything above 100 (10000% extra) is certainly a
// mistake and would make Retry-After arithmetic overflow-prone.
const maxJitter = 100

// maxMetricsTenants bounds metrics_tenants: every tenant series is a
// Prometheus series per policy and decision, and the top-k that finds them
// keeps about 4n entries.
const maxMetricsTenants = 10000

// countRange describes the allowed counts from least to limiter.MaxCount.
func countRange(least int64) string {
	return fmt.Sprintf("an integer from %d to %d", least, limiter.MaxCount)
}

// nameRule describes limiter.ValidName for error messages.
const nameRule = "use 1-64 letters, digits, '_', '-' or '.'"

// validateConfig checks every field of h, for JSON configs that never went
// through the Caddyfile parser (which applies the same rules and names the
// line instead). Errors name the JSON path and the allowed values.
//
// Decisions where the contract is silent:
//   - At least one policy is required. caddy-ratelimit accepts a handler
//     without zones, but such a handler does nothing at all, which is
//     almost certainly a configuration mistake.
//   - A lease set on a sliding_log or concurrency policy is an error (those
//     algorithms cannot lease, see limiter.Algorithm.SupportsLease); the
//     handler-level lease is only a default, and policies whose algorithm
//     cannot lease simply do not inherit it.
//   - jitter must be a finite number from 0 to maxJitter.
func (h *Handler) validateConfig() error {
	if err := checkEnumField("missing_tenant", h.MissingTenant, missingTenantValues); err != nil {
		return err
	}
	if err := checkEnumField("headers", h.Headers, headersValues); err != nil {
		return err
	}
	if err := checkEnumField("fail_mode", h.FailMode, failModeValues); err != nil {
		return err
	}
	if err := checkJitter(h.Jitter); err != nil {
		return fmt.Errorf("jitter: %w", err)
	}
	if h.DenialsStream < 0 {
		return fmt.Errorf("denials_stream: %d: must not be negative (0 disables the stream)", h.DenialsStream)
	}
	if h.MetricsTenants < 0 || h.MetricsTenants > maxMetricsTenants {
		return fmt.Errorf("metrics_tenants: %d is out of range (allowed: 0 to %d; 0 disables per-tenant series)", h.MetricsTenants, maxMetricsTenants)
	}
	if h.SweepInterval < 0 {
		return fmt.Errorf("sweep_interval: %s: must not be negative", time.Duration(h.SweepInterval))
	}
	for _, tenant := range sortedKeys(h.TenantTiers) {
		if tenant == "" || h.TenantTiers[tenant] == "" {
			return fmt.Errorf("tenant_tiers: %q: %q: tenant and tier must not be empty", tenant, h.TenantTiers[tenant])
		}
	}
	if err := checkLease("lease", h.Lease); err != nil {
		return err
	}
	if h.Redis != nil {
		if err := h.Redis.validate(); err != nil {
			return err
		}
	}
	if len(h.RateLimits) == 0 {
		return errors.New("rate_limits: no policy defined: add at least one policy")
	}
	for _, name := range sortedKeys(h.RateLimits) {
		if err := validatePolicy(name, h.RateLimits[name], h); err != nil {
			return err
		}
	}
	return nil
}

// validatePolicy checks the policy rate_limits.<name>.
func validatePolicy(name string, pc *PolicyConfig, h *Handler) error {
	path := "rate_limits." + name
	if !limiter.ValidName(name) {
		return fmt.Errorf("rate_limits: policy name %q: %s", name, nameRule)
	}
	if pc == nil {
		return fmt.Errorf("%s: policy is null", path)
	}
	alg, err := limiter.ParseAlgorithm(pc.Algorithm)
	if err != nil {
		return fmt.Errorf("%s: algorithm %q: unknown (allowed: %s)", path, pc.Algorithm, limiter.AlgorithmNames)
	}
	if pc.MaxEvents == 0 {
		return fmt.Errorf("%s.max_events: required (%s)", path, countRange(1))
	}
	if err := limiter.CheckCount(pc.MaxEvents, 1); err != nil {
		return fmt.Errorf("%s.max_events: %w", path, err)
	}
	if err := checkPolicyWindow(path, pc.Window, alg); err != nil {
		return err
	}
	if err := checkBurst(path, pc.Burst, alg); err != nil {
		return err
	}
	if err := checkCost(pc.Cost); err != nil {
		return fmt.Errorf("%s.%w", path, err)
	}
	if err := limiter.CheckInterval(time.Duration(pc.MinInterval)); err != nil {
		return fmt.Errorf("%s.min_interval: %w", path, err)
	}
	if pc.MinInterval > 0 && alg != limiter.SlidingLog {
		return fmt.Errorf("%s.min_interval: %s", path, minIntervalMisuse(alg))
	}
	for _, rules := range []struct {
		field string
		m     map[string]*LimitConfig
	}{{"tiers", pc.Tiers}, {"overrides", pc.Overrides}} {
		for _, k := range sortedKeys(rules.m) {
			if err := checkLimitConfig(fmt.Sprintf("%s.%s.%s", path, rules.field, k), k, rules.m[k], alg); err != nil {
				return err
			}
		}
	}
	if err := checkLease(path+".lease", pc.Lease); err != nil {
		return err
	}
	if pc.Lease != nil && pc.Lease.MaxTokens > 0 && !alg.SupportsLease() {
		return fmt.Errorf("%s.lease: %s", path, leaseMisuse(alg))
	}
	if err := checkEnumField(path+".fail_mode", pc.FailMode, failModeValues); err != nil {
		return err
	}
	if pc.IPv4Prefix < 0 || pc.IPv4Prefix > 32 {
		return fmt.Errorf("%s.ipv4_prefix: %d: must be from 0 to 32", path, pc.IPv4Prefix)
	}
	if pc.IPv6Prefix < 0 || pc.IPv6Prefix > 128 {
		return fmt.Errorf("%s.ipv6_prefix: %d: must be from 0 to 128", path, pc.IPv6Prefix)
	}
	if _, err := buildPolicy(name, pc, h); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// checkLimitConfig checks one tier or override at path.
func checkLimitConfig(path, name string, lc *LimitConfig, alg limiter.Algorithm) error {
	switch {
	case name == "":
		return fmt.Errorf("%s: the name must not be empty", path)
	case lc == nil:
		return fmt.Errorf("%s: is null", path)
	case lc.Unlimited:
		if lc.MaxEvents != 0 || lc.Window != 0 || lc.Burst != 0 {
			return fmt.Errorf("%s: unlimited excludes max_events, window and burst", path)
		}
		return nil
	case lc.MaxEvents == 0:
		return fmt.Errorf("%s.max_events: required (%s), or set unlimited", path, countRange(1))
	}
	if err := limiter.CheckCount(lc.MaxEvents, 1); err != nil {
		return fmt.Errorf("%s.max_events: %w", path, err)
	}
	if lc.Window != 0 {
		if err := limiter.CheckWindow(time.Duration(lc.Window)); err != nil {
			return fmt.Errorf("%s.window: %w (0 means the policy's window)", path, err)
		}
	}
	return checkBurst(path, lc.Burst, alg)
}

// checkPolicyWindow checks a policy's own window.
func checkPolicyWindow(path string, w caddy.Duration, alg limiter.Algorithm) error {
	if w == 0 && alg != limiter.Concurrency {
		return fmt.Errorf("%s.window: required for algorithm %s (only concurrency takes none)", path, alg)
	}
	if w == 0 {
		return nil
	}
	if err := limiter.CheckWindow(time.Duration(w)); err != nil {
		return fmt.Errorf("%s.window: %w", path, err)
	}
	return nil
}

// checkBurst checks the burst at path.
func checkBurst(path string, burst int64, alg limiter.Algorithm) error {
	if err := limiter.CheckCount(burst, 0); err != nil {
		return fmt.Errorf("%s.burst: %w (0 means the limit)", path, err)
	}
	if burst > 0 && !alg.UsesBurst() {
		return fmt.Errorf("%s.burst: %s", path, burstMisuse(alg))
	}
	return nil
}

func burstMisuse(alg limiter.Algorithm) string {
	return fmt.Sprintf("burst applies only to token_bucket and gcra, not %s", alg)
}

func minIntervalMisuse(alg limiter.Algorithm) string {
	return fmt.Sprintf("min_interval applies only to sliding_log, not %s", alg)
}

func leaseMisuse(alg limiter.Algorithm) string {
	return fmt.Sprintf("%s cannot lease units (every request must reach the store); remove lease or use lease 0", alg)
}

// checkCost accepts an empty cost (1), a non-negative integer or a
// placeholder. The error starts with "cost".
func checkCost(c Cost) error {
	if n, ok := c.constant(); ok {
		if err := limiter.CheckCount(n, 0); err != nil {
			return fmt.Errorf("cost: %w", err)
		}
		return nil
	}
	s := string(c)
	if i := strings.IndexByte(s, '{'); i < 0 || !strings.Contains(s[i:], "}") {
		return fmt.Errorf("cost: %q: want a non-negative integer or a placeholder such as {http.request.header.X-Cost}", s)
	}
	return nil
}

// checkLease checks a lease at path.
func checkLease(path string, lc *LeaseConfig) error {
	if lc == nil {
		return nil
	}
	if err := limiter.CheckCount(lc.MaxTokens, 0); err != nil {
		return fmt.Errorf("%s.max_tokens: %w; 0 disables leasing", path, err)
	}
	if lc.TTL != 0 {
		if err := limiter.CheckWindow(time.Duration(lc.TTL)); err != nil {
			return fmt.Errorf("%s.ttl: %w (0 means 1s)", path, err)
		}
	}
	return nil
}

// checkJitter accepts a finite fraction from 0 to maxJitter.
func checkJitter(j float64) error {
	if math.IsNaN(j) || j < 0 || j > maxJitter {
		return fmt.Errorf("%v: want a fraction from 0 to %d (0.2 adds up to 20%% to Retry-After)", j, maxJitter)
	}
	return nil
}

// checkEnum reports whether s is one of allowed.
func checkEnum(s string, allowed []string) error {
	if slices.Contains(allowed, s) {
		return nil
	}
	return fmt.Errorf("%q: unknown value (allowed: %s)", s, strings.Join(allowed, ", "))
}

// checkEnumField is checkEnum for the JSON field at path; empty is the
// default and always allowed.
func checkEnumField(path, s string, allowed []string) error {
	if s == "" {
		return nil
	}
	if err := checkEnum(s, allowed); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// checkAddress accepts host:port with a numeric port, host optional
// (":6379" is the local host).
func checkAddress(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		var n uint64
		n, err = strconv.ParseUint(port, 10, 16)
		if err == nil && n == 0 {
			err = errors.New("port 0")
		}
	}
	if err != nil {
		return fmt.Errorf("%q: want host:port, e.g. localhost:6379", addr)
	}
	return nil
}

// validate checks the redis block.
func (rc *RedisConfig) validate() error {
	if len(rc.Addresses) == 0 {
		return errors.New("redis.addresses: at least one host:port is required")
	}
	for i, a := range rc.Addresses {
		if err := checkAddress(a); err != nil {
			return fmt.Errorf("redis.addresses[%d]: %w", i, err)
		}
	}
	switch {
	case rc.Cluster && rc.SentinelMaster != "":
		return errors.New("redis: cluster and sentinel_master are mutually exclusive")
	case rc.DB < 0:
		return fmt.Errorf("redis.db: %d: must not be negative", rc.DB)
	case rc.Cluster && rc.DB != 0:
		return fmt.Errorf("redis.db: %d: Redis Cluster has only db 0", rc.DB)
	case rc.PoolSize < 0:
		return fmt.Errorf("redis.pool_size: %d: must not be negative (0 is the default)", rc.PoolSize)
	case rc.Timeout < 0:
		return errors.New("redis.timeout: must not be negative (0 is the default, 100ms)")
	case rc.KeyPrefix != "" && !limiter.ValidName(rc.KeyPrefix):
		return fmt.Errorf("redis.key_prefix: %q: %s", rc.KeyPrefix, nameRule)
	case rc.BreakerFailures < 0:
		return fmt.Errorf("redis.breaker_failures: %d: must not be negative (0 is the default, 3)", rc.BreakerFailures)
	case rc.BreakerCooldown < 0:
		return errors.New("redis.breaker_cooldown: must not be negative (0 is the default, 5s)")
	case rc.TLS != nil && (rc.TLS.Cert == "") != (rc.TLS.Key == ""):
		return errors.New("redis.tls: cert and key must be given together")
	}
	return nil
}

// buildPolicy converts the policy named name into the engine's form and
// validates it. Tiers and overrides default their window to the policy's
// and their burst to their own limit (not the policy's burst); they inherit
// the policy's min_interval. A tier or override is shadow when it says so,
// when its policy is shadow or when the whole handler is (h may be nil).
func buildPolicy(name string, pc *PolicyConfig, h *Handler) (*limiter.Policy, error) {
	if pc == nil {
		return nil, fmt.Errorf("policy %s: is null", name)
	}
	alg, err := limiter.ParseAlgorithm(pc.Algorithm)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", name, err)
	}
	shadow := pc.Shadow || (h != nil && h.Shadow)
	p := &limiter.Policy{
		Name:      name,
		Algorithm: alg,
		Limit: limiter.Limit{
			Rate: limiter.Rate{
				Limit:       pc.MaxEvents,
				Window:      time.Duration(pc.Window),
				Burst:       pc.Burst,
				MinInterval: time.Duration(pc.MinInterval),
			},
			Shadow: shadow,
		},
	}
	lc := pc.Lease
	if lc == nil && h != nil {
		lc = h.Lease
	}
	if lc != nil && lc.MaxTokens > 0 && alg.SupportsLease() {
		// The handler's lease is a default: algorithms that cannot lease
		// do not inherit it (validateConfig rejects it on the policy).
		p.Lease = limiter.Lease{Max: lc.MaxTokens, TTL: time.Duration(lc.TTL)}
	}
	if p.Tiers, err = convertLimits(pc.Tiers, p.Limit.Rate, shadow); err != nil {
		return nil, fmt.Errorf("policy %s: tier %w", name, err)
	}
	if p.Overrides, err = convertLimits(pc.Overrides, p.Limit.Rate, shadow); err != nil {
		return nil, fmt.Errorf("policy %s: override %w", name, err)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

// convertLimits converts tiers or overrides; base is the policy's rate.
func convertLimits(m map[string]*LimitConfig, base limiter.Rate, shadow bool) (map[string]limiter.Limit, error) {
	if len(m) == 0 {
		return nil, nil
	}
	out := make(map[string]limiter.Limit, len(m))
	for k, lc := range m {
		if lc == nil {
			return nil, fmt.Errorf("%s: is null", k)
		}
		l := limiter.Limit{Unlimited: lc.Unlimited, Shadow: lc.Shadow || shadow}
		if !lc.Unlimited {
			l.Rate = limiter.Rate{
				Limit:       lc.MaxEvents,
				Window:      time.Duration(lc.Window),
				Burst:       lc.Burst,
				MinInterval: base.MinInterval,
			}
			if l.Window == 0 {
				l.Window = base.Window
			}
		}
		out[k] = l
	}
	return out, nil
}

// sortedKeys returns the keys of m in order, so errors are deterministic.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
