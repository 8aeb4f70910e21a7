// Package portal is the tenant's own view of its rate limits: the
// rate_limit_usage handler (module http.handlers.rate_limit_usage),
// which answers, for the tenant of the request and no other, what its
// policies allow and why, what is left now, its usage history and its
// last denials, as JSON or as a page (Accept: text/html).
package portal

import (
	"net/http"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

func init() {
	caddy.RegisterModule(Handler{})
	httpcaddyfile.RegisterHandlerDirective("rate_limit_usage", parseCaddyfile)
	// An answering handler, with respond: after the authentication
	// handlers (so the tenant it reads is the authenticated one) and
	// after rate_limit.
	httpcaddyfile.RegisterDirectiveOrder("rate_limit_usage", httpcaddyfile.Before, "respond")
}

// Handler answers a tenant's questions about its own limits: "why did I
// get a 429?". Put it behind the same authentication as the API it
// describes: it answers for the tenant the request resolves to, with the
// rate_limit handlers' own tenant template (or Tenant), and no query
// parameter can name another tenant. A request without a tenant gets 401.
//
// JSON by default; a page for browsers (Accept: text/html), which shows
// the current numbers without JavaScript.
type Handler struct {
	// The tenant template, e.g. {http.auth.user.id}. Default: each
	// rate_limit handler's own tenant template (handlers without one are
	// not shown).
	Tenant string `json:"tenant,omitempty"`

	// The policies shown, by name. Default: every policy of the config's
	// rate_limit handlers that have a tenant (or of all of them, with
	// Tenant set).
	Policies []string `json:"policies,omitempty"`

	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit_usage",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision implements caddy.Provisioner.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	return nil
}

// Validate implements caddy.Validator.
func (h *Handler) Validate() error {
	for i, p := range h.Policies {
		if p == "" {
			return errorf("policies.%d: empty policy name", i)
		}
	}
	return nil
}

// parseCaddyfile reads
//
//	rate_limit_usage {
//		tenant <template>
//		policies <name>...
//	}
func parseCaddyfile(helper httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	h := new(Handler)
	return h, h.UnmarshalCaddyfile(helper.Dispenser)
}

// UnmarshalCaddyfile implements caddyfile.Unmarshaler.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "tenant":
			if !d.NextArg() {
				return d.Errf("tenant: want a template, e.g. tenant {http.auth.user.id}")
			}
			h.Tenant = d.Val()
			if d.NextArg() {
				return d.Errf("tenant: one template only")
			}
		case "policies":
			h.Policies = append(h.Policies, d.RemainingArgs()...)
			if len(h.Policies) == 0 {
				return d.Errf("policies: want one or more policy names")
			}
		default:
			return d.Errf("unknown subdirective %q (allowed: tenant, policies)", d.Val())
		}
	}
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler: it answers, and never
// calls next.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return writeError(w, r, http.StatusMethodNotAllowed, "use GET")
	}
	if r.URL.Query().Has("tenant") {
		return writeError(w, r, http.StatusBadRequest, "tenant: not a parameter; this page is about the tenant your request is authenticated as")
	}
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	v, status, err := h.build(r, repl)
	if err != nil {
		return writeError(w, r, status, err.Error())
	}
	w.Header().Set("Cache-Control", "private, max-age=5")
	w.Header().Add("Vary", "Accept, Authorization, Cookie")
	if wantsHTML(r) {
		return writePage(w, r, v)
	}
	return writeJSON(w, r, http.StatusOK, v)
}

// wantsHTML reports whether the client prefers a page to JSON: its
// Accept names text/html before (or without) application/json.
func wantsHTML(r *http.Request) bool {
	accept := r.Header.Get("Accept")
	i := strings.Index(accept, "text/html")
	if i < 0 {
		return false
	}
	j := strings.Index(accept, "application/json")
	return j < 0 || i < j
}

// wanted reports whether policy name is shown.
func (h *Handler) wanted(name string) bool {
	return len(h.Policies) == 0 || slices.Contains(h.Policies, name)
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
