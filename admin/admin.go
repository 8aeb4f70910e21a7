package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/limiter"
	"github.com/tollgate/caddy-tollgate/report"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI is the admin.api.rate_limit module: routes under /rate_limit/
// on Caddy's admin endpoint to inspect and operate the rate limits of the
// running config.
type adminAPI struct{}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.rate_limit",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Routes implements caddy.AdminRouter.
func (a adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/rate_limit/status", Handler: locked(a.status)},
		{Pattern: "/rate_limit/policies", Handler: locked(a.policies)},
		{Pattern: "/rate_limit/usage", Handler: locked(a.usage)},
		{Pattern: "/rate_limit/reset", Handler: locked(a.reset)},
		{Pattern: "/rate_limit/overrides", Handler: locked(a.overrides)},
		{Pattern: "/rate_limit/denials", Handler: locked(a.denials)},
		{Pattern: "/rate_limit/near_limit", Handler: locked(a.nearLimit)},
		{Pattern: "/rate_limit/penalties", Handler: locked(a.penalties)},
		{Pattern: "/rate_limit/top", Handler: locked(a.top)},
		{Pattern: "/rate_limit/protect", Handler: locked(a.protect)},
		{Pattern: "/rate_limit/", Handler: caddy.AdminHandlerFunc(a.notFound)},
	}
}

// locked runs f while the handler registry is read-locked: a handler
// being cleaned up (which unregisters it first) waits for the admin
// requests that may use it.
func locked(f caddy.AdminHandlerFunc) caddy.AdminHandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		gate.RLock()
		defer gate.RUnlock()
		return f(w, r)
	}
}

var _ caddy.AdminRouter = adminAPI{}

func apiError(code int, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return caddy.APIError{HTTPStatus: code, Err: err, Message: err.Error()}
}

func requireMethod(r *http.Request, methods ...string) error {
	for _, m := range methods {
		if r.Method == m {
			return nil
		}
	}
	return apiError(http.StatusMethodNotAllowed, "method %s not allowed; use %v", r.Method, methods)
}

