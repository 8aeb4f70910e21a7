package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// Handler is a handler's metrics: its policies' label children, and the
// per-tenant series of its busiest tenants (metrics_tenants).
type Handler struct {
	redis      bool
	policies   []policyMetrics
	tenants    *tenantTracker
	tenantsKey string
	// missingTenant counts the requests refused by missing_tenant deny;
	// nil until DeniesMissingTenant.
	missingTenant prometheus.Counter
}

// MissingTenantPolicy is the policy label under which requests refused by
// missing_tenant deny are counted (decision denied). No policy decided
// them, and a label value cannot be empty, so they are counted under the
// name of the setting that refused them, as shed requests are counted
// under "protect".
const MissingTenantPolicy = "missing_tenant"

// DeniesMissingTenant creates the series of MissingTenantDenied at zero,
// for a handler configured with missing_tenant deny, so that increase()
// sees the first one. Call it before the handler serves.
func (m *Handler) DeniesMissingTenant() {
	m.missingTenant = missingTenantDenials()
}

// MissingTenantDenied counts a request refused by missing_tenant deny.
func (m *Handler) MissingTenantDenied() {
	c := m.missingTenant
	if c == nil {
		c = missingTenantDenials()
	}
	c.Inc()
}

// missingTenantDenials is the series of the requests missing_tenant deny
// refused.
func missingTenantDenials() prometheus.Counter {
	return collectors.requests.WithLabelValues(MissingTenantPolicy, decisionNames[decisionDenied])
}

// PolicyInfo is what NewHandler needs of a policy.
type PolicyInfo struct {
	// Label is the policy's name as a label value.
	Label string
	// Engine is the policy.
	Engine *limiter.Policy
	// Metered: the policy reads a real cost from responses (cost_after).
	Metered bool
}

// NewHandler resolves the label children of a handler's policies, which
// decides on Redis when redis is set; with tenants > 0 the busiest
// tenants get series of their own (see tenantTracker). Close it when the
// handler goes.
func NewHandler(redis bool, tenants int, policies []PolicyInfo) (*Handler, error) {
	m := &Handler{redis: redis, policies: make([]policyMetrics, len(policies))}
	labels := make([]string, len(policies))
	for i, p := range policies {
		m.policies[i].init(i, p.Label, p.Engine, redis)
		if p.Metered {
			// Every reason has a series from the start, so that
			// increase() sees the first one.
			for _, r := range CostMissingReasons {
				collectors.costMissing.WithLabelValues(p.Label, r)
			}
			for _, e := range []string{DrainStarted, DrainCompleted, DrainCutTime, DrainCutBytes, DrainRefused} {
				collectors.drains.WithLabelValues(e)
			}
		}
		labels[i] = p.Label
	}
	if tenants > 0 {
		tt, key, err := loadTenantTracker(tenants, labels)
		if err != nil {
			return nil, err
		}
		m.tenants, m.tenantsKey = tt, key
	}
	return m, nil
}

// Close lets go of the handler's tenant tracker.
func (m *Handler) Close() {
	if m.tenantsKey != "" {
		_, _ = tenantTrackers.Delete(m.tenantsKey)
		m.tenantsKey = ""
	}
}

// Record counts the verdict v of policy i (tenant its tenant; near: it
// left the tenant near its limit; admitted: the request passed) and
// observes the decision's duration in seconds.
func (m *Handler) Record(i int, v *limiter.Verdict, tenant string, near, admitted bool, secs float64) {
	pm := &m.policies[i]
	label := pm.label
	dec, src := classify(v, m.redis)
	pm.record(label, dec, src, secs)
	if v.Result.Wait > 0 && v.Enforced() && admitted {
		pm.observeDelay(label, v.Result.Wait)
	}
	if near {
		pm.near.Inc()
	}
	if m.tenants != nil {
		c, nc := m.tenants.counters(pm.index, tenant, dec, near)
		c.Inc()
		if nc != nil {
			nc.Inc()
		}
	}
}

// Why a metered response gave no cost: the reason label of
// caddy_rate_limit_cost_missing_total.
const (
	CostNoValue       = "no_value"       // the header, trailer or paths were absent or invalid
	CostCompressed    = "compressed"     // a Content-Encoding not read, or a body that could not be decompressed
	CostNotJSON       = "not_json"       // a body of another media type
	CostInvalidNumber = "invalid_number" // the header is not a non-negative integer
	CostClientGone    = "client_gone"    // the client went away and the response could not be drained to its end
)

// CostMissingReasons lists every reason label.
var CostMissingReasons = []string{CostNoValue, CostCompressed, CostNotJSON, CostInvalidNumber, CostClientGone}

// Events of drains_total.
const (
	DrainStarted   = "started"   // a client went away: its metered response is read on
	DrainCompleted = "completed" // the response ended while being drained
	DrainCutTime   = "cut_time"  // read for the longest allowed: the upstream request was cancelled
	DrainCutBytes  = "cut_bytes" // read the most bytes allowed: the upstream request was cancelled
	DrainRefused   = "refused"   // every drain slot was taken: the upstream request was cancelled at once
)

// LLMRequest counts a request body read for a cost_after preset, by
// result: read, usage_requested, too_large, not_json, not_utf8, busy,
// no_body.
func (m *Handler) LLMRequest(result string) {
	collectors.llmRequests.WithLabelValues(result).Inc()
}

