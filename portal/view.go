package portal

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/limiter"
	"github.com/tollgate/caddy-tollgate/report"
)

// View is the answer: one tenant's policies, their usage and its last
// denials. Its JSON field names are stable (docs/self-service.md).
type View struct {
	// Tenant is the tenant the request resolved to (cut to 128 bytes).
	Tenant string `json:"tenant"`
	// GeneratedAt is when the answer was made (RFC 3339).
	GeneratedAt string `json:"generated_at"`
	// Policies are the policies that can apply to the tenant.
	Policies []Policy `json:"policies"`
	// Denials are the tenant's last denials, newest first;
	// DenialsKept is false when no handler keeps them (they need Redis
	// and denials_stream), so Denials is always empty.
	Denials     []Denial `json:"denials"`
	DenialsKept bool     `json:"denials_kept"`
}

// Policy is one policy as the tenant sees it: report.Policy (its limit,
// where it comes from, what is left, the history asked for) and what it
// means.
type Policy struct {
	report.Policy
	// Why says where the limit comes from, in words.
	Why string `json:"why"`
	// Tier is the tenant's tier, when it has one.
	Tier string `json:"tier,omitempty"`
	// Capacity is the most the bucket holds (burst, else limit).
	Capacity int64 `json:"capacity,omitempty"`
	// NearLimit is true when less than (1 - near_limit) of the limit (not
	// the burst) is left, the rule of the near_limit metric and webhook
	// (gate.NearLimit); NearFraction is that threshold.
	NearLimit    bool    `json:"near_limit"`
	NearFraction float64 `json:"near_fraction"`
	// ResetAt is when the bucket has more (RFC 3339).
	ResetAt string `json:"reset_at,omitempty"`
}

// Denial is one of the tenant's denials.
type Denial struct {
	At         string `json:"at"`
	Policy     string `json:"policy"`
	Limit      int64  `json:"limit"`
	RetryAfter int64  `json:"retry_after"`
	// Reason is "penalty" when a penalty box refused the request.
	Reason string `json:"reason,omitempty"`
}

// maxDenials is how many denials the view lists, and maxDenialsScanned
// how many stream entries it reads to find them: two round trips of
// XREVRANGE, about 200 KB from Redis, since any tenant may load its page
// as often as it likes (the operator's /rate_limit/denials reads 20 000).
const (
	maxDenials        = 10
	maxDenialsScanned = 2000
)

// errNoTenant is the 401 of a request that resolves to no tenant.
var errNoTenant = errors.New("no tenant: this request is not authenticated as a tenant of any rate limit")

// errManyTenants is the 409 of a request that the rate limits' tenant
// templates resolve to different tenants, on a page without a tenant of
// its own.
var errManyTenants = errors.New("this request resolves to different tenants in different rate limits: set tenant on rate_limit_usage to say which is the caller's")

// build makes the view of r's tenant: the policies of the live
// rate_limit handlers (the newest handler of each policy name: during a
// reload the old config's are still registered).
func (h *Handler) build(r *http.Request, repl *caddy.Replacer) (*View, int, error) {
	gate.RLock()
	defer gate.RUnlock()
	q := r.URL.Query()
	only := q.Get("policy")
	ctx := r.Context()
	now := time.Now()
	v := &View{GeneratedAt: now.UTC().Format(time.RFC3339), Policies: []Policy{}, Denials: []Denial{}}
	// sent is the tenant the request resolved to, tenant the engine's
	// (limiter.TenantOf: a literal "_anonymous" is not the anonymous
	// tenant, which has no view of its own).
	sent, tenant := "", ""
	seen := map[string]bool{}
	shownPolicies := map[string]bool{}
	var streams []*gate.Gate
	gates := gate.Gates()
	for i := len(gates) - 1; i >= 0; i-- {
		g := gates[i]
		tmpl := h.Tenant
		if tmpl == "" {
			tmpl = g.Config.Tenant
		}
		if tmpl == "" {
			continue
		}
		t := repl.ReplaceAll(tmpl, "")
		if t == "" {
			continue
		}
		if sent != "" && t != sent {
			// Without a tenant of its own, the page takes the caller's
			// tenant from the handlers' templates; two that resolve this
			// request to different tenants leave it unsaid which is the
			// caller's (a header one of them reads may be the client's
			// to set), so neither is shown.
			return nil, http.StatusConflict, errManyTenants
		}
		sent, tenant = t, limiter.TenantOf(t)
		shown := false
		for _, p := range g.Policies {
			if !h.wanted(p.Name) || seen[p.Engine.Name] || (only != "" && only != p.Name) {
				continue
			}
			seen[p.Engine.Name] = true
			pv, status, err := policyView(ctx, r, repl, g, p, tenant, now)
			if err != nil {
				return nil, status, err
			}
			v.Policies = append(v.Policies, pv)
			shownPolicies[p.Name] = true
			shown = true
		}
		if shown {
			streams = append(streams, g)
		}
	}
	if sent == "" {
		return nil, http.StatusUnauthorized, errNoTenant
	}
	if only != "" && len(v.Policies) == 0 {
		return nil, http.StatusNotFound, fmt.Errorf("policy %q: no such policy applies to you", only)
	}
	v.Tenant = gate.Loggable(sent)
	v.Denials, v.DenialsKept = denials(ctx, streams, tenant, shownPolicies)
	return v, http.StatusOK, nil
}

