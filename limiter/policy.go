package limiter

import (
	"fmt"
)

// Limit is what a policy, a tier, a tenant limit or a runtime override
// grants one tenant.
type Limit struct {
	Rate
	// Unlimited skips counting entirely: no store call at all.
	Unlimited bool
	// Shadow makes the tenant's decisions for the policy shadow decisions:
	// counted, logged when they would deny, never enforced.
	Shadow bool
}

// Source says which rule a resolved Limit came from.
type Source uint8

// Sources of a limit, most specific last.
const (
	SourcePolicy Source = iota
	SourceTier
	SourceTenantLimit
	SourceRuntimeOverride
)

var sourceNames = [...]string{"policy", "tier", "tenant_limit", "runtime_override"}

// String names s as the admin API reports it.
func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return fmt.Sprintf("source(%d)", uint8(s))
}

// Policy is one named rate limit: a rate, an algorithm, and per-tier and
// per-tenant exceptions. Policies are immutable once built; share them.
type Policy struct {
	// Name identifies the policy in keys, headers, logs and metrics.
	Name string
	// Algorithm decides how buckets of this policy count.
	Algorithm Algorithm
	// Limit is the policy's own limit, used when no tier, tenant limit or
	// runtime override applies.
	Limit Limit
	// Tiers maps a tier name to the limit of tenants in that tier.
	Tiers map[string]Limit
	// TenantLimits maps a tenant to its own limit (a static, per-tenant
	// limit of the configuration; runtime overrides are looked up by the
	// Decision before Resolve).
	TenantLimits map[string]Limit
	// FailMode decides the policy's requests while its store fails.
	FailMode FailMode
	// Lease lets a LeaseStore serve the policy's enforced checks from
	// locally leased units. Ignored when Algorithm cannot lease.
	Lease Lease
	// Penalty puts a bucket the store keeps denying in a penalty box (see
	// Penalty); the zero value boxes nothing.
	Penalty Penalty
}

// Resolve returns the limit that applies to tenant (whose tier is tier) and
// where it came from: the tenant's own limit (TenantLimits) beats its tier, which
// beats the policy's own limit. Runtime overrides are looked up by the
// caller before Resolve.
func (p *Policy) Resolve(tenant, tier string) (Limit, Source) {
	if l, ok := p.TenantLimits[tenant]; ok {
		return l, SourceTenantLimit
	}
	if tier != "" {
		if l, ok := p.Tiers[tier]; ok {
			return l, SourceTier
		}
	}
	return p.Limit, SourcePolicy
}

// Validate reports the first problem with p, naming the field at fault.
func (p *Policy) Validate() error {
	if !ValidName(p.Name) {
		return fmt.Errorf("policy name %q: use 1-64 letters, digits, '_', '-' or '.'", p.Name)
	}
	if p.Algorithm >= numAlgorithms {
		return fmt.Errorf("policy %s: unknown algorithm (allowed: %s)", p.Name, AlgorithmNames)
	}
	if err := p.validateLimit(p.Limit); err != nil {
		return fmt.Errorf("policy %s: %w", p.Name, err)
	}
	if err := p.Penalty.Validate(); err != nil {
		return fmt.Errorf("policy %s: %w", p.Name, err)
	}
	if p.Penalty.On() && p.Algorithm == Concurrency {
		return fmt.Errorf("policy %s: penalty: a concurrency limit has no window to count denials in (allowed with: token_bucket, gcra, sliding_window, fixed_window, sliding_log)", p.Name)
	}
	for name, l := range p.Tiers {
		if err := p.validateLimit(l); err != nil {
			return fmt.Errorf("policy %s: tier %s: %w", p.Name, name, err)
		}
	}
	for tenant, l := range p.TenantLimits {
		if err := p.validateLimit(l); err != nil {
			return fmt.Errorf("policy %s: tenant limit %s: %w", p.Name, tenant, err)
		}
	}
	return nil
}

// ValidateLimit reports why l cannot be a limit of p (a tier, an
// override or a runtime override), nil when it can.
func (p *Policy) ValidateLimit(l Limit) error { return p.validateLimit(l) }

func (p *Policy) validateLimit(l Limit) error {
	if l.Unlimited {
		return nil
	}
	if err := CheckCount(l.Limit, 1); err != nil {
		return fmt.Errorf("limit: %w", err)
	}
	if p.Algorithm != Concurrency || l.Window != 0 {
		if err := CheckWindow(l.Window); err != nil {
			return fmt.Errorf("window: %w", err)
		}
	}
	if err := CheckCount(l.Burst, 0); err != nil {
		return fmt.Errorf("burst: %w", err)
	}
	if err := CheckInterval(l.MinInterval); err != nil {
		return fmt.Errorf("min_interval: %w", err)
	}
	if err := p.Algorithm.CheckBurst(l.Burst); err != nil {
		return fmt.Errorf("burst: %w", err)
	}
	if err := p.Algorithm.CheckMinInterval(l.MinInterval); err != nil {
		return fmt.Errorf("min_interval: %w", err)
	}
	if err := checkCalendar(l.Rate, p.Algorithm); err != nil {
		return fmt.Errorf("calendar: %w", err)
	}
	if err := CheckDelay(l.Delay); err != nil {
		return fmt.Errorf("delay: %w", err)
	}
	if err := p.Algorithm.CheckDelay(l.Delay); err != nil {
		return fmt.Errorf("delay: %w", err)
	}
	return nil
}
