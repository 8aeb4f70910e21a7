package surface

import (
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// Signals out (notify): the events of a decision (a tenant past a
// near_limit threshold, a denial), of the store (a penalty box made), of
// the instance (its fail mode) and of the admin API (an override), sent
// as webhooks by the store's fleet.Notifier. Deciding whether a decision
// has an event costs arithmetic and, for an event, one lookup in the
// notifier's in-process table of events already sent this period: a
// tenant near its limit on every request builds its event once per period
// and instance.

// notifyRuntime is a policy's notify settings, resolved.
type notifyRuntime struct {
	cfg *config.NotifyConfig
	dst fleet.Destination
	// near are the near_limit thresholds, ascending.
	near []float64
}

// compileNotify resolves the notify block c (a policy's, else the
// handler's) of the policy whose near_limit is near: its secret's
// placeholders ({env.*}) are replaced now.
func compileNotify(c *config.NotifyConfig, near float64) (*notifyRuntime, error) {
	if c == nil {
		return nil, nil
	}
	secret := caddy.NewReplacer().ReplaceAll(c.Secret, "")
	if secret == "" {
		return nil, errNotifySecret
	}
	n := &notifyRuntime{cfg: c, dst: fleet.Destination{URL: c.URL, Secret: secret, AllowPrivate: c.AllowPrivate},
		near: slices.Sorted(slices.Values(c.NearLimit))}
	if len(n.near) == 0 {
		n.near = []float64{near}
	}
	return n, nil
}

var errNotifySecret = errors.New("notify: secret resolves to an empty value (is its environment variable set?)")

// signal sends the events of a decided request.
func (h *Server) signal(st *requestState) {
	n := h.gate.Store.Notifier()
	if n == nil {
		return
	}
	d := &st.decision
	now := time.Now()
	for i := range d.Verdicts {
		v := &d.Verdicts[i]
		p := st.policies[i]
		if p.notify == nil || !v.Counted() || v.Limit.Shadow {
			continue
		}
		it := &st.items[i]
		switch {
		case !v.Result.Allowed && v.Path == limiter.PathStore:
			if p.notify.cfg.Sends("exceeded") {
				start, end := period(v.Limit.Rate, now)
				h.notifyOnce(n, p, it, v, "exceeded", 0, now, start, end)
			}
		case d.Admitted && p.notify.cfg.Sends("near_limit"):
			// Thresholds ascending: past the first not crossed, none is.
			for _, t := range p.notify.near {
				if !nearLimit(v, it, t) {
					break
				}
				start, end := period(v.Limit.Rate, now)
				h.notifyOnce(n, p, it, v, "near_limit", t, now, start, end)
			}
		}
	}
}

// notifyOnce sends event for the item once per period [start, end),
// fleet-wide: the notifier's table first (no I/O), then its marker.
func (h *Server) notifyOnce(n *fleet.Notifier, p *policyRuntime, it *limiter.Item, v *limiter.Verdict, event string, threshold float64, now, start, end time.Time) {
	key := onceKey(it, event, threshold, start)
	if !n.Once(key, end) {
		return
	}
	rem := v.Result.Remaining
	ev := fleet.Event{
		Type: event, Tenant: h.eventTenant(it), Policy: p.Name, Threshold: threshold,
		Limit: v.Limit.Limit, Remaining: &rem, Used: max(v.Limit.Capacity()-rem, 0),
		PeriodStart: start.UTC().Format(time.RFC3339), PeriodEnd: end.UTC().Format(time.RFC3339),
	}
	if v.Result.Reset > 0 {
		ev.Reset = now.Add(v.Result.Reset).UTC().Format(time.RFC3339)
	}
	n.Send(h.destinationOf(p, it.Tenant), ev, key, end)
}

// WatchBoxes has the penalty boxes the store makes for the handler's
// policies announced (penalty events), when some policy sends them. Call
// it once the store is open; Close stops it.
//
// A box is announced when it starts, by the instance that made it (the
// store tells each box once, fleet-wide: see limiter.BoxWatchers), not at
// the first request it refuses: a tenant that stops when boxed is
// announced too, and no request path pays for it.
func (h *Server) WatchBoxes() {
	for _, p := range h.policies {
		if p.Engine.Penalty.On() && p.notify != nil && p.notify.cfg.Sends("penalty") {
			if w, ok := h.gate.Store.Penalties().(limiter.BoxWatcher); ok {
				h.stopBoxes = w.WatchBoxes(h.boxMade)
			}
			return
		}
	}
}

// boxMade sends the penalty event of box b, a box the store just made,
// when it is of one of h's policies that sends penalty events; it reports
// whether h took it (the handlers sharing the store, newest first, are
// asked until one does). A shadow box refuses nothing: it is taken, and
// not announced. The event's period is the box.
func (h *Server) boxMade(b limiter.Box) bool {
	n := h.gate.Store.Notifier()
	if n == nil {
		return false
	}
	for _, p := range h.policies {
		if p.Engine.Name != b.Policy || p.notify == nil || !p.notify.cfg.Sends("penalty") {
			continue
		}
		if b.Limit.Shadow {
			return true
		}
		end := time.Unix(0, b.Until)
		zero := int64(0)
		ev := fleet.Event{
			Type: "penalty", Tenant: b.Tenant, Policy: p.Name, Limit: b.Limit.Limit, Remaining: &zero,
			Reset:       end.UTC().Format(time.RFC3339),
			PeriodStart: end.Add(-p.Engine.Penalty.Duration).UTC().Format(time.RFC3339),
			PeriodEnd:   end.UTC().Format(time.RFC3339),
		}
		n.Send(h.destinationOf(p, b.Tenant), ev, "", end)
		return true
	}
	return false
}

// eventTenant is the tenant as events name it: bounded like in logs.
func (h *Server) eventTenant(it *limiter.Item) string {
	return limiter.BoundedValue(it.Tenant)
}

// destinationOf is where p's events of tenant go: the tenant's own URL,
// from a runtime override (notify_url), else the policy's. A tenant's URL
// reaches a private address only with allow_private_tenants:
// allow_private vouches for the operator's receiver, not for a URL the
// tenant chose.
func (h *Server) destinationOf(p *policyRuntime, tenant string) fleet.Destination {
	dst := p.notify.dst
	if u := h.gate.Store.Overrides().Table().NotifyURL(p.Engine, tenant); u != "" {
		dst.URL, dst.AllowPrivate = u, p.notify.cfg.AllowPrivateTenants
	}
	return dst
}

// onceKey names an event in its period, for the notifier's table and
// the fleet's marker: the tenant's hash tag (escaped, bounded), policy,
// event, threshold and period start. Not the partition key: an event is
// the tenant's, so a policy with a key inside the tenant sends it once
// however many of the tenant's keys cross it.
func onceKey(it *limiter.Item, event string, threshold float64, start time.Time) string {
	b := make([]byte, 0, 96)
	b = append(b, '{')
	b = limiter.AppendTenantTag(b, it.Tenant)
	b = append(b, "}:"...)
	b = append(b, it.Policy.Name...)
	b = append(b, ':')
	b = append(b, event...)
	if threshold > 0 {
		b = append(b, ':')
		b = strconv.AppendFloat(b, threshold, 'g', -1, 64)
	}
	b = append(b, ':')
	b = strconv.AppendInt(b, start.UnixMilli(), 10)
	return string(b)
}

// period is the period of rate r at now an event fires once in: the
// calendar period, else the window aligned to the Unix epoch.
func period(r limiter.Rate, now time.Time) (start, end time.Time) {
	if r.Calendar != nil {
		s, e := r.Calendar.Period(now.UnixNano())
		return time.Unix(0, s), time.Unix(0, e)
	}
	w := max(r.Window, time.Second)
	start = now.Truncate(w)
	return start, start.Add(w)
}

// BreakerChanged sends fail_mode events: the instance's Redis circuit
// breaker opened (its policies decide by their fail modes) or closed.
func (h *Server) BreakerChanged(open bool) {
	n := h.gate.Store.Notifier()
	if n == nil {
		return
	}
	state := "closed"
	if open {
		state = "open"
	}
	for _, dst := range h.destinations("fail_mode") {
		n.Send(dst, fleet.Event{Type: "fail_mode", State: state}, "", time.Time{})
	}
}

// OverrideChanged sends override events: the admin API set (or deleted)
// a runtime override of tenant in policy (engine name).
func (h *Server) OverrideChanged(tenant, policy, state string) {
	n := h.gate.Store.Notifier()
	if n == nil {
		return
	}
	for _, p := range h.policies {
		if p.Engine.Name == policy && p.notify != nil && p.notify.cfg.Sends("override") {
			n.Send(p.notify.dst, fleet.Event{Type: "override", Tenant: limiter.BoundedValue(tenant), Policy: p.Name, State: state}, "", time.Time{})
		}
	}
}

// destinations are the distinct destinations of the handler's policies
// that send event.
func (h *Server) destinations(event string) []fleet.Destination {
	var out []fleet.Destination
	for _, p := range h.policies {
		if p.notify != nil && p.notify.cfg.Sends(event) && !slices.Contains(out, p.notify.dst) {
			out = append(out, p.notify.dst)
		}
	}
	return out
}
