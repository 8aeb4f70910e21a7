package tollgate

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/fleet"
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
	// store decides requests: the embedded store, or the stack's store.
	store limiter.Store
	// storeKey names the embedded store in its pool ("" with Redis).
	storeKey string
	// backend, attachment and stack: the shared Redis backend, this
	// handler's hooks on it, and its store stack (nil without Redis).
	backend    *fleet.Backend
	attachment *fleet.Attachment
	stack      *fleet.Stack
	// fallbackKey names the shared fallback store of fail_mode local.
	fallbackKey string
	// denials is the backend's denial stream while this handler uses it
	// (denials_stream > 0), else nil.
	denials *fleet.DenialStream
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
	metrics *handlerMetrics
	// overrides holds the runtime overrides (admin API) of the store.
	overrides *fleet.OverrideTable
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
	h.warnSharedPolicies(ctx)

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

	if h.Redis != nil {
		if err := h.provisionRedis(); err != nil {
			return err
		}
	} else {
		sweep := time.Duration(h.SweepInterval)
		if sweep <= 0 {
			sweep = limiter.DefaultSweepInterval
		}
		if h.store, h.storeKey, err = loadEmbeddedStore(sweep, h.MaxMemory); err != nil {
			return err
		}
		h.overrides = memoryOverrides
		if h.Distributed != nil {
			if err := h.provisionDistributed(ctx); err != nil {
				return err
			}
		}
	}
	registerHandler(h)
	return nil
}

// provisionRedis attaches the handler to the shared backend of its Redis
// settings and builds its store stack on it.
func (h *Handler) provisionRedis() error {
	backend, err := fleet.Acquire(h.Redis.BackendOptions(h.logger))
	if err != nil {
		return fmt.Errorf("redis: %v", err)
	}
	h.backend = backend
	hooks := fleet.Hooks{Logger: h.logger}
	if h.metrics != nil {
		hooks.Observer = metricsObserver{}
	}
	h.attachment = backend.Attach(hooks)
	fallback, fallbackKey, err := loadFallbackStore()
	if err != nil {
		return err
	}
	h.fallbackKey = fallbackKey
	opts := fleet.StackOptions{Fallback: fallback, Logger: h.logger}
	for _, p := range h.policies {
		opts.Lease = opts.Lease || p.policy.Lease.Enabled()
	}
	if h.metrics != nil {
		opts.ObserveLease = observeLeaseUnits
	}
	h.stack = fleet.NewStack(backend, opts)
	h.store = h.stack.Store()
	h.overrides = backend.Overrides().Table()
	if h.DenialsStream > 0 {
		h.denials = backend.Denials()
		h.denials.Acquire(h.DenialsStream)
	}
	return nil
}

// provisionPolicies pairs the validated policies (in name order, so
// headers and logs are deterministic) with what the Caddy layer needs to
// map a request onto them: matchers, key template, cost.
func (h *Handler) provisionPolicies(ctx caddy.Context, policies []*limiter.Policy) error {
	h.policies = make([]*policyRuntime, 0, len(policies))
	names := h.PolicyNames() // the order of policies
	var err error
	for i, policy := range policies {
		name := names[i]
		pc := h.RateLimits[name]
		rt := &policyRuntime{
			policy:       policy,
			name:         name,
			key:          compileTemplate(pc.Key),
			ipv4Prefix:   pc.IPv4Prefix,
			ipv6Prefix:   pc.IPv6Prefix,
			allOrNothing: pc.AllOrNothing,
		}
		rt.near = h.NearFraction(pc)
		// Validated with the policy: only compiled here.
		if rt.meter, err = pc.Meter(name, policy.Algorithm); err != nil {
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
		h.zones = h.zones || !rt.allOrNothing
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
	unregisterHandler(h)
	if h.denials != nil {
		h.denials.Release(h.DenialsStream)
	}
	errs = append(errs, h.cleanupDistributed())
	if h.storeKey != "" {
		_, err := embeddedStores.Delete(h.storeKey)
		errs = append(errs, err)
	}
	if h.stack != nil {
		// Before the backend goes: the give-backs need its client.
		errs = append(errs, h.stack.Close())
	}
	if h.attachment != nil {
		h.attachment.Detach()
	}
	if h.backend != nil {
		errs = append(errs, h.backend.Release())
	}
	if h.fallbackKey != "" {
		_, err := embeddedStores.Delete(h.fallbackKey)
		errs = append(errs, err)
	}
	h.storeKey, h.fallbackKey = "", ""
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
		item := limiter.Item{Policy: p.policy, Tenant: tenant, Cost: p.requestCost(repl, r)}
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
	d.Overrides = h.overrides
	start := h.decisionStart()
	var err error
	if h.Redis == nil {
		err = d.Decide(r.Context(), h.store, st.items)
	} else if err = h.stack.Decide(r.Context(), d, st.items); err != nil && !errors.Is(err, limiter.ErrInvalidCheck) {
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
