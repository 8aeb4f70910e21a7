package config

import (
	"github.com/tollgate/caddy-tollgate/limiter"
	"go.uber.org/zap"
)

// Warn logs the configuration that is valid but almost certainly not what
// the operator meant, once per provisioning; policies are what Validate
// returned. None of it is an error: the config runs as written.
func (h *Handler) Warn(logger *zap.Logger, policies []*limiter.Policy) {
	if len(h.RateLimits) == 0 && h.Protect == nil {
		logger.Warn("rate_limit defines no zone or policy: it limits nothing")
	}
	if h.Jitter > 1 {
		logger.Warn("jitter is a fraction of the wait (0.2 adds up to 20%), not a percentage: this one can multiply Retry-After",
			zap.Float64("jitter", h.Jitter))
	}
	for _, tenant := range sortedKeys(h.TenantTiers) {
		tier := h.TenantTiers[tenant]
		// A protect weight gives the tier a meaning too.
		defined := false
		if h.Protect != nil {
			_, defined = h.Protect.Weights[tier]
		}
		for _, p := range policies {
			if _, ok := p.Tiers[tier]; ok {
				defined = true
				break
			}
		}
		if !defined {
			logger.Warn("tenant_tier names a tier that no policy defines: the tenant gets each policy's own limit",
				zap.String("tenant", tenant), zap.String("tier", tier))
		}
	}
	h.warnDistributed(logger)
	if h.Redis != nil && (h.MaxMemory != 0 || h.SweepInterval != 0) {
		logger.Warn("max_memory and sweep_interval size the embedded store: they are ignored with a redis block")
	}
	if h.Redis == nil {
		if h.Lease != nil && h.Lease.MaxTokens > 0 {
			logger.Warn("lease is ignored on the embedded store: it decides in process memory, leases only save calls to a shared Redis")
		}
		for _, name := range sortedKeys(h.RateLimits) {
			if lc := h.RateLimits[name].Lease; lc != nil && lc.MaxTokens > 0 {
				logger.Warn("lease is ignored on the embedded store", zap.String("policy", name))
			}
		}
	}
	for i, name := range sortedKeys(h.RateLimits) { // the order of policies
		if pc := h.RateLimits[name]; i < len(policies) && policies[i].Algorithm == limiter.Concurrency && pc.Window > 0 {
			logger.Warn("window is ignored by the concurrency algorithm (it limits requests in flight)", zap.String("policy", name))
		}
	}
}

// warnDistributed logs one WARN when caddy-ratelimit's distributed or
// storage is set, naming the redis block as what supersedes them: beside
// one they are ignored; without one, distributed runs caddy-ratelimit's
// sync through storage (approximate), and storage alone does nothing.
// Both are accepted so that a caddy-ratelimit config keeps loading.
func (h *Handler) warnDistributed(logger *zap.Logger) {
	storage := len(h.StorageRaw) > 0
	switch {
	case h.Redis != nil && (h.Distributed != nil || storage):
		var ignored []string
		if h.Distributed != nil {
			ignored = append(ignored, "distributed")
		}
		if storage {
			ignored = append(ignored, "storage")
		}
		logger.Warn("distributed and storage are superseded by the redis block, which shares limits exactly across the fleet: they are ignored",
			zap.Strings("ignored", ignored))
	case h.Distributed != nil:
		logger.Warn("distributed syncs limits through storage as caddy-ratelimit does, approximately (a fleet can admit more than a zone's events in a window); a redis block supersedes it with exact fleet-wide limits")
	case storage:
		logger.Warn("storage is used only by distributed: it is ignored; a redis block supersedes both with exact fleet-wide limits")
	}
}
