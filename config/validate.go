package config

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

// This file is the one place where the rules of a rate_limit configuration
// live. Validate checks every field of a Handler and builds its
// policies; errors are fieldErrors that name the JSON path of the field at
// fault and the allowed values. A JSON config gets them as they are; the
// Caddyfile parser (caddyfile.go) runs the same validator on what it read
// and maps each path to the line it recorded, so both say the same thing.
// The numeric domain and what each algorithm accepts come from package
// limiter (CheckCount, CheckWindow, Algorithm.CheckBurst, ...).

// Allowed values of the enumerated fields ("" always means the default).
var (
	missingTenantValues = []string{"shared", "deny"}
	headersValues       = []string{"both", "ietf", "legacy", "off"}
	failModeValues      = []string{"open", "closed", "local"}
)

// maxMetricsTenants bounds metrics_tenants: every tenant series is a
// Prometheus series per policy and decision, and the top-k that finds them
// keeps about 4n entries.
const maxMetricsTenants = 10000

// The range of max_memory: below 1 MiB a store holds a few thousand
// buckets, too few to be a limiter; 1 TiB is far beyond any real host.
const (
	minMaxMemory = 1 << 20
	maxMaxMemory = 1 << 40
)

// nameRule describes limiter.ValidName for error messages.
const nameRule = "use 1-64 letters, digits, '_', '-' or '.'"

// defaultAlgorithm is the algorithm of a policy that names none: the exact
// trailing window caddy-ratelimit counts its zones with, so its JSON means
// what it meant there. The Caddyfile's `policy` blocks write their own
// default, sliding_window, into the JSON.
const defaultAlgorithm = limiter.SlidingLog

// countRange describes the allowed counts from least to limiter.MaxCount.
func countRange(least int64) string {
	return fmt.Sprintf("an integer from %d to %d", least, limiter.MaxCount)
}

// fieldError is a configuration error at a JSON path, e.g.
// rate_limits.api.max_events. msg says what is wrong and what is allowed.
type fieldError struct {
	path []string
	msg  string
}

func (e *fieldError) Error() string { return strings.Join(e.path, ".") + ": " + e.msg }

// at builds the fieldError of path.
func at(path []string, format string, args ...any) *fieldError {
	return &fieldError{path: slices.Clone(path), msg: fmt.Sprintf(format, args...)}
}

// PolicyNames returns the names of h's policies in the order Validate
// returns them (sorted).
func (h *Handler) PolicyNames() []string { return sortedKeys(h.RateLimits) }

// sub is path with more segments.
func sub(path []string, more ...string) []string {
	return append(slices.Clone(path), more...)
}

// Validate checks every field of h and returns its policies in name
// order, built for the engine. Decisions where the contract is silent:
//
//   - A handler without policies is valid, as in caddy-ratelimit: it
//     limits nothing (Provision warns).
//   - Any string is a policy name, as any string is a caddy-ratelimit zone
//     name; names that are not valid engine names get an internal name
//     (InternalName).
//   - A lease set on a sliding_log or concurrency policy is an error (those
//     algorithms cannot lease); the handler-level lease is only a default,
//     and policies whose algorithm cannot lease do not inherit it.
//   - A calendar policy without algorithm is fixed_window (the only
//     algorithm that counts per period); with another algorithm it is an
//     error.
//   - With distributed (and no redis) every policy must count with
//     sliding_log: what instances exchange is a count of logged units.
//   - jitter must not be negative (caddy-ratelimit's only rule); NaN means
//     no jitter and Retry-After stays bounded whatever the value.
func (h *Handler) Validate() ([]*limiter.Policy, error) {
	if err := h.validateHandler(); err != nil {
		return nil, err
	}
	policies := make([]*limiter.Policy, 0, len(h.RateLimits))
	for _, name := range sortedKeys(h.RateLimits) {
		p, err := h.validatePolicy(name, h.RateLimits[name])
		if err != nil {
			return nil, err
		}
		if h.Distributed != nil && h.Redis == nil && p.Algorithm != limiter.SlidingLog {
			return nil, at([]string{"rate_limits", name, "algorithm"}, "%s: distributed shares sliding_log usage only, as caddy-ratelimit's zones count (use algorithm sliding_log, or a redis block to share any algorithm exactly)", p.Algorithm)
		}
		policies = append(policies, p)
	}
	return policies, nil
}

