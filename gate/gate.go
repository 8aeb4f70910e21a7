// Package gate is what a provisioned rate_limit handler is, below the
// Caddy module: its policies, the store it decides with (the embedded
// store or a Redis stack, behind one interface) and the registry of live
// handlers the admin API reads. The HTTP surface (package surface), the
// admin API (package admin) and caddy-ratelimit compatibility (package
// compat) work on a Gate; the module (the root package) builds one in
// Provision and lets it go in Cleanup.
package gate

import (
	"math"
	"math/bits"

	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/limiter"
	"github.com/tollgate/caddy-tollgate/protect"
)

// Gate is one provisioned rate_limit handler.
type Gate struct {
	// Config is the handler's configuration, validated.
	Config *config.Handler
	// Policies are the handler's policies in name order (the order of
	// config.Handler.PolicyNames).
	Policies []*Policy
	// Store decides the handler's requests.
	Store Store
	// Signals hears what the admin API changes, for the handler's
	// webhooks; nil: nobody listens.
	Signals Signals
	// Protection is the handler's adaptive limit (protect); nil without
	// one.
	Protection *protect.Limiter
}

// Signals is told of changes made outside requests.
type Signals interface {
	// OverrideChanged: the runtime override of tenant in policy (engine
	// name) was set or deleted (state "set" or "deleted").
	OverrideChanged(tenant, policy, state string)
}

// Policy is a provisioned policy: the engine's policy and the names and
// settings the Caddy layer reads it by.
type Policy struct {
	// Engine is the policy as the engine knows it (its Name is the
	// internal name of an odd zone name, see config.InternalName).
	Engine *limiter.Policy
	// Name is the policy's name as configured.
	Name string
	// Label and Header are Name as a metric label and inside a header.
	Label, Header string
	// AllOrNothing: charged only when the whole request is admitted (else
	// as a caddy-ratelimit zone, see compat.ChargeZones).
	AllOrNothing bool
	// Near is the policy's near_limit fraction.
	Near float64
}

// NearLimit is the near-limit rule, the one the near_limit metric, the
// near_limit webhook and the usage page all follow: a bucket with
// remaining units left of limit is near its limit at fraction when less
// than (1 - fraction) of the limit is left. It is measured against the
// limit, not a token bucket's or GCRA's burst: with limit 10 and burst
// 20, near_limit 0.8 means fewer than 2 units left, as without a burst.
// Exactly (1 - fraction) of the limit left is not near. A bucket in debt
// (negative remaining) is near at any fraction; fraction 1 means only
// that. fraction is taken to 9 decimal places, and the comparison is
// made in integers: 0.7 of 10 is 7, not 7.000000000000001.
func NearLimit(remaining, limit int64, fraction float64) bool {
	if limit <= 0 || remaining >= limit {
		return false
	}
	// remaining < (1 - f) * limit  <=>  used * 1e9 > f * 1e9 * limit,
	// both products in 128 bits. used = limit - remaining, in [1, 2^64)
	// whatever the int64s: exact in modular uint64 arithmetic.
	const scale = 1_000_000_000
	used := uint64(limit) - uint64(remaining)
	f := uint64(math.Round(min(max(fraction, 0), 1) * scale))
	uh, ul := bits.Mul64(used, scale)
	th, tl := bits.Mul64(f, uint64(limit))
	return uh > th || (uh == th && ul > tl)
}

// NewPolicies pairs the validated engine policies of c (in the order of
// c.PolicyNames) with their configured names and settings.
func NewPolicies(c *config.Handler, engine []*limiter.Policy) []*Policy {
	names := c.PolicyNames()
	out := make([]*Policy, len(engine))
	for i, p := range engine {
		pc := c.RateLimits[names[i]]
		out[i] = &Policy{
			Engine:       p,
			Name:         names[i],
			Label:        config.MetricLabel(names[i]),
			Header:       config.HeaderName(names[i]),
			AllOrNothing: pc.AllOrNothing,
			Near:         c.NearFraction(pc),
		}
	}
	return out
}

// HasPolicy reports whether g has the policy of engine name name ("":
// any).
func (g *Gate) HasPolicy(name string) bool {
	for _, p := range g.Policies {
		if name == "" || p.Engine.Name == name {
			return true
		}
	}
	return false
}
