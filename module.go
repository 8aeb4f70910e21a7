package tollgate

import (
	"errors"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	// The admin API's module, admin.api.rate_limit.
	_ "github.com/tollgate/caddy-tollgate/admin"
	"github.com/tollgate/caddy-tollgate/compat"
	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/metrics"

	// The tenant's own view, http.handlers.rate_limit_usage.
	_ "github.com/tollgate/caddy-tollgate/portal"
	"github.com/tollgate/caddy-tollgate/surface"
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

	logger *zap.Logger
	// gate is the provisioned handler (its policies and the store it
	// decides with), server serves its requests, peers is its hold on
	// caddy-ratelimit's distributed exchange (nil without one).
	gate   *gate.Gate
	server *surface.Server
	peers  *compat.Peers
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

// Provision validates the configuration, builds the policies and the
// server of their requests, and opens the store they are decided with.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	policies, err := h.Validate()
	if err != nil {
		return err
	}
	h.Warn(h.logger, policies)
	h.gate = &gate.Gate{Config: &h.Handler, Policies: gate.NewPolicies(&h.Handler, policies)}
	if h.server, err = surface.New(ctx, &h.Handler, h.gate); err != nil {
		return err
	}
	if h.gate.Store, err = h.openStore(ctx); err != nil {
		return err
	}
	h.gate.Signals = h.server
	h.server.WatchBoxes()
	h.gate.Protection = h.server.Protection()
	gate.Register(ctx, h.gate, h.logger)
	return nil
}

// openStore opens the store the handler decides with: its stack on the
// shared Redis backend of its settings, or the embedded store (under
// caddy-ratelimit's distributed exchange when configured).
func (h *Handler) openStore(ctx caddy.Context) (gate.Store, error) {
	if h.Redis != nil {
		o := gate.RedisOptions{
			Backend:       gate.BackendOptions(h.Redis, h.logger),
			Hooks:         fleet.Hooks{Logger: h.logger},
			DenialsStream: h.DenialsStream,
			History:       h.historyOptions(),
			Notify:        h.notifyOptions(),
			Logger:        h.logger,
		}
		if o.Notify != nil {
			o.Hooks.OnBreaker = h.server.BreakerChanged
		}
		for _, p := range h.gate.Policies {
			o.Lease = o.Lease || p.Engine.Lease.Enabled()
		}
		if !h.DisableMetrics {
			o.Hooks.Observer, o.ObserveLease = metrics.Observer{}, metrics.ObserveLeaseUnits
		}
		return gate.OpenRedis(o)
	}
	m, err := gate.OpenMemory(gate.MemoryOptions{Sweep: time.Duration(h.SweepInterval), MaxMemory: h.MaxMemory,
		History: h.historyOptions(), Notify: h.notifyOptions()})
	if err != nil {
		return nil, err
	}
	if h.Distributed != nil {
		if h.peers, err = compat.Distribute(ctx, &h.Handler, h.gate, m, h.logger); err != nil {
			return nil, errors.Join(err, m.Close())
		}
	}
	return m, nil
}

// historyOptions are the usage history's options, nil when the handler
// keeps none.
func (h *Handler) historyOptions() *fleet.HistoryOptions {
	minutes, hours, ok := h.History.Retentions()
	if !ok {
		return nil
	}
	return &fleet.HistoryOptions{MinuteRetention: minutes, HourRetention: hours, Logger: h.logger}
}

// notifyOptions are the webhooks' options, nil when neither the handler
// nor a policy has a notify block.
func (h *Handler) notifyOptions() *fleet.NotifyOptions {
	var timeout time.Duration
	on := h.Notify != nil
	if on {
		timeout = time.Duration(h.Notify.Timeout)
	}
	for _, pc := range h.RateLimits {
		if pc != nil && pc.Notify != nil {
			on = true
			timeout = max(timeout, time.Duration(pc.Notify.Timeout))
		}
	}
	if !on {
		return nil
	}
	o := &fleet.NotifyOptions{Timeout: timeout, Logger: h.logger}
	if !h.DisableMetrics {
		o.Observe = metrics.ObserveNotification
	}
	return o
}

// ServeHTTP decides r against every policy that matches it, all or
// nothing, then either passes it on or answers 429.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	return h.server.ServeHTTP(w, r, next)
}

// Cleanup lets go of the shared stores and backend; the last handler to
// do so closes them. Every error is reported. It may be called more than
// once.
//
// What requests read keeps its value: a request still in flight, one that
// waits for its turn across a config reload above all, keeps using it
// without a data race, and finds it released: a closed lease cache
// decides by its store, a released denial stream drops what it is given,
// and a refund to a Redis client closed meanwhile fails (and is logged).
func (h *Handler) Cleanup() error {
	if h.cleanedUp {
		return nil
	}
	h.cleanedUp = true
	var errs []error
	if h.gate != nil {
		gate.Unregister(h.gate)
	}
	errs = append(errs, h.peers.Close())
	if h.gate != nil && h.gate.Store != nil {
		errs = append(errs, h.gate.Store.Close())
	}
	if h.server != nil {
		h.server.Close()
	}
	return errors.Join(errs...)
}

// The metrics observe the fleet without importing it.
var _ fleet.Observer = metrics.Observer{}

func init() {
	metrics.BreakerOpen = fleet.AnyBreakerOpen
	httpcaddyfile.RegisterHandlerDirective("rate_limit", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("rate_limit", httpcaddyfile.After, "forward_auth")
}

// parseCaddyfile builds a Handler from a `rate_limit` directive. Caddy has
// already taken the optional request matcher off the line.
func parseCaddyfile(helper httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	helper.Reset()
	var seg []caddyfile.Token
	for helper.Next() {
		seg = append(seg, helper.Token())
	}
	if msg := config.OrderWarning(seg, helper.Option("order")); msg != "" {
		caddy.Log().Warn(msg)
	}
	helper.Reset()
	h := new(Handler)
	if err := h.UnmarshalCaddyfile(helper.Dispenser); err != nil {
		return nil, err
	}
	return h, nil
}
