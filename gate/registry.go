package gate

import (
	"context"
	"slices"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// The registry of live handlers: the admin API finds the rate_limit
// handlers of the running config here.

// live is every provisioned Gate, in provisioning order. During a reload
// the old and the new config's handlers are both present until the old
// ones are cleaned up.
var (
	liveMu sync.RWMutex
	live   []*Gate
)

// Register adds g to the live handlers, and warns about policy names it
// shares with another handler of the same config (see warnShared).
func Register(ctx caddy.Context, g *Gate, logger *zap.Logger) {
	warnShared(ctx, g, logger)
	liveMu.Lock()
	defer liveMu.Unlock()
	live = append(live, g)
}

// Unregister removes g from the live handlers.
func Unregister(g *Gate) {
	liveMu.Lock()
	defer liveMu.Unlock()
	if i := slices.Index(live, g); i >= 0 {
		live = slices.Delete(live, i, i+1)
	}
}

// RLock read-locks the registry: a handler being cleaned up (which
// unregisters it first) waits until RUnlock, so what it holds stays
// usable meanwhile.
func RLock() { liveMu.RLock() }

// RUnlock undoes RLock.
func RUnlock() { liveMu.RUnlock() }

// Gates returns the live handlers; call it under RLock.
func Gates() []*Gate { return live }

// policyOwners records, per config generation, which handlers defined
// each policy name, to warn when two handlers (e.g. two sites) define the
// same name: policies are named buckets, so both share the budget.
var policyOwners = struct {
	sync.Mutex
	// generation -> policy name -> handlers defining it
	m map[any]map[string][]*Gate
}{m: map[any]map[string][]*Gate{}}

// warnShared warns about policy names g shares with another handler of
// the same config. A config generation is identified by its metrics
// registry, which Caddy creates for each load and shares with every
// module of it; its entry goes when the config's context ends.
func warnShared(ctx caddy.Context, g *Gate, logger *zap.Logger) {
	gen := any(ctx.GetMetricsRegistry())
	policyOwners.Lock()
	defer policyOwners.Unlock()
	byName := policyOwners.m[gen]
	if byName == nil {
		byName = map[string][]*Gate{}
		policyOwners.m[gen] = byName
		context.AfterFunc(ctx, func() {
			policyOwners.Lock()
			delete(policyOwners.m, gen)
			policyOwners.Unlock()
		})
	}
	for _, p := range g.Policies {
		name := p.Engine.Name
		if others := byName[name]; len(others) > 0 && !slices.Contains(others, g) {
			logger.Warn("policy name defined by more than one rate_limit handler: they share its buckets (policies are named buckets); give distinct budgets distinct names",
				zap.String("policy", name), zap.Int("handlers", len(others)+1))
		}
		byName[name] = append(byName[name], g)
	}
}