// validateHandler checks the handler-level fields.
func (h *Handler) validateHandler() error {
	for _, e := range []struct {
		field, value string
		allowed      []string
	}{
		{"missing_tenant", h.MissingTenant, missingTenantValues},
		{"headers", h.Headers, headersValues},
		{"fail_mode", h.FailMode, failModeValues},
	} {
		if err := checkEnum([]string{e.field}, e.value, e.allowed); err != nil {
			return err
		}
	}
	if j := h.Jitter; j < 0 {
		return at([]string{"jitter"}, "%v: must not be negative (a fraction: 0.2 adds up to 20%% to Retry-After)", j)
	}
	switch {
	case h.DenialsStream < 0:
		return at([]string{"denials_stream"}, "%d: must not be negative (0 disables the stream)", h.DenialsStream)
	case h.DenialsStream > 0 && h.Redis == nil:
		return at([]string{"denials_stream"}, "needs a redis block (the stream lives in Redis)")
	case h.MetricsTenants < 0 || h.MetricsTenants > maxMetricsTenants:
		return at([]string{"metrics_tenants"}, "%d is out of range (allowed: 0 to %d; 0 disables per-tenant series)", h.MetricsTenants, maxMetricsTenants)
	case h.SweepInterval < 0:
		return at([]string{"sweep_interval"}, "%s: must not be negative", time.Duration(h.SweepInterval))
	case h.MaxMemory != 0 && (h.MaxMemory < minMaxMemory || h.MaxMemory > maxMaxMemory):
		return at([]string{"max_memory"}, "%d bytes is out of range (allowed: %d (1 MiB) to %d (1 TiB); 0 means 256 MiB)", h.MaxMemory, int64(minMaxMemory), int64(maxMaxMemory))
	}
	if err := checkNearLimit([]string{"near_limit"}, h.NearLimit); err != nil {
		return err
	}
	if err := checkDrain(h.Drain); err != nil {
		return err
	}
	if err := checkHistory([]string{"history"}, h.History); err != nil {
		return err
	}
	if err := checkNotify([]string{"notify"}, h.Notify); err != nil {
		return err
	}
	if err := checkProtect(h.Protect); err != nil {
		return err
	}
	if d := h.Distributed; d != nil {
		for _, f := range []struct {
			field string
			v     caddy.Duration
		}{{"read_interval", d.ReadInterval}, {"write_interval", d.WriteInterval}, {"purge_age", d.PurgeAge}} {
			if f.v < 0 {
				return at([]string{"distributed", f.field}, "%s: must not be negative (0 is the default)", time.Duration(f.v))
			}
		}
	}
	for _, tenant := range sortedKeys(h.TenantTiers) {
		if tenant == "" || h.TenantTiers[tenant] == "" {
			return at([]string{"tenant_tiers", tenant}, "tenant and tier must not be empty (tier %q)", h.TenantTiers[tenant])
		}
	}
	if err := checkLease([]string{"lease"}, h.Lease); err != nil {
		return err
	}
	if h.Redis != nil {
		return h.Redis.validate([]string{"redis"})
	}
	return nil
}

