package tollgate

import (
	// The admin API's module, admin.api.rate_limit.
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	_ "github.com/tollgate/caddy-tollgate/admin"
	"github.com/tollgate/caddy-tollgate/metrics"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/limiter"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler enforces per-tenant rate limits. Requests are counted in the
// bucket (tenant, policy, key) of every policy that matches them; the
// request passes only if every enforcing policy admits it, and then every
// policy is charged. A denial is a handler error with status 429 (so
// handle_errors can render it) and a Retry-After header.
//
// Placeholders, set for every request a policy counted and on every 429,
// describing the policy the response headers describe (the enforcing
// policy with the least remaining quota; on a denial, the denying one that
// frees last):
//
//	{http.rate_limit.policy}         policy name ("" for missing_tenant deny)
//	{http.rate_limit.tenant}         its tenant
//	{http.rate_limit.limit}          its limit (-1: nothing counted, e.g. unlimited)
//	{http.rate_limit.remaining}      units left (-1: unknown)
//	{http.rate_limit.retry_after}    whole seconds until the request could pass (0 when admitted)
//	{http.rate_limit.shadow_denied}  comma-separated shadow policies that would have denied
//	{http.rate_limit.delay}          how long the request waited for its turn (a policy's delay), e.g. 250ms; 0s when it did not
//
// Each denial also emits the event rate_limit_exceeded.
type Handler struct {
	config.Handler

	ctx    caddy.Context
	logger *zap.Logger
	events *caddyevents.App
	// gate is the provisioned handler: its policies and the store it
	// decides with (the embedded store or its Redis stack).
	gate *gate.Gate
	// lastStoreWarning (unix nanos) throttles store failure logs.
	lastStoreWarning *atomic.Int64
	policies         []*policyRuntime
	// zones: some policy is charged as a caddy-ratelimit zone (no
	// all_or_nothing), see chargeZones.
	zones      bool
	headerMode config.HeaderMode
	// tenant and tier are the Tenant and Tier templates, compiled.
	tenant, tier template
	// metrics is nil when metrics are disabled.
	metrics *metrics.Handler
	// peers is the handler's hold on its distributed exchange, or nil.
	peers *peerAttachment
	// cleanedUp: Cleanup has run.
	cleanedUp bool
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
)

// Provision builds the policies, loads their matchers and attaches the
// handler to its store.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.ctx = ctx
	h.logger = ctx.Logger()
	h.lastStoreWarning = new(atomic.Int64)

	switch {
	case h.Distributed != nil && h.Redis != nil:
		h.logger.Warn("'distributed' is ignored with a 'redis' block: Redis shares limits exactly")
	case h.Distributed == nil && len(h.StorageRaw) > 0:
		h.logger.Warn("'storage' is used only by 'distributed': it is ignored")
	}
	policies, err := h.Validate()
	if err != nil {
		return err
	}
	h.tenant, h.tier = compileTemplate(h.Tenant), compileTemplate(h.Tier)
	if err := h.provisionPolicies(ctx, policies); err != nil {
		return err
	}
	if err := h.provisionMetrics(ctx); err != nil {
		return err
	}
	h.Warn(h.logger, policies)

	mode, err := config.ParseHeaderMode(h.Headers)
	if err != nil {
		return err
	}
	h.headerMode = mode

	// Events go to the events app when one is configured, which every
	// subscription does; without it nobody could receive them.
	if events, err := ctx.AppIfConfigured("events"); err == nil {
		h.events = events.(*caddyevents.App)
	} else if !errors.Is(err, caddy.ErrNotConfigured) {
		return fmt.Errorf("getting events app: %v", err)
	}

	if h.gate.Store, err = h.openStore(ctx); err != nil {
		return err
	}
	gate.Register(ctx, h.gate, h.logger)
	return nil
}

// openStore opens the store the handler decides with: its stack on the
// shared Redis backend of its settings, or the embedded store (under
// caddy-ratelimit's distributed exchange when configured).
func (h *Handler) openStore(ctx caddy.Context) (gate.Store, error) {
	if h.Redis != nil {
		o := gate.RedisOptions{
			Backend:       h.Redis.BackendOptions(h.logger),
			Hooks:         fleet.Hooks{Logger: h.logger},
			DenialsStream: h.DenialsStream,
			Logger:        h.logger,
		}
		for _, p := range h.policies {
			o.Lease = o.Lease || p.Engine.Lease.Enabled()
		}
		if h.metrics != nil {
			o.Hooks.Observer, o.ObserveLease = metrics.Observer{}, metrics.ObserveLeaseUnits
		}
		return gate.OpenRedis(o)
	}
	m, err := gate.OpenMemory(time.Duration(h.SweepInterval), h.MaxMemory)
	if err != nil {
		return nil, err
	}
	if h.Distributed != nil {
		if err := h.provisionDistributed(ctx, m); err != nil {
			return nil, errors.Join(err, m.Close())
		}
	}
	return m, nil
}

