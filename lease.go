package tollgate

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// provisionLeases puts a lease cache in front of the Redis backend when
// any policy leases (DESIGN §6). Each handler has its own, so a config
// reload (a new handler, the old one cleaned up) and a shutdown give every
// lease back.
func (h *Handler) provisionLeases() {
	leasing := false
	for _, p := range h.policies {
		leasing = leasing || p.policy.Lease.Enabled()
	}
	if !leasing {
		return
	}
	opts := limiter.LeaseOptions{
		Store:     h.backend.store,
		Taker:     h.backend.store,
		Instances: h.backend.registry.Count,
		OnGiveBackError: func(err error) {
			h.logger.Debug("giving leased units back to Redis", zap.Error(err))
		},
	}
	if h.metrics != nil {
		opts.Observe = observeLeaseUnits
	}
	h.leases = limiter.NewLeaseStore(opts)
	h.store = h.leases
}

// leaseCounters caches, per policy, the children of
// caddy_rate_limit_lease_units_total, so counting spent units on the
// request path is a map read and an atomic add.
var leaseCounters sync.Map // policy name -> *[limiter.NumLeaseEvents]prometheus.Counter

// observeLeaseUnits implements limiter.LeaseOptions.Observe.
func observeLeaseUnits(policy string, ev limiter.LeaseEvent, units int64) {
	v, ok := leaseCounters.Load(policy)
	if !ok {
		var cs [limiter.NumLeaseEvents]prometheus.Counter
		for e := range limiter.NumLeaseEvents {
			cs[e] = collectors.leaseUnits.WithLabelValues(policy, e.String())
		}
		v, _ = leaseCounters.LoadOrStore(policy, &cs)
	}
	if ev < limiter.NumLeaseEvents && units > 0 {
		v.(*[limiter.NumLeaseEvents]prometheus.Counter)[ev].Add(float64(units))
	}
}

// forgetLeases drops this process's leases and cached denials of tenant
// (of policy only, when set) in every handler on the backend b, or on
// every backend when b is nil: after a reset they would serve stale
// answers until they expire.
func forgetLeases(b *redisBackend, tenant, policy string) {
	handlersMu.RLock()
	defer handlersMu.RUnlock()
	for _, h := range liveHandlers() {
		if h.leases != nil && (b == nil || h.backend == b) {
			h.leases.Forget(tenant, policy)
		}
	}
}
