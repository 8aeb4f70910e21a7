// Package surface is the HTTP surface of a rate_limit handler: how a
// request maps onto its policies (tenant, key, tier and cost), the
// decision's placeholders and headers, the 429, the log lines, events and
// denial stream entries, waiting for a turn, and the response writer that
// reads a metered cost and settles it. A Server serves the requests of
// one provisioned handler (a gate.Gate).
package surface

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/compat"
	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/metrics"
)

// Server serves requests through one provisioned handler.
type Server struct {
	*config.Handler

	ctx    caddy.Context
	logger *zap.Logger
	events *caddyevents.App
	// gate is the provisioned handler: its policies and store.
	gate *gate.Gate
	// lastStoreWarning (unix nanos) throttles store failure logs.
	lastStoreWarning atomic.Int64
	policies         []*policyRuntime
	// zones: some policy is charged as a caddy-ratelimit zone (no
	// all_or_nothing), see compat.ChargeZones.
	zones      bool
	headerMode config.HeaderMode
	// tenant and tier are the Tenant and Tier templates, compiled.
	tenant, tier template
	// clientIP is config.DefaultKey compiled: the tenant of a request
	// no policy matches (protect) when the handler sets no tenant, as a
	// policy's default key makes the client IP the tenant.
	clientIP template
	// metrics and compat are nil when metrics are disabled.
	metrics *metrics.Handler
	compat  *compat.Metrics
	// drains bounds the metered responses read after their client left.
	drains *drainer
	// penalties: some policy has a penalty box (see limiter.Penalty);
	// without one, decisions look nothing up.
	penalties bool
	// notifies: some policy sends webhooks (notify).
	notifies bool
	// protection is the protect block's limiter; nil without one.
	protection *protection
	// stopBoxes stops announcing penalty boxes (WatchBoxes); nil when
	// not announcing.
	stopBoxes func()
}

var _ gate.Signals = (*Server)(nil)

// New builds the server of g, whose configuration cfg is validated: it
// compiles the policies' matchers and templates and renders their
// headers, resolves their metric children (unless disable_metrics) and
// finds the events app. Close it when the handler goes.
func New(ctx caddy.Context, cfg *config.Handler, g *gate.Gate) (*Server, error) {
	h := &Server{Handler: cfg, ctx: ctx, logger: ctx.Logger(), gate: g}
	h.tenant, h.tier, h.clientIP = compileTemplate(cfg.Tenant), compileTemplate(cfg.Tier), compileTemplate(config.DefaultKey)
	var err error
	if h.headerMode, err = config.ParseHeaderMode(cfg.Headers); err != nil {
		return nil, err
	}
	if err := h.provisionPolicies(ctx); err != nil {
		return nil, err
	}
	if err := h.provisionMetrics(ctx); err != nil {
		return nil, err
	}
	h.drains = newDrainer(cfg, h.metrics)
	h.provisionProtect()
	// Events go to the events app when one is configured, which every
	// subscription does; without it nobody could receive them.
	if events, err := ctx.AppIfConfigured("events"); err == nil {
		h.events = events.(*caddyevents.App)
	} else if !errors.Is(err, caddy.ErrNotConfigured) {
		h.Close()
		return nil, fmt.Errorf("getting events app: %v", err)
	}
	return h, nil
}

// Close lets go of what the server holds (its tenant series, its place
// among the watchers of penalty boxes).
func (h *Server) Close() {
	if h.stopBoxes != nil {
		h.stopBoxes()
	}
	h.closeProtect()
	h.cleanupMetrics()
}
