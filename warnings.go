package tollgate

import (
	"context"
	"slices"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

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