// validatePolicy checks the policy rate_limits.<name> and builds it.
func (h *Handler) validatePolicy(name string, pc *PolicyConfig) (*limiter.Policy, error) {
	path := []string{"rate_limits", name}
	if pc == nil {
		return nil, at(path, "policy is null")
	}
	alg := defaultAlgorithm
	if pc.Algorithm != "" {
		var err error
		if alg, err = limiter.ParseAlgorithm(pc.Algorithm); err != nil {
			return nil, at(sub(path, "algorithm"), "%q: unknown (allowed: %s)", pc.Algorithm, limiter.AlgorithmNames)
		}
	}
	if pc.Algorithm == "" && pc.Calendar != nil {
		alg = limiter.FixedWindow // a calendar quota counts per period
	}
	if err := checkCalendar(sub(path, "calendar"), pc.Calendar, time.Duration(pc.Window), alg); err != nil {
		return nil, err
	}
	if pc.MaxEvents == 0 {
		return nil, at(sub(path, "max_events"), "must be set to %s", countRange(1))
	}
	if err := limiter.CheckCount(pc.MaxEvents, 1); err != nil {
		return nil, at(sub(path, "max_events"), "%v", err)
	}
	if pc.Window == 0 && alg != limiter.Concurrency && pc.Calendar == nil {
		if alg == limiter.FixedWindow {
			return nil, at(sub(path, "window"), "required for algorithm %s (only concurrency takes none), or a calendar period instead", alg)
		}
		return nil, at(sub(path, "window"), "required for algorithm %s (only concurrency takes none)", alg)
	}
	if err := checkWindow(sub(path, "window"), pc.Window); err != nil {
		return nil, err
	}
	if err := checkBurst(sub(path, "burst"), pc.Burst, alg); err != nil {
		return nil, err
	}
	if err := checkDelay(sub(path, "delay"), pc.Delay, alg); err != nil {
		return nil, err
	}
	if err := checkCost(sub(path, "cost"), pc.Cost); err != nil {
		return nil, err
	}
	m, err := pc.compileMeter(path, alg)
	if err != nil {
		return nil, err
	}
	if _, err := compileCostBefore(path, pc.CostBeforeConfig, m); err != nil {
		return nil, err
	}
	if _, err := pc.compileOutcome(path, alg); err != nil {
		return nil, err
	}
	if err := checkPenalty(sub(path, "penalty"), pc.Penalty, alg); err != nil {
		return nil, err
	}
	if err := checkNotify(sub(path, "notify"), pc.Notify); err != nil {
		return nil, err
	}
	if pc.CostAfter != nil && h.Distributed != nil && h.Redis == nil {
		return nil, at(sub(path, "cost_after"), "not with distributed, whose counts are approximate; use a redis block")
	}
	if err := limiter.CheckInterval(time.Duration(pc.MinInterval)); err != nil {
		return nil, at(sub(path, "min_interval"), "%v", err)
	}
	if err := alg.CheckMinInterval(time.Duration(pc.MinInterval)); err != nil {
		return nil, at(sub(path, "min_interval"), "%v", err)
	}
	for _, group := range []struct {
		field string
		m     map[string]*LimitConfig
	}{{"tiers", pc.Tiers}, {"tenant_limits", pc.TenantLimits}, {"overrides", pc.Overrides}} {
		for _, k := range sortedKeys(group.m) {
			if err := checkLimitConfig(sub(path, group.field, k), k, group.m[k], alg); err != nil {
				return nil, err
			}
		}
	}
	tenantLimits, err := pc.tenantLimits(path)
	if err != nil {
		return nil, err
	}
	if err := checkLease(sub(path, "lease"), pc.Lease); err != nil {
		return nil, err
	}
	if pc.Lease != nil {
		if err := alg.CheckLease(pc.Lease.MaxTokens); err != nil {
			return nil, at(sub(path, "lease"), "%v", err)
		}
	}
	if err := checkEnum(sub(path, "fail_mode"), pc.FailMode, failModeValues); err != nil {
		return nil, err
	}
	if err := checkNearLimit(sub(path, "near_limit"), pc.NearLimit); err != nil {
		return nil, err
	}
	if pc.IPv4Prefix < 0 || pc.IPv4Prefix > 32 {
		return nil, at(sub(path, "ipv4_prefix"), "%d is out of range (allowed: 0 to 32)", pc.IPv4Prefix)
	}
	if pc.IPv6Prefix < 0 || pc.IPv6Prefix > 128 {
		return nil, at(sub(path, "ipv6_prefix"), "%d is out of range (allowed: 0 to 128)", pc.IPv6Prefix)
	}
	return buildPolicy(name, pc, alg, tenantLimits, h), nil
}

// tenantLimits merges tenant_limits with overrides, their older spelling,
// refusing a tenant given in both.
func (pc *PolicyConfig) tenantLimits(path []string) (map[string]*LimitConfig, error) {
	if len(pc.Overrides) == 0 {
		return pc.TenantLimits, nil
	}
	if len(pc.TenantLimits) == 0 {
		return pc.Overrides, nil
	}
	out := make(map[string]*LimitConfig, len(pc.TenantLimits)+len(pc.Overrides))
	for k, v := range pc.TenantLimits {
		out[k] = v
	}
	for _, k := range sortedKeys(pc.Overrides) {
		if _, dup := out[k]; dup {
			return nil, at(sub(path, "overrides", k), "tenant %q is also in tenant_limits (overrides is the older name of tenant_limits: use one)", k)
		}
		out[k] = pc.Overrides[k]
	}
	return out, nil
}