// policyView is p as tenant sees it, with the history the query asks for
// (the last hour by minute by default).
func policyView(ctx context.Context, r *http.Request, repl *caddy.Replacer, g *gate.Gate, p *gate.Policy, tenant string, now time.Time) (Policy, int, error) {
	tier := tierOf(g, tenant, repl)
	e, l := report.Of(g, p, tenant, tier)
	pv := Policy{Policy: e, Why: why(e.Source, tier, l), NearFraction: p.Near}
	if e.Source == limiter.SourceTier.String() {
		pv.Tier = tier
	}
	if l.Unlimited {
		return pv, 0, nil
	}
	pv.Capacity = l.Capacity()
	if err := report.Peek(ctx, g, p, tenant, "", l, &pv.Policy); err != nil {
		return pv, http.StatusServiceUnavailable, fmt.Errorf("reading your usage of %s failed; try again", p.Name)
	}
	pv.Policy.Policy = p.Name
	if pv.Remaining != nil {
		pv.NearLimit = gate.NearLimit(*pv.Remaining, l.Limit, p.Near)
	}
	if pv.Reset != nil && *pv.Reset > 0 {
		pv.ResetAt = now.Add(time.Duration(*pv.Reset * float64(time.Second))).UTC().Format(time.RFC3339)
	}
	if hist := g.Store.History(); hist != nil {
		q := r.URL.Query()
		rng, err := report.ParseRange(hist, q.Get("range"), q.Get("resolution"))
		if err != nil {
			return pv, http.StatusBadRequest, err
		}
		if pv.History, err = report.History(ctx, g, p, tenant, rng, now); err != nil {
			return pv, http.StatusServiceUnavailable, fmt.Errorf("reading your history of %s failed; try again", p.Name)
		}
	}
	return pv, 0, nil
}

// tierOf is the tenant's tier as the rate_limit handler resolves it:
// tenant_tiers, else its tier template.
func tierOf(g *gate.Gate, tenant string, repl *caddy.Replacer) string {
	if t, ok := g.Config.TenantTiers[tenant]; ok {
		return t
	}
	if g.Config.Tier != "" {
		return repl.ReplaceAll(g.Config.Tier, "")
	}
	return ""
}

// why says where a limit comes from.
func why(source, tier string, l limiter.Limit) string {
	s := ""
	switch source {
	case limiter.SourceTier.String():
		s = "the limit of your plan (" + tier + ")"
	case limiter.SourceTenantLimit.String():
		s = "a limit set for you in the configuration"
	case limiter.SourceRuntimeOverride.String():
		s = "a limit set for you by the operator"
	default:
		s = "the default limit"
	}
	switch {
	case l.Unlimited:
		s += ": unlimited"
	case l.Shadow:
		s += ", observed only (not enforced)"
	}
	return s
}

// denials are the tenant's last denials, from the denial streams of the
// handlers shown (each stream once), newest first, of the policies shown.
func denials(ctx context.Context, gs []*gate.Gate, tenant string, shown map[string]bool) ([]Denial, bool) {
	out := []Denial{}
	seen := map[any]bool{}
	if tenant == "" {
		// The tenant of a literal "_anonymous" (limiter.TenantOf), which
		// handlers without a tenant write too, for a key not logged: not
		// this caller's to read.
		return out, false
	}
	field, id := gate.DenialTenant(tenant)
	for _, g := range gs {
		ds := g.Store.Denials()
		if ds == nil || seen[ds] {
			continue
		}
		seen[ds] = true
		entries, err := ds.Recent(ctx, field, id, maxDenials-len(out), maxDenialsScanned)
		if err != nil {
			continue // the rest of the page is still worth showing
		}
		for _, e := range entries {
			if !shown[str(e["policy"])] {
				continue // a policy the page does not show
			}
			d := Denial{Policy: str(e["policy"]), Reason: str(e["reason"])}
			if ms, err := strconv.ParseInt(str(e["ts"]), 10, 64); err == nil {
				d.At = time.UnixMilli(ms).UTC().Format(time.RFC3339)
			}
			d.Limit, _ = strconv.ParseInt(str(e["limit"]), 10, 64)
			d.RetryAfter, _ = strconv.ParseInt(str(e["retry_after"]), 10, 64)
			out = append(out, d)
		}
	}
	return out, len(seen) > 0
}

func str(v any) string {
	s, _ := v.(string)
	return s
}