// provisionPolicies pairs the validated policies (in name order, so
// headers and logs are deterministic) with what the Caddy layer needs to
// map a request onto them: matchers, key template, cost.
func (h *Handler) provisionPolicies(ctx caddy.Context, policies []*limiter.Policy) error {
	h.gate = &gate.Gate{Config: &h.Handler, Policies: gate.NewPolicies(&h.Handler, policies)}
	h.policies = make([]*policyRuntime, 0, len(policies))
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
		h.policies = append(h.policies, rt)
	}
	return nil
}

// Cleanup lets go of the shared stores and backend; the last handler to
// do so closes them. Every error is reported. It may be called more than
// once.
//
// The fields requests read (store, stack, backend, denials) keep their
// values: a request still in flight, one that waits for its turn across a
// config reload above all, keeps using them without a data race, and
// finds them released: a closed lease cache decides by its store, a
// released denial stream drops what it is given, and a refund to a Redis
// client closed meanwhile fails (and is logged).
func (h *Handler) Cleanup() error {
	if h.cleanedUp {
		return nil
	}
	h.cleanedUp = true
	var errs []error
	if h.gate != nil {
		gate.Unregister(h.gate)
	}
	errs = append(errs, h.cleanupDistributed())
	if h.gate != nil && h.gate.Store != nil {
		errs = append(errs, h.gate.Store.Close())
	}
	h.cleanupMetrics()
	return errors.Join(errs...)
}

// ServeHTTP decides r against every policy that matches it, all or
// nothing, then either passes it on or answers 429.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	st := getRequestState()
	defer putRequestState(st)

	// An empty tenant (missing_tenant shared) or key is the anonymous
	// bucket: the empty value itself, which no request value that is not
	// empty can equal, in the engine or in a store key.
	var tenant string
	if h.Tenant != "" {
		tenant = h.tenant.expand(repl, r)
		if tenant == "" && h.MissingTenant == config.MissingTenantDeny {
			return h.denyMissingTenant(w, repl)
		}
	}
	tierTemplate := ""
	tierResolved := false
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
			item.Tenant = p.resolveKey(repl, r)
		}
		if tier, ok := h.TenantTiers[item.Tenant]; ok {
			item.Tier = tier
		} else if h.Tier != "" {
			if !tierResolved {
				tierTemplate, tierResolved = h.tier.expand(repl, r), true
			}
			item.Tier = tierTemplate
		}
		st.items = append(st.items, item)
		st.policies = append(st.policies, p)
		st.meters = append(st.meters, p.meter)
		st.metered = st.metered || p.meter != nil
	}
	if len(st.items) == 0 {
		return next.ServeHTTP(w, r)
	}

	d := &st.decision
	d.Overrides = h.gate.Store.Overrides().Table()
	start := h.decisionStart()
	err := h.gate.Store.Decide(r.Context(), d, st.items)
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
	shown := h.report(w, r, repl, st)
	if !d.Admitted {
		if h.zones {
			h.chargeZones(r.Context(), st)
		}
		return h.deny(w, r, repl, st, shown)
	}
	if st.wait > 0 {
		if err := h.waitTurn(r, st); err != nil {
			return err
		}
	}
	if d.HoldsSlots() {
		// Deferred after putRequestState, so it runs first: the slots go
		// back when the rest of the chain returns, panics included.
		defer h.release(r, d)
	}
	if st.metered {
		return h.serveMetered(w, r, next, st)
	}
	return next.ServeHTTP(w, r)
}

// release gives back concurrency slots. The request context may already be
// cancelled (client gone), so it is not used for the store call.
func (h *Handler) release(r *http.Request, d *limiter.Decision) {
	if err := d.Release(context.WithoutCancel(r.Context())); err != nil {
		h.logger.Error("releasing concurrency slots", zap.Error(err))
	}
}

func init() {
	httpcaddyfile.RegisterHandlerDirective("rate_limit", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("rate_limit", httpcaddyfile.After, "forward_auth")
}

// parseCaddyfile builds a Handler from a `rate_limit` directive. Caddy has
// already taken the optional request matcher off the line.
func parseCaddyfile(helper httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	h := new(Handler)
	if err := h.UnmarshalCaddyfile(helper.Dispenser); err != nil {
		return nil, err
	}
	return h, nil
}