// checkLimitConfig checks one tier or tenant limit at path.
func checkLimitConfig(path []string, name string, lc *LimitConfig, alg limiter.Algorithm) error {
	switch {
	case name == "":
		return at(path, "the name must not be empty")
	case lc == nil:
		return at(path, "is null")
	case lc.Unlimited:
		if lc.MaxEvents != 0 || lc.Window != 0 || lc.Burst != 0 || lc.Calendar != nil || lc.Delay != 0 {
			return at(path, "unlimited excludes max_events, window, calendar, burst and delay")
		}
		return nil
	case lc.MaxEvents == 0:
		return at(sub(path, "max_events"), "must be set to %s, or unlimited", countRange(1))
	}
	if err := limiter.CheckCount(lc.MaxEvents, 1); err != nil {
		return at(sub(path, "max_events"), "%v", err)
	}
	if err := checkWindow(sub(path, "window"), lc.Window); err != nil {
		return err
	}
	if err := checkCalendar(sub(path, "calendar"), lc.Calendar, time.Duration(lc.Window), alg); err != nil {
		return err
	}
	if err := checkDelay(sub(path, "delay"), lc.Delay, alg); err != nil {
		return err
	}
	return checkBurst(sub(path, "burst"), lc.Burst, alg)
}

// checkWindow checks a window at path; 0 is allowed (absent: the default).
func checkWindow(path []string, w caddy.Duration) error {
	if w == 0 {
		return nil
	}
	if err := limiter.CheckWindow(time.Duration(w)); err != nil {
		return at(path, "%v", err)
	}
	return nil
}

// checkBurst checks a burst at path.
func checkBurst(path []string, burst int64, alg limiter.Algorithm) error {
	if err := limiter.CheckCount(burst, 0); err != nil {
		return at(path, "%v", err)
	}
	if err := alg.CheckBurst(burst); err != nil {
		return at(path, "%v", err)
	}
	return nil
}

// checkDelay checks a delay at path: 0 (none), or limiter.MinDelay to
// limiter.MaxDelay for an algorithm that hands out turns.
func checkDelay(path []string, d caddy.Duration, alg limiter.Algorithm) error {
	if err := limiter.CheckDelay(time.Duration(d)); err != nil {
		return at(path, "%v", err)
	}
	if err := alg.CheckDelay(time.Duration(d)); err != nil {
		return at(path, "%v", err)
	}
	return nil
}

// checkCost accepts an empty cost (1), an integer of the numeric domain or
// a placeholder.
func checkCost(path []string, c Cost) error {
	if n, ok := c.Constant(); ok {
		if err := limiter.CheckCount(n, 0); err != nil {
			return at(path, "%v", err)
		}
		return nil
	}
	s := string(c)
	if i := strings.IndexByte(s, '{'); i < 0 || !strings.Contains(s[i:], "}") {
		return at(path, "%q: want an integer from 0 to %d or a placeholder such as {http.request.header.X-Cost}", s, limiter.MaxCount)
	}
	return nil
}

// checkLease checks a lease at path.
func checkLease(path []string, lc *LeaseConfig) error {
	if lc == nil {
		return nil
	}
	if err := limiter.CheckCount(lc.MaxTokens, 0); err != nil {
		return at(sub(path, "max_tokens"), "%v; 0 disables leasing", err)
	}
	return checkWindow(sub(path, "ttl"), lc.TTL)
}

// checkNearLimit accepts 0 (the default) and fractions in (0, 1].
func checkNearLimit(path []string, f float64) error {
	if f != 0 && (math.IsNaN(f) || f < 0 || f > 1) {
		return at(path, "%v: want a fraction above 0 and at most 1 (0.8: near once less than 20%% of the limit is left; 1: never)", f)
	}
	return nil
}

