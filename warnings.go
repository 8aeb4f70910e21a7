package tollgate

import (
	"context"
	"slices"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// warnConfig logs, once per provisioning, the configuration that is valid
// but almost certainly not what the operator meant. None of it is an error:
// the config runs as written.
func (h *Handler) warnConfig() {
	if len(h.RateLimits) == 0 {
		h.logger.Warn("rate_limit defines no zone or policy: it limits nothing")
	}
	if h.Jitter > 1 {
		h.logger.Warn("jitter is a fraction of the wait (0.2 adds up to 20%), not a percentage: this one can multiply Retry-After",
			zap.Float64("jitter", h.Jitter))
	}
	for _, tenant := range sortedKeys(h.TenantTiers) {
		tier := h.TenantTiers[tenant]
		defined := false
		for _, p := range h.policies {
			if _, ok := p.policy.Tiers[tier]; ok {
				defined = true
				break
			}
		}
		if !defined {
			h.logger.Warn("tenant_tier names a tier that no policy defines: the tenant gets each policy's own limit",
				zap.String("tenant", tenant), zap.String("tier", tier))
		}
	}
	if h.Redis != nil && (h.MaxMemory != 0 || h.SweepInterval != 0) {
		h.logger.Warn("max_memory and sweep_interval size the embedded store: they are ignored with a redis block")
	}
	if h.Redis == nil {
		if h.Lease != nil && h.Lease.MaxTokens > 0 {
			h.logger.Warn("lease is ignored on the embedded store: it decides in process memory, leases only save calls to a shared Redis")
		}
		for _, name := range sortedKeys(h.RateLimits) {
			if lc := h.RateLimits[name].Lease; lc != nil && lc.MaxTokens > 0 {
				h.logger.Warn("lease is ignored on the embedded store", zap.String("policy", name))
			}
		}
	}
	for _, p := range h.policies {
		if pc := h.RateLimits[p.name]; p.policy.Algorithm == limiter.Concurrency && pc.Window > 0 {
			h.logger.Warn("window is ignored by the concurrency algorithm (it limits requests in flight)", zap.String("policy", p.name))
		}
	}
}

// policyOwners records, per config generation, which handler defined each
// policy name first, to warn when two handlers (e.g. two sites) define the
// same name: policies are named buckets, so both share the budget.
var policyOwners = struct {
	sync.Mutex
	// generation -> policy name -> handlers defining it
	m map[any]map[string][]*Handler
}{m: map[any]map[string][]*Handler{}}

// warnSharedPolicies warns about policy names this handler shares with
// another handler of the same config. A config generation is identified
// by its metrics registry, which Caddy creates for each load and shares
// with every module of it; its entry goes when the config's context ends.
func (h *Handler) warnSharedPolicies(ctx caddy.Context) {
	gen := any(ctx.GetMetricsRegistry())
	policyOwners.Lock()
	defer policyOwners.Unlock()
	byName := policyOwners.m[gen]
	if byName == nil {
		byName = map[string][]*Handler{}
		policyOwners.m[gen] = byName
		context.AfterFunc(ctx, func() {
			policyOwners.Lock()
			delete(policyOwners.m, gen)
			policyOwners.Unlock()
		})
	}
	for _, p := range h.policies {
		name := p.policy.Name
		if others := byName[name]; len(others) > 0 && !slices.Contains(others, h) {
			h.logger.Warn("policy name defined by more than one rate_limit handler: they share its buckets (policies are named buckets); give distinct budgets distinct names",
				zap.String("policy", name), zap.Int("handlers", len(others)+1))
		}
		byName[name] = append(byName[name], h)
	}
}