// countParam reads the count query parameter: def when absent, else an
// integer from 1 to most (a 400 otherwise).
func countParam(r *http.Request, def, most int) (int, error) {
	c := r.URL.Query().Get("count")
	if c == "" {
		return def, nil
	}
	n, err := strconv.Atoi(c)
	if err != nil || n < 1 || n > most {
		return 0, apiError(http.StatusBadRequest, "count: %q is not an integer from 1 to %d", c, most)
	}
	return n, nil
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (adminAPI) notFound(w http.ResponseWriter, r *http.Request) error {
	return apiError(http.StatusNotFound, "no such rate_limit route: %s", r.URL.Path)
}

func storeKind(h *gate.Gate) string { return h.Store.Status().Kind }

// storeHealthy is the healthy field of a handler's status: the store is
// not known to fail. Only a Redis store can fail, and the breaker is what
// knows: it opens after breaker_failures failed calls in a row (one failed
// call among successes is noise, and the fail modes act on the breaker
// too), and closes once a probe succeeds.
func storeHealthy(st gate.Status) bool { return !st.BreakerOpen }

type policyStatus struct {
	Name      string `json:"name"`
	Algorithm string `json:"algorithm"`
	Limit     int64  `json:"limit"`
	Window    string `json:"window,omitempty"`
	Calendar  string `json:"calendar,omitempty"`
	Burst     int64  `json:"burst,omitempty"`
	// Delay is the policy's longest wait for a turn, e.g. "2s".
	Delay    string `json:"delay,omitempty"`
	Shadow   bool   `json:"shadow,omitempty"`
	FailMode string `json:"fail_mode"`
	// Lease is set when the policy leases (Redis store only).
	Lease *leaseStatus `json:"lease,omitempty"`
}

// leaseStatus is a policy's lease settings and this handler's lease
// activity: units held now, and units acquired, spent, returned and
// expired since the handler started.
type leaseStatus struct {
	MaxTokens int64  `json:"max_tokens"`
	TTL       string `json:"ttl"`
	limiter.LeaseStats
}

type handlerStatus struct {
	Store string `json:"store"`
	// Healthy: the store answers this instance's calls, as far as this
	// instance knows without asking it again. The embedded store always
	// does. A Redis store is not healthy while its circuit breaker is
	// open: breaker_failures calls in a row failed, and no probe has
	// succeeded since (the breaker probes Redis in the background every
	// breaker_cooldown, so this turns true within a cooldown of Redis
	// answering, even with no traffic). Reading it costs no Redis call.
	Healthy     bool           `json:"healthy"`
	KeyPrefix   string         `json:"key_prefix,omitempty"`
	BreakerOpen bool           `json:"breaker_open"`
	Instances   int            `json:"live_instances"`
	Policies    []policyStatus `json:"policies"`
}

func (adminAPI) status(w http.ResponseWriter, r *http.Request) error {
	if err := requireMethod(r, http.MethodGet); err != nil {
		return err
	}
	out := struct {
		Handlers []handlerStatus `json:"handlers"`
	}{Handlers: []handlerStatus{}}
	for _, h := range gate.Gates() {
		hs := handlerStatus{Store: storeKind(h), Policies: []policyStatus{}}
		st := h.Store.Status()
		leaseStats := st.Leases
		hs.KeyPrefix, hs.BreakerOpen, hs.Instances = st.KeyPrefix, st.BreakerOpen, st.Instances
		hs.Healthy = storeHealthy(st)
		for _, p := range h.Policies {
			ps := policyStatus{
				Name:      p.Engine.Name,
				Algorithm: p.Engine.Algorithm.String(),
				Limit:     p.Engine.Limit.Limit,
				Burst:     p.Engine.Limit.Burst,
				Shadow:    p.Engine.Limit.Shadow,
				FailMode:  p.Engine.FailMode.String(),
			}
			if d := p.Engine.Limit.Delay; d > 0 {
				ps.Delay = d.String()
			}
			if ps.Calendar = report.CalendarText(p.Engine.Limit.Rate); ps.Calendar == "" && p.Engine.Limit.Window > 0 {
				ps.Window = p.Engine.Limit.Window.String()
			}
			if l := p.Engine.Lease; l.Enabled() && leaseStats != nil {
				// A tier or override with its own window may lease for
				// another ttl; this is the policy's own.
				ttl := l.TTLFor(p.Engine.Limit.Window)
				ps.Lease = &leaseStatus{MaxTokens: l.Max, TTL: ttl.String(), LeaseStats: leaseStats[p.Engine.Name]}
			}
			hs.Policies = append(hs.Policies, ps)
		}
		out.Handlers = append(out.Handlers, hs)
	}
	return writeJSON(w, out)
}

// tenantQuery reads tenant (required), tier and policy.
func tenantQuery(r *http.Request) (tenant, tier, policy string, err error) {
	q := r.URL.Query()
	tenant = q.Get("tenant")
	if tenant == "" {
		return "", "", "", apiError(http.StatusBadRequest, "missing query parameter: tenant")
	}
	return tenant, q.Get("tier"), q.Get("policy"), nil
}

// tierOf is the tier of tenant as tenant_tiers says, else the tier given.
func tierOf(h *gate.Gate, tenant, given string) (string, string) {
	if t, ok := h.Config.TenantTiers[tenant]; ok {
		return t, "tenant_tiers"
	}
	if given != "" {
		return given, "query"
	}
	return "", ""
}

// selectPolicies returns the (handler, policy) pairs named policy (all
// when empty); 400 when a name matches nothing.
func selectPolicies(policy string) ([]*gate.Gate, [][]*gate.Policy, error) {
	var hs []*gate.Gate
	var ps [][]*gate.Policy
	found := false
	for _, h := range gate.Gates() {
		var sel []*gate.Policy
		for _, p := range h.Policies {
			if policy == "" || p.Engine.Name == policy {
				sel = append(sel, p)
				found = true
			}
		}
		hs, ps = append(hs, h), append(ps, sel)
	}
	if policy != "" && !found {
		return nil, nil, unknownPolicy(policy)
	}
	return hs, ps, nil
}

type tenantReport struct {
	Tenant     string          `json:"tenant"`
	Tier       string          `json:"tier,omitempty"`
	TierSource string          `json:"tier_source,omitempty"`
	Note       string          `json:"note,omitempty"`
	Policies   []report.Policy `json:"policies"`
}

const tierNote = "a tier from the tier placeholder needs a request; pass &tier=<name> to see that tier's limits"

func (adminAPI) policies(w http.ResponseWriter, r *http.Request) error {
	return tenantRoute(w, r, false)
}

func (adminAPI) usage(w http.ResponseWriter, r *http.Request) error {
	return tenantRoute(w, r, true)
}

func tenantRoute(w http.ResponseWriter, r *http.Request, usage bool) error {
	if err := requireMethod(r, http.MethodGet); err != nil {
		return err
	}
	tenant, givenTier, policy, err := tenantQuery(r)
	if err != nil {
		return err
	}
	hs, ps, err := selectPolicies(policy)
	if err != nil {
		return err
	}
	part := r.URL.Query().Get("key")
	// History, when a range or resolution is asked for (usage only).
	q := r.URL.Query()
	withHistory := usage && (q.Has("range") || q.Has("resolution"))
	rep := tenantReport{Tenant: tenant, Policies: []report.Policy{}}
	for i, h := range hs {
		tier, tierSrc := tierOf(h, tenant, givenTier)
		if tier != "" {
			rep.Tier, rep.TierSource = tier, tierSrc
		} else if h.Config.Tier != "" {
			rep.Note = tierNote
		}
		for _, p := range ps[i] {
			e, l := report.Of(h, p, tenant, tier)
			if usage {
				if err := report.Peek(r.Context(), h, p, tenant, part, l, &e); err != nil {
					return apiError(http.StatusServiceUnavailable, "reading usage of policy %s: %v", p.Engine.Name, err)
				}
				if withHistory {
					if e.History, err = history(r, h, p, tenant); err != nil {
						return err
					}
				}
			}
			rep.Policies = append(rep.Policies, e)
		}
	}
	return writeJSON(w, rep)
}

func (adminAPI) reset(w http.ResponseWriter, r *http.Request) error {
	if err := requireMethod(r, http.MethodPost); err != nil {
		return err
	}
	tenant, _, policy, err := tenantQuery(r)
	if err != nil {
		return err
	}
	hs, ps, err := selectPolicies(policy)
	if err != nil {
		return err
	}
	// Each store once, with the policies of every handler on it: a store
	// is told which policies to clear (it never scans for them), and
	// resets them once for every handler (every handler's leases are
	// dropped).
	var stores []gate.Store
	names := map[any][]string{}
	for i, h := range hs {
		for _, p := range ps[i] {
			scope := h.Store.Scope()
			if _, ok := names[scope]; !ok {
				stores = append(stores, h.Store)
			}
			if !slices.Contains(names[scope], p.Engine.Name) {
				names[scope] = append(names[scope], p.Engine.Name)
			}
		}
	}
	for _, st := range stores {
		if err := st.Reset(r.Context(), tenant, names[st.Scope()], r.RemoteAddr); err != nil {
			return apiError(http.StatusServiceUnavailable, "resetting: %v", err)
		}
	}
	return writeJSON(w, map[string]any{"tenant": tenant, "policy": policy, "reset": true})
}

// Limits of GET /rate_limit/denials: entries returned, and entries of the
// stream scanned (newest first) to find them.
const (
	defaultDenials    = 100
	maxDenials        = 1000
	maxDenialsScanned = 20000
)

// denials returns the newest entries of the denial stream(s) for a
// tenant: GET /rate_limit/denials?tenant=T&count=N.
func (adminAPI) denials(w http.ResponseWriter, r *http.Request) error {
	if err := requireMethod(r, http.MethodGet); err != nil {
		return err
	}
	tenant := r.URL.Query().Get("tenant")
	if tenant == "" {
		return apiError(http.StatusBadRequest, "tenant: required, e.g. ?tenant=acme")
	}
	count, err := countParam(r, defaultDenials, maxDenials)
	if err != nil {
		return err
	}
	// Entries store the tenant cut as in logs, with its digest when cut.
	want, id := gate.DenialTenant(tenant)
	seen := map[*fleet.DenialStream]bool{}
	out := []map[string]any{}
	for _, h := range gate.Gates() {
		ds := h.Store.Denials()
		if ds == nil || seen[ds] {
			continue
		}
		seen[ds] = true
		entries, err := ds.Recent(r.Context(), want, id, count-len(out), maxDenialsScanned)
		if err != nil {
			return apiError(http.StatusServiceUnavailable, "reading the denial stream: %v", err)
		}
		out = append(out, entries...)
		if len(out) >= count {
			break
		}
	}
	if len(seen) == 0 {
		return apiError(http.StatusNotFound, "denials: no handler uses a redis block with denials_stream, so there is no denial stream")
	}
	return writeJSON(w, map[string]any{"tenant": tenant, "denials": out})
}

// unknownPolicy is the 400 of a policy name no live handler defines; it
// lists the names that exist.
func unknownPolicy(name string) error {
	var names []string
	for _, h := range gate.Gates() {
		for _, p := range h.Policies {
			names = append(names, p.Engine.Name)
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	return apiError(http.StatusBadRequest, "unknown policy %q (policies: %s)", name, strings.Join(names, ", "))
}

// overrideTargets returns the distinct override stores of handlers that
// have policy (any policy when empty), and the policy itself for
// validation.
func overrideTargets(policy string) ([]gate.Overrides, []*limiter.Policy) {
	seen := map[any]bool{}
	var out []gate.Overrides
	var pols []*limiter.Policy
	for _, h := range gate.Gates() {
		for _, p := range h.Policies {
			if policy != "" && p.Engine.Name != policy {
				continue
			}
			pols = append(pols, p.Engine)
			if seen[h.Store.Scope()] {
				continue
			}
			seen[h.Store.Scope()] = true
			out = append(out, h.Store.Overrides())
		}
	}
	return out, pols
}

func (adminAPI) overrides(w http.ResponseWriter, r *http.Request) error {
	switch r.Method {
	case http.MethodGet:
		q := r.URL.Query()
		targets, _ := overrideTargets("")
		all := []fleet.Override{}
		type key struct{ tenant, policy string }
		seen := map[key]bool{}
		for _, t := range targets {
			for _, o := range t.Table().List(q.Get("tenant")) {
				k := key{o.Tenant, o.Policy}
				if (q.Get("policy") == "" || o.Policy == q.Get("policy")) && !seen[k] {
					seen[k] = true
					all = append(all, o)
				}
			}
		}
		fleet.SortOverrides(all)
		return writeJSON(w, map[string]any{"overrides": all})
	case http.MethodPut, http.MethodPost:
		return putOverride(w, r)
	case http.MethodDelete:
		return deleteOverride(w, r)
	}
	return apiError(http.StatusMethodNotAllowed, "method %s not allowed; use GET, PUT or DELETE", r.Method)
}

// overrideChanged tells the live handlers of policy that an override
// changed (their webhooks' override event).
func overrideChanged(tenant, policy, state string) {
	for _, h := range gate.Gates() {
		if h.Signals != nil && h.HasPolicy(policy) {
			h.Signals.OverrideChanged(tenant, policy, state)
		}
	}
}

// maxAdminBody bounds the JSON body of an admin request.
const maxAdminBody = 64 << 10

// readBody reads a request body of at most maxAdminBody bytes: 413 when it
// is larger, 400 when it cannot be read.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAdminBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, apiError(http.StatusRequestEntityTooLarge, "request body larger than %d bytes", maxAdminBody)
	case err != nil:
		return nil, apiError(http.StatusBadRequest, "reading body: %v", err)
	}
	return body, nil
}

func putOverride(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(w, r)
	if err != nil {
		return err
	}
	o, err := fleet.DecodeOverride(body, time.Now())
	if err != nil {
		return apiError(http.StatusBadRequest, "%v", err)
	}
	if !o.Expires.IsZero() && !o.Expires.After(time.Now()) {
		return apiError(http.StatusBadRequest, "expires is in the past")
	}
	targets, pols := overrideTargets(o.Policy)
	if len(pols) == 0 {
		return unknownPolicy(o.Policy)
	}
	for _, p := range pols {
		if err := checkOverrideCalendar(p, &o); err != nil {
			return err
		}
		if o.WebhookOnly() {
			continue // the tenant's webhook only: its limits stay
		}
		if err := p.ValidateLimit(o.Limit(p)); err != nil {
			return apiError(http.StatusBadRequest, "policy %s: %v", p.Name, err)
		}
	}
	var old fleet.Override
	var had bool
	for _, t := range targets {
		if o2, h2, err := t.Store(r.Context(), o.Tenant, o.Policy, &o, r.RemoteAddr); err != nil {
			return apiError(http.StatusServiceUnavailable, "storing override: %v", err)
		} else if h2 {
			old, had = o2, true
		}
	}
	res := map[string]any{"override": o}
	if had {
		res["previous"] = old
	}
	overrideChanged(o.Tenant, o.Policy, "set")
	return writeJSON(w, res)
}

func deleteOverride(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	tenant, policy := q.Get("tenant"), q.Get("policy")
	if tenant == "" || policy == "" {
		var j struct {
			Tenant string `json:"tenant"`
			Policy string `json:"policy"`
		}
		body, err := readBody(w, r)
		if err != nil {
			return err
		}
		if len(body) > 0 {
			if err := json.Unmarshal(body, &j); err != nil {
				return apiError(http.StatusBadRequest, "malformed JSON: %v", err)
			}
		}
		if tenant == "" {
			tenant = j.Tenant
		}
		if policy == "" {
			policy = j.Policy
		}
	}
	if tenant == "" || policy == "" {
		return apiError(http.StatusBadRequest, "tenant and policy are required")
	}
	targets, pols := overrideTargets(policy)
	if len(pols) == 0 {
		return unknownPolicy(policy)
	}
	found := false
	for _, t := range targets {
		_, had, err := t.Store(r.Context(), tenant, policy, nil, r.RemoteAddr)
		if err != nil {
			return apiError(http.StatusServiceUnavailable, "deleting override: %v", err)
		}
		found = found || had
	}
	if found {
		overrideChanged(tenant, policy, "deleted")
	}
	if !found {
		return apiError(http.StatusNotFound, "no runtime override for tenant %q in policy %q", tenant, policy)
	}
	return writeJSON(w, map[string]any{"deleted": true, "tenant": tenant, "policy": policy})
}
