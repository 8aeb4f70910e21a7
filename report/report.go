// Package report is what one tenant's policies are, as the admin API and
// the tenant's own page (rate_limit_usage) show them: each limit and
// where it comes from, what is left now, and the usage history. One
// place, so the operator and the tenant never see two answers.
package report

import (
	"context"
	"time"

	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// Policy is one policy's limit for a tenant, and (after Peek) its usage.
type Policy struct {
	Policy    string `json:"policy"`
	Algorithm string `json:"algorithm"`
	Limit     int64  `json:"limit,omitempty"`
	Window    string `json:"window,omitempty"`
	// Calendar is the calendar period of a calendar limit ("month
	// America/New_York"), and PeriodStart and PeriodEnd the current one's
	// bounds (RFC 3339, in its zone).
	Calendar    string `json:"calendar,omitempty"`
	PeriodStart string `json:"period_start,omitempty"`
	PeriodEnd   string `json:"period_end,omitempty"`
	Burst       int64  `json:"burst,omitempty"`
	// Delay is the longest wait for a turn of this limit, e.g. "2s".
	Delay     string `json:"delay,omitempty"`
	Unlimited bool   `json:"unlimited,omitempty"`
	Shadow    bool   `json:"shadow,omitempty"`
	FailMode  string `json:"fail_mode"`
	// Source is where the limit comes from: policy, tier, tenant_limit or
	// runtime_override.
	Source string `json:"source"`
	Store  string `json:"store"`
	// Remaining is what is left now, Reset the seconds until the bucket
	// has more (usage only).
	Remaining *int64   `json:"remaining,omitempty"`
	Reset     *float64 `json:"reset,omitempty"`
	// History is the tenant's series of the policy (when asked for).
	History *Series `json:"history,omitempty"`
}

// Resolve returns the limit of tenant in p as a request would see it:
// a runtime override first, then p's own rules.
func Resolve(g *gate.Gate, p *gate.Policy, tenant, tier string) (limiter.Limit, limiter.Source) {
	if l, ok := g.Store.Overrides().Table().Lookup(p.Engine, tenant); ok {
		return l, limiter.SourceRuntimeOverride
	}
	return p.Engine.Resolve(tenant, tier)
}

// Of is p's limit for tenant (of tier), and the limit itself.
func Of(g *gate.Gate, p *gate.Policy, tenant, tier string) (Policy, limiter.Limit) {
	l, src := Resolve(g, p, tenant, tier)
	e := Policy{
		Policy:    p.Engine.Name,
		Algorithm: p.Engine.Algorithm.String(),
		Unlimited: l.Unlimited,
		Shadow:    l.Shadow,
		FailMode:  p.Engine.FailMode.String(),
		Source:    src.String(),
		Store:     g.Store.Status().Kind,
	}
	if !l.Unlimited {
		e.Limit, e.Burst = l.Limit, l.Burst
		if l.Delay > 0 {
			e.Delay = l.Delay.String()
		}
		if l.Calendar != nil {
			e.Calendar, e.PeriodStart, e.PeriodEnd = CalendarPeriod(l.Rate, time.Now())
		} else if l.Window > 0 {
			e.Window = l.Window.String()
		}
	}
	return e, l
}

// Peek fills the remaining budget and reset of e without charging: the
// store is asked with cost 0.
func Peek(ctx context.Context, g *gate.Gate, p *gate.Policy, tenant, part string, l limiter.Limit, e *Policy) error {
	if l.Unlimited {
		return nil
	}
	checks := []limiter.Check{{
		Algorithm: p.Engine.Algorithm,
		Tenant:    tenant,
		Policy:    p.Engine.Name,
		Part:      part,
		Rate:      l.Rate,
		Cost:      0,
		Shadow:    l.Shadow,
	}}
	results := make([]limiter.Result, 1)
	if err := g.Store.Peek(ctx, checks, results); err != nil {
		return err
	}
	rem := results[0].Remaining
	reset := results[0].Reset.Seconds()
	e.Remaining, e.Reset = &rem, &reset
	return nil
}

// CalendarText describes the calendar of r: "month America/New_York", or
// "" when r has none.
func CalendarText(r limiter.Rate) string {
	if r.Calendar == nil {
		return ""
	}
	return r.Calendar.String()
}

// CalendarPeriod describes the calendar of r and its period at now: "month
// America/New_York" and the period's start and end in RFC 3339, in the
// calendar's zone.
func CalendarPeriod(r limiter.Rate, now time.Time) (name, start, end string) {
	start0, end0 := r.Calendar.Period(now.UnixNano())
	loc := r.Calendar.Location()
	return r.Calendar.String(), time.Unix(0, start0).In(loc).Format(time.RFC3339), time.Unix(0, end0).In(loc).Format(time.RFC3339)
}