// checkEnum accepts "" (the default) and the allowed values.
func checkEnum(path []string, s string, allowed []string) error {
	if s == "" || slices.Contains(allowed, s) {
		return nil
	}
	return at(path, "%q: unknown value (allowed: %s)", s, strings.Join(allowed, ", "))
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

// validate checks the redis block at path.
func (rc *RedisConfig) validate(path []string) error {
	if len(rc.Addresses) == 0 {
		return at(sub(path, "addresses"), "at least one host:port is required")
	}
	for i, a := range rc.Addresses {
		if err := checkAddress(a); err != nil {
			return at(sub(path, "addresses["+strconv.Itoa(i)+"]"), "%v", err)
		}
	}
	switch {
	case rc.Cluster && rc.SentinelMaster != "":
		return at(path, "cluster mode and a sentinel master are mutually exclusive")
	case rc.DB < 0:
		return at(sub(path, "db"), "%d: must not be negative", rc.DB)
	case rc.Cluster && rc.DB != 0:
		return at(sub(path, "db"), "%d: Redis Cluster has only db 0", rc.DB)
	case rc.PoolSize < 0:
		return at(sub(path, "pool_size"), "%d: must not be negative (0 is the default)", rc.PoolSize)
	case rc.Timeout < 0:
		return at(sub(path, "timeout"), "must not be negative (0 is the default, %s)", limiter.DefaultRedisTimeout)
	case rc.KeyPrefix != "" && !limiter.ValidName(rc.KeyPrefix):
		return at(sub(path, "key_prefix"), "%q: %s", rc.KeyPrefix, nameRule)
	case rc.BreakerFailures < 0:
		return at(sub(path, "breaker_failures"), "%d: must not be negative (0 is the default, %d)", rc.BreakerFailures, limiter.DefaultBreakerFailures)
	case rc.BreakerCooldown < 0:
		return at(sub(path, "breaker_cooldown"), "must not be negative (0 is the default, %s)", limiter.DefaultBreakerCooldown)
	case rc.TLS != nil && (rc.TLS.Cert == "") != (rc.TLS.Key == ""):
		return at(sub(path, "tls"), "cert and key must be given together")
	}
	return nil
}

// buildPolicy converts a validated policy into the engine's form. Tiers
// and tenant limits default their window to the policy's and their burst
// to their own limit (not the policy's burst); they inherit the policy's
// min_interval, and its delay unless they set their own. A tier or tenant limit is shadow when it says so, when its
// policy is shadow or when the whole handler is. The fail mode is the
// policy's, else the handler's.
func buildPolicy(name string, pc *PolicyConfig, alg limiter.Algorithm, tenantLimits map[string]*LimitConfig, h *Handler) *limiter.Policy {
	shadow := pc.Shadow || h.Shadow
	p := &limiter.Policy{
		Name:      InternalName(name),
		Algorithm: alg,
		Limit: limiter.Limit{
			Rate: limiter.Rate{
				Limit:       pc.MaxEvents,
				Window:      time.Duration(pc.Window),
				Burst:       pc.Burst,
				MinInterval: time.Duration(pc.MinInterval),
				Delay:       time.Duration(pc.Delay),
			},
			Shadow: shadow,
		},
	}
	if cal, _ := pc.Calendar.calendar(); cal != nil { // validated
		p.Limit.Window, p.Limit.Calendar = cal.Nominal(), cal
	}
	lc := pc.Lease
	if lc == nil {
		lc = h.Lease
	}
	if lc != nil && lc.MaxTokens > 0 && alg.SupportsLease() {
		// The handler's lease is a default: algorithms that cannot lease
		// do not inherit it (validatePolicy refuses it on the policy).
		p.Lease = limiter.Lease{Max: lc.MaxTokens, TTL: time.Duration(lc.TTL)}
	}
	p.Tiers = convertLimits(pc.Tiers, p.Limit.Rate, shadow)
	p.TenantLimits = convertLimits(tenantLimits, p.Limit.Rate, shadow)
	mode := pc.FailMode
	if mode == "" {
		mode = h.FailMode
	}
	p.FailMode, _ = limiter.ParseFailMode(mode) // validated
	p.Penalty = pc.Penalty.penalty()
	return p
}

// convertLimits converts tiers or tenant limits; base is the policy's rate.
// A limit that sets neither window nor calendar keeps the policy's period.
func convertLimits(m map[string]*LimitConfig, base limiter.Rate, shadow bool) map[string]limiter.Limit {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]limiter.Limit, len(m))
	for k, lc := range m {
		l := limiter.Limit{Unlimited: lc.Unlimited, Shadow: lc.Shadow || shadow}
		if !lc.Unlimited {
			l.Rate = limiter.Rate{
				Limit:       lc.MaxEvents,
				Window:      time.Duration(lc.Window),
				Burst:       lc.Burst,
				MinInterval: base.MinInterval,
				Delay:       base.Delay,
			}
			if lc.Delay != 0 {
				l.Delay = time.Duration(lc.Delay)
			}
			if cal, _ := lc.Calendar.calendar(); cal != nil { // validated
				l.Window, l.Calendar = cal.Nominal(), cal
			} else if l.Window == 0 {
				l.Window, l.Calendar = base.Window, base.Calendar
			}
		}
		out[k] = l
	}
	return out
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
