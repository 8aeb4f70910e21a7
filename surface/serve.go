package surface

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/tollgate/caddy-tollgate/compat"
	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/limiter"
	"go.uber.org/zap"
)

// provisionPolicies pairs the validated policies (in name order, so
// headers and logs are deterministic) with what the Caddy layer needs to
// map a request onto them: matchers, key template, cost.
func (h *Server) provisionPolicies(ctx caddy.Context) error {
	h.policies = make([]*policyRuntime, 0, len(h.gate.Policies))
	var err error
	for i, gp := range h.gate.Policies {
		name := gp.Name
		pc := h.RateLimits[name]
		rt := &policyRuntime{
			Policy:     gp,
			index:      i,
			key:        compileTemplate(pc.Key),
			ipv4Prefix: pc.IPv4Prefix,
			ipv6Prefix: pc.IPv6Prefix,
		}
		// Validated with the policy: only compiled here.
		if rt.meter, err = pc.Meter(name, gp.Engine.Algorithm); err != nil {
			return err
		}
		rt.meter = sameMeter(h.policies, rt.meter)
		if rt.costBefore, err = pc.CostBefore(name, rt.meter); err != nil {
			return err
		}
		if rt.outcome, err = pc.Outcome(name, gp.Engine.Algorithm); err != nil {
			return err
		}
		nc := pc.Notify
		if nc == nil {
			nc = h.Notify
		}
		if rt.notify, err = compileNotify(nc, gp.Near); err != nil {
			return fmt.Errorf("rate_limits.%s.notify: %v", name, err)
		}
		h.notifies = h.notifies || rt.notify != nil
		if n, ok := pc.Cost.Constant(); ok {
			rt.cost = n
		} else {
			rt.cost, rt.costTemplate = -1, compileTemplate(string(pc.Cost))
		}
		if pc.MatcherSetsRaw != nil {
			mods, err := ctx.LoadModule(pc, "MatcherSetsRaw")
			if err != nil {
				return fmt.Errorf("rate_limits.%s.match: loading matchers: %v", name, err)
			}
			if err := rt.matchers.FromInterface(mods); err != nil {
				return fmt.Errorf("rate_limits.%s.match: %v", name, err)
			}
		}
		rt.precomputeHeaders()
		h.zones = h.zones || !rt.AllOrNothing
		h.penalties = h.penalties || gp.Engine.Penalty.On()
		h.policies = append(h.policies, rt)
	}
	return nil
}

// keepSlotsEvery is how often a request holding concurrency slots on
// Redis keeps them alive (limiter.KeepSlotsEvery); a variable so that a
// test can watch it happen in less than 20 seconds.
var keepSlotsEvery = limiter.KeepSlotsEvery

// keepNothing is the stop of a request that keeps no slots.
func keepNothing() {}

