// Package gate is what a provisioned rate_limit handler is, below the
// Caddy module: its policies, the store it decides with (the embedded
// store or a Redis stack, behind one interface) and the registry of live
// handlers the admin API reads. The HTTP surface (package surface), the
// admin API (package admin) and caddy-ratelimit compatibility (package
// compat) work on a Gate; the module (the root package) builds one in
// Provision and lets it go in Cleanup.
package gate

import (
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