// Drain counts a drain event.
func (m *Handler) Drain(event string) {
	collectors.drains.WithLabelValues(event).Inc()
}

// CostMissing counts a metered request of policy i whose response gave no
// valid cost, and why (a short snake_case reason).
func (m *Handler) CostMissing(i int, reason string) {
	collectors.costMissing.WithLabelValues(m.policies[i].label, reason).Inc()
}

// policyMetrics holds a policy's label children, resolved at Provision so
// recording a decision is an atomic add. A nil child is one the policy is
// not expected to produce; it is then resolved when used.
type policyMetrics struct {
	index    int // in the handler's policies, and its tenant tracker's
	label    string
	requests [numDecisions]prometheus.Counter
	duration [numSources]prometheus.Observer
	near     prometheus.Counter
	// delay observes the policy's waits; nil for a policy that never
	// delays (resolved when used, for a runtime override).
	delay prometheus.Observer
}

func (pm *policyMetrics) init(index int, name string, p *limiter.Policy, redis bool) {
	pm.index, pm.label = index, name
	pm.near = collectors.nearLimit.WithLabelValues(name)
	for _, d := range []decisionLabel{decisionAllowed, decisionDenied, decisionShadowDenied} {
		pm.requests[d] = collectors.requests.WithLabelValues(name, decisionNames[d])
	}
	if delays(p) {
		pm.requests[decisionDelayed] = collectors.requests.WithLabelValues(name, decisionNames[decisionDelayed])
		pm.delay = collectors.delay.WithLabelValues(name)
	}
	if !redis {
		pm.duration[sourceMemory] = collectors.duration.WithLabelValues(name, sourceNames[sourceMemory])
		return
	}
	pm.duration[sourceRedis] = collectors.duration.WithLabelValues(name, sourceNames[sourceRedis])
	if p.Lease.Enabled() {
		pm.duration[sourceLease] = collectors.duration.WithLabelValues(name, sourceNames[sourceLease])
		pm.duration[sourceCache] = collectors.duration.WithLabelValues(name, sourceNames[sourceCache])
	}
	switch p.FailMode {
	case limiter.FailOpen:
		pm.requests[decisionFailedOpen] = collectors.requests.WithLabelValues(name, decisionNames[decisionFailedOpen])
	case limiter.FailClosed:
		pm.requests[decisionFailedClosed] = collectors.requests.WithLabelValues(name, decisionNames[decisionFailedClosed])
	default:
		pm.requests[decisionFallbackAllowed] = collectors.requests.WithLabelValues(name, decisionNames[decisionFallbackAllowed])
		pm.requests[decisionFallbackDenied] = collectors.requests.WithLabelValues(name, decisionNames[decisionFallbackDenied])
		pm.duration[sourceFallback] = collectors.duration.WithLabelValues(name, sourceNames[sourceFallback])
	}
}

func (pm *policyMetrics) record(policy string, d decisionLabel, s sourceLabel, secs float64) {
	if c := pm.requests[d]; c != nil {
		c.Inc()
	} else {
		collectors.requests.WithLabelValues(policy, decisionNames[d]).Inc()
	}
	if o := pm.duration[s]; o != nil {
		o.Observe(secs)
	} else {
		collectors.duration.WithLabelValues(policy, sourceNames[s]).Observe(secs)
	}
}

// delays reports whether some tenant of p may wait for a turn (shadow
// limits never make a request wait).
func delays(p *limiter.Policy) bool {
	if p.Limit.Delay > 0 && !p.Limit.Shadow {
		return true
	}
	for _, m := range []map[string]limiter.Limit{p.Tiers, p.TenantLimits} {
		for _, l := range m {
			if l.Delay > 0 && !l.Shadow {
				return true
			}
		}
	}
	return false
}

// observeDelay records the wait of an enforced verdict that waits.
func (pm *policyMetrics) observeDelay(policy string, wait time.Duration) {
	o := pm.delay
	if o == nil {
		o = collectors.delay.WithLabelValues(policy)
	}
	o.Observe(wait.Seconds())
}

// classify maps a counted verdict to its decision and source labels.
func classify(v *limiter.Verdict, redis bool) (decisionLabel, sourceLabel) {
	switch v.Path {
	case limiter.PathFailedOpen:
		return decisionFailedOpen, sourceRedis
	case limiter.PathFailedClosed:
		return decisionFailedClosed, sourceRedis
	case limiter.PathFallback:
		if v.Result.Allowed {
			return decisionFallbackAllowed, sourceFallback
		}
		return decisionFallbackDenied, sourceFallback
	case limiter.PathPenalty:
		// Refused from the in-process penalty table: a cache answer. A
		// shadow box refuses nothing: a would-deny.
		if v.Limit.Shadow {
			return decisionShadowDenied, sourceCache
		}
		return decisionPenalty, sourceCache
	}
	s := sourceMemory
	switch {
	case v.Result.From == limiter.OriginLease:
		s = sourceLease
	case v.Result.From == limiter.OriginDenialCache:
		s = sourceCache
	case redis:
		s = sourceRedis
	}
	switch {
	case v.Result.Allowed && v.Result.Wait > 0 && !v.Limit.Shadow:
		return decisionDelayed, s
	case v.Result.Allowed:
		return decisionAllowed, s
	case v.Limit.Shadow:
		return decisionShadowDenied, s
	}
	return decisionDenied, s
}
