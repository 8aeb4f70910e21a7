package compat

import (
	"cmp"
	"context"
	"math"
	"slices"
	"sync"

	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// This file holds what makes a caddy-ratelimit zone a Tollgate policy:
// the internal name of a zone whose name is not a valid policy name, the
// display forms of a name for headers and metric labels, and how a denied
// request charges zones.
//
// caddy-ratelimit takes any string as a zone name ("api:v1", "per user",
// a 100-character name). Policy names become part of Redis keys and of the
// engine's bucket identity, where limiter.ValidName keeps them free of key
// separators and hash-tag braces; so a zone whose name is not a valid
// policy name is known to the engine (keys, the admin API) by an internal
// name, and to everything a user reads (placeholders, logs, events, metric
// labels, headers) by the name as configured.

// zoneCharge is the scratch space of chargeZones, pooled: a flood of
// denials must not allocate per request.
type zoneCharge struct {
	order    []int
	items    []limiter.Item
	decision limiter.Decision
}

var zoneCharges = sync.Pool{New: func() any { return new(zoneCharge) }}

// ChargeZones charges, after the all-or-nothing decision d denied the
// request, what caddy-ratelimit would have charged: it takes its zones
// from the most permissive (most events per unit of window) to the least,
// charging each one that admits the request until one denies it. Only
// policies without all_or_nothing take part (caddy-ratelimit's zones);
// shadow verdicts never charge a denied request, nor do concurrency slots
// (they would never be released), nor turns of a delay. The charge is a second store call at a
// later instant, so a concurrent request may have taken what this one
// would have: then, like a zone that denies, nothing more is charged.
//
// policies[i] is the policy of items[i], d the decision that denied them.
// It returns the store's error, if any (a failed charge is not retried).
func ChargeZones(ctx context.Context, store gate.Store, policies []*gate.Policy, items []limiter.Item, d *limiter.Decision) error {
	zc := zoneCharges.Get().(*zoneCharge)
	defer func() {
		clear(zc.items)
		zc.order, zc.items = zc.order[:0], zc.items[:0]
		zc.decision.Reset()
		zoneCharges.Put(zc)
	}()
	for i := range items {
		if !policies[i].AllOrNothing && d.Verdicts[i].Enforced() {
			zc.order = append(zc.order, i)
		}
	}
	slices.SortStableFunc(zc.order, func(a, b int) int {
		return cmp.Compare(permissiveness(&d.Verdicts[b]), permissiveness(&d.Verdicts[a]))
	})
	for _, i := range zc.order {
		if !d.Verdicts[i].Result.Allowed {
			break
		}
		if items[i].Policy.Algorithm != limiter.Concurrency {
			zc.items = append(zc.items, items[i])
		}
	}
	if len(zc.items) == 0 {
		return nil
	}
	cd := &zc.decision
	cd.Overrides = store.Overrides().Table()
	// The request is denied: a zone that could only admit it later (a
	// delay) must not take a turn nobody will use.
	cd.NoDelay = true
	return store.Decide(ctx, cd, zc.items)
}

// permissiveness orders zones as caddy-ratelimit does: events per unit of
// window, of the limit in force.
func permissiveness(v *limiter.Verdict) float64 {
	if v.Limit.Window <= 0 {
		return math.Inf(1)
	}
	return float64(v.Limit.Limit) / float64(v.Limit.Window)
}