// ServeHTTP decides r against every policy that matches it, all or
// nothing, then either passes it on or answers 429.
func (h *Server) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	st := getRequestState()
	defer putRequestState(st)

	// An empty tenant (missing_tenant shared) or key is the anonymous
	// tenant "_anonymous"; a request sending that value literally gets a
	// bucket of its own (limiter.TenantOf, the one place that says so).
	var tenant string
	if h.Tenant != "" {
		v := h.tenant.expand(repl, r)
		if v == "" && h.MissingTenant == config.MissingTenantDeny {
			return h.denyMissingTenant(w, r, repl)
		}
		tenant = limiter.TenantOf(v)
	}
	var tiers tierCache
	for _, p := range h.policies {
		ok, err := p.matches(r)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		item := limiter.Item{Policy: p.Engine, Tenant: tenant, Cost: p.requestCost(repl, r)}
		if h.Tenant != "" {
			item.Part = p.resolveKey(repl, r)
		} else {
			item.Tenant = limiter.TenantOf(p.resolveKey(repl, r))
		}
		item.Tier = tiers.of(h, item.Tenant, repl, r)
		st.items = append(st.items, item)
		st.policies = append(st.policies, p)
		st.gates = append(st.gates, p.Policy)
		st.meters = append(st.meters, p.meter)
		st.metered = st.metered || p.meter != nil
		st.outcomes = st.outcomes || p.outcome != nil
		st.readBody = st.readBody || p.costBefore != nil || (p.meter != nil && p.meter.Preset != 0)
	}
	if len(st.items) == 0 {
		if h.protection != nil {
			// No policy to take the tenant and tier from: the same
			// rules, without one. Without tenant, a request is its
			// client IP's, as a policy's default key makes it.
			if h.Tenant == "" {
				tenant = limiter.TenantOf(h.clientIP.expand(repl, r))
			}
			return h.serveProtected(w, r, repl, next, st, tenant, tiers.of(h, tenant, repl, r))
		}
		return next.ServeHTTP(w, r)
	}
	if st.readBody {
		if err := h.readRequestBody(w, r, st); err != nil {
			return err
		}
	}

	d := &st.decision
	d.Overrides = h.gate.Store.Overrides().Table()
	if h.penalties {
		d.Penalties = h.gate.Store.Penalties()
	}
	start := h.decisionStart()
	err := h.gate.Store.Decide(r.Context(), d, st.items)
	if limiter.CallerLeft(r.Context(), err) {
		// The client went away while its call waited for the store:
		// nothing was decided, nothing is counted.
		return caddyhttp.Error(statusClientClosedRequest, fmt.Errorf("rate limit: client went away before its decision: %w", err))
	}
	if err != nil && !errors.Is(err, limiter.ErrInvalidCheck) {
		// The store failed and the fail modes decided: d is complete.
		h.storeFailed(err)
		err = nil
	}
	if err != nil {
		// Input the store refused: a bug, never a reason to admit.
		return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("rate limit decision: %w", err))
	}
	h.markNearLimit(st)
	h.recordDecision(st, start)
	h.noteHistory(st)
	if h.notifies {
		h.signal(st)
	}
	shown := h.report(w, r, repl, st)
	h.traceDecision(r, st, shown)
	if !d.Admitted {
		if h.zones {
			if err := compat.ChargeZones(r.Context(), h.gate.Store, st.gates, st.items, d); err != nil && !errors.Is(err, limiter.ErrInvalidCheck) {
				h.storeFailed(err)
			}
		}
		return h.deny(w, r, repl, st, shown)
	}
	holds := d.HoldsSlots()
	stopKeeping := keepNothing
	if holds {
		// The slots are taken from the decision on: a request that holds
		// them longer than a lease on Redis (a long wait for its turn, a
		// long response) renews their leases and its counters' TTL.
		stopKeeping = d.KeepSlotsAlive(keepSlotsEvery)
	}
	if st.wait > 0 {
		if err := h.waitTurn(r, st); err != nil {
			stopKeeping() // waitTurn gave the slots back
			return err
		}
	}
	if holds {
		// Deferred after putRequestState, so they run first: the slots go
		// back when the rest of the chain returns, panics included, the
		// keeping stopped before.
		defer h.release(r, d)
		defer stopKeeping()
	}
	if h.protection != nil {
		if h.Tenant == "" {
			tenant = st.items[0].Tenant // the key is the tenant
		}
		return h.serveProtected(w, r, repl, next, st, tenant, st.items[0].Tier)
	}
	return h.serveAdmitted(w, r, next, st)
}

// tierCache resolves the tiers of one request's tenants, expanding the
// tier template at most once.
type tierCache struct {
	expanded string
	done     bool
}

// of is tenant's tier: its tenant_tiers entry, else the handler's tier
// template's value for r, else none. Policies and protect take the tier
// from here alike.
func (c *tierCache) of(h *Server, tenant string, repl *caddy.Replacer, r *http.Request) string {
	if tier, ok := h.TenantTiers[tenant]; ok {
		return tier
	}
	if h.Tier == "" {
		return ""
	}
	if !c.done {
		c.expanded, c.done = h.tier.expand(repl, r), true
	}
	return c.expanded
}

// serveAdmitted passes an admitted request on: through the metered
// writer, the outcome writer, or as it is.
func (h *Server) serveAdmitted(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, st *requestState) error {
	if st.metered {
		return h.serveMetered(w, r, next, st)
	}
	if st.outcomes {
		return h.serveOutcome(w, r, next, st)
	}
	return next.ServeHTTP(w, r)
}

// release gives back concurrency slots. The request context may already be
// cancelled (client gone), so it is not used for the store call. A release
// that fails is kept and sent again once Redis answers (slots held under
// an id, as every decision's are), so it is logged as a warning.
func (h *Server) release(r *http.Request, d *limiter.Decision) {
	if err := h.gate.Store.Release(context.WithoutCancel(r.Context()), d); err != nil {
		h.logger.Warn("releasing concurrency slots; kept to retry once Redis answers", zap.Error(err))
	}
}
