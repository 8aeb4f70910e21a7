// Package metrics holds Tollgate's Prometheus metrics. The collectors are
// created once per process and registered with the metrics registry of
// every config generation (Caddy makes a new registry on each load), so
// values continue across reloads and each family appears once on
// /metrics. Other packages add families of their own (caddy-ratelimit's,
// package compat) with NewCounterVec, NewHistogramVec and Define.
package metrics

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/internal/topk"
	"github.com/tollgate/caddy-tollgate/limiter"
)

const (
	metricsNamespace = "caddy"
	metricsSubsystem = "rate_limit"

	// otherTenant labels the requests of every tenant outside the top n.
	otherTenant = "_other"

	// maxTenantLabel bounds tenant label values, in bytes.
	maxTenantLabel = 64
)

// decision is the decision label of caddy_rate_limit_requests_total.
type decisionLabel uint8

const (
	decisionAllowed decisionLabel = iota
	decisionDenied
	decisionShadowDenied
	decisionFailedOpen
	decisionFailedClosed
	decisionFallbackAllowed
	decisionFallbackDenied
	decisionDelayed
	numDecisions
)

var decisionNames = [numDecisions]string{
	decisionAllowed:         "allowed",
	decisionDenied:          "denied",
	decisionShadowDenied:    "shadow_denied",
	decisionFailedOpen:      "failed_open",
	decisionFailedClosed:    "failed_closed",
	decisionFallbackAllowed: "fallback_allowed",
	decisionFallbackDenied:  "fallback_denied",
	decisionDelayed:         "delayed",
}

// source is the source label of caddy_rate_limit_decision_duration_seconds.
type sourceLabel uint8

const (
	sourceMemory sourceLabel = iota
	sourceRedis
	sourceLease
	sourceCache
	sourceFallback
	numSources
)

var sourceNames = [numSources]string{
	sourceMemory:   "memory",
	sourceRedis:    "redis",
	sourceLease:    "lease",
	sourceCache:    "cache",
	sourceFallback: "fallback",
}

// latencyBuckets spans 10µs (a local decision) to 1s (a Redis call far
// past any sane timeout).
var latencyBuckets = []float64{
	10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6,
	1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1,
}

// Family describes one exported family, for tests and the dashboard
// check: its type and label names.
type Family struct {
	Kind   string
	Labels []string
}

// catalog maps the fully qualified name of every family Tollgate exports
// to its description, and all is every collector in definition order;
// the constructors below fill them.
var (
	catalog = map[string]Family{}
	all     []prometheus.Collector
)

// Catalog returns the families defined so far, by fully qualified name.
func Catalog() map[string]Family { return catalog }

// Collectors returns every collector defined so far.
func Collectors() []prometheus.Collector { return all }

// Define adds c, which exports the family name (caddy_rate_limit_<name>)
// of kind kind with labels, to the catalog and to what Register
// registers.
func Define[C prometheus.Collector](name, kind string, labels []string, c C) C {
	catalog[FQName(name)] = Family{kind, labels}
	all = append(all, c)
	return c
}

// FQName is the fully qualified name of family name.
func FQName(name string) string {
	return prometheus.BuildFQName(metricsNamespace, metricsSubsystem, name)
}

// NewCounterVec defines a counter family.
func NewCounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return Define(name, "counter", labels, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: name, Help: help,
	}, labels))
}

func newHistogramVec(name, help string, labels ...string) *prometheus.HistogramVec {
	return NewHistogramVec(name, help, latencyBuckets, labels...)
}

// NewHistogramVec defines a histogram family with buckets.
func NewHistogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return Define(name, "histogram", labels, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: name, Help: help,
		Buckets: buckets,
	}, labels))
}

// delayBuckets spans the waits of `delay`: 5ms to its longest, 1h.
var delayBuckets = []float64{
	5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3,
	1, 2.5, 5, 10, 30, 60, 300, 900, 3600,
}

func newCounter(name, help string) prometheus.Counter {
	return Define(name, "counter", nil, prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: name, Help: help,
	}))
}

func newHistogram(name, help string) prometheus.Histogram {
	return Define(name, "histogram", nil, prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: name, Help: help,
		Buckets: latencyBuckets,
	}))
}

// newGaugeFunc is a gauge read when scraped: state that lives elsewhere
// (a released backend then stops counting by itself).
func newGaugeFunc(name, help string, f func() float64) prometheus.GaugeFunc {
	return Define(name, "gauge", nil, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: name, Help: help,
	}, f))
}

// collectors are the process-wide collectors.
var collectors = struct {
	requests       *prometheus.CounterVec
	duration       *prometheus.HistogramVec
	redisCalls     *prometheus.CounterVec
	redisDuration  *prometheus.HistogramVec
	leaseUnits     *prometheus.CounterVec
	breakerOpen    prometheus.GaugeFunc
	tenantRequests *prometheus.CounterVec
	denialsDropped *prometheus.CounterVec
	nearLimit      *prometheus.CounterVec
	tenantNear     *prometheus.CounterVec
	delay          *prometheus.HistogramVec
	costMissing    *prometheus.CounterVec
	redisQueue     prometheus.Histogram
	redisQueueShed prometheus.Counter
}{
	requests: NewCounterVec("requests_total",
		"Rate-limit decisions, one per request and counted policy, by the policy's decision.",
		"policy", "decision"),
	duration: newHistogramVec("decision_duration_seconds",
		"Time taken to decide a request, by policy and by where the decision was taken.",
		"policy", "source"),
	redisCalls: NewCounterVec("redis_calls_total",
		"Redis script round trips, by script and outcome.",
		"script", "result"),
	redisDuration: newHistogramVec("redis_duration_seconds",
		"Duration of Redis script round trips, by script.",
		"script"),
	leaseUnits: NewCounterVec("lease_units_total",
		"Units of leased quota, by policy and lease event.",
		"policy", "event"),
	breakerOpen: newGaugeFunc("breaker_open",
		"1 while the Redis circuit breaker of a connection in use is open, else 0.",
		func() float64 {
			if fleet.AnyBreakerOpen() {
				return 1
			}
			return 0
		}),
	tenantRequests: NewCounterVec("tenant_requests_total",
		"Rate-limit decisions of the busiest tenants (metrics_tenants); every other tenant is counted as _other.",
		"policy", "tenant", "decision"),
	denialsDropped: NewCounterVec("denials_dropped_total",
		"Denials not written to the denial stream (denials_stream), by reason: buffer_full, breaker_open, error, shutdown.",
		"reason"),
	nearLimit: NewCounterVec("near_limit_total",
		"Admitted requests after which less than (1 - near_limit) of the tenant's limit was left, by policy.",
		"policy"),
	tenantNear: NewCounterVec("tenant_near_limit_total",
		"Like near_limit_total, per tenant for the busiest tenants (metrics_tenants); every other tenant is counted as _other.",
		"policy", "tenant"),
	delay: NewHistogramVec("delay_seconds",
		"How long admitted requests waited for their turn in a policy with a delay, by policy (requests that passed at once are not observed).",
		delayBuckets, "policy"),
	costMissing: NewCounterVec("cost_missing_total",
		"Metered requests (cost_after) whose response gave no valid cost, so only the up-front cost was charged, by policy.",
		"policy"),
	redisQueue: newHistogram("redis_queue_seconds",
		"Time Redis calls waited in this instance before they were written to Redis (not counted against the Redis timeout)."),
	redisQueueShed: newCounter("redis_queue_shed_total",
		"Redis calls shed unsent because they waited longer than the queue limit in this instance (a busy host, not a slow Redis); their requests were decided by the fail mode."),
}

// Register registers every collector with reg. Registering with a
// registry that already has them (another handler of the same config) is
// not an error.
func Register(reg prometheus.Registerer) error {
	for _, c := range all {
		err := reg.Register(c)
		var already prometheus.AlreadyRegisteredError
		if err == nil || (errors.As(err, &already) && already.ExistingCollector == c) {
			continue
		}
		return fmt.Errorf("registering rate limit metrics: %v", err)
	}
	return nil
}

// Observer reports what a fleet.Backend measures into the collectors. It
// is the fleet.Observer of every handler that records metrics.
type Observer struct{}

var _ fleet.Observer = Observer{}

// RedisCall implements fleet.Observer.
func (Observer) RedisCall(script, result string, d time.Duration) {
	observeRedis(script, result, d)
}

// RedisQueued implements fleet.Observer.
func (Observer) RedisQueued(wait time.Duration, shed bool) {
	collectors.redisQueue.Observe(wait.Seconds())
	if shed {
		collectors.redisQueueShed.Inc()
	}
}

// DenialsDropped implements fleet.Observer.
func (Observer) DenialsDropped(reason string, n int) {
	collectors.denialsDropped.WithLabelValues(reason).Add(float64(n))
}

// leaseCounters caches, per policy, the children of
// caddy_rate_limit_lease_units_total, so counting spent units on the
// request path is a map read and an atomic add.
var leaseCounters sync.Map // policy name -> *[limiter.NumLeaseEvents]prometheus.Counter

// ObserveLeaseUnits implements limiter.LeaseOptions.Observe.
func ObserveLeaseUnits(policy string, ev limiter.LeaseEvent, units int64) {
	v, ok := leaseCounters.Load(policy)
	if !ok {
		var cs [limiter.NumLeaseEvents]prometheus.Counter
		for e := range limiter.NumLeaseEvents {
			cs[e] = collectors.leaseUnits.WithLabelValues(policy, e.String())
		}
		v, _ = leaseCounters.LoadOrStore(policy, &cs)
	}
	if ev < limiter.NumLeaseEvents && units > 0 {
		v.(*[limiter.NumLeaseEvents]prometheus.Counter)[ev].Add(float64(units))
	}
}

// Handler is a handler's metrics: its policies' label children, and the
// per-tenant series of its busiest tenants (metrics_tenants).
type Handler struct {
	redis      bool
	policies   []policyMetrics
	tenants    *tenantTracker
	tenantsKey string
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
			m.policies[i].costMissing = collectors.costMissing.WithLabelValues(p.Label)
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

// CostMissing counts a metered request of policy i whose response gave no
// valid cost.
func (m *Handler) CostMissing(i int) {
	if c := m.policies[i].costMissing; c != nil {
		c.Inc()
	}
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
	// costMissing counts the policy's metered requests charged only
	// their up-front cost; nil for a policy that is not metered.
	costMissing prometheus.Counter
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

// The scripts and results the Redis store reports, so their label
// children are resolved once; anything else is resolved per call.
var (
	redisScripts = [...]string{"decide", "peek", "dry", "force", "refund", "release", "lease", "lease_return"}
	redisResults = [...]string{"ok", "error", "timeout", "noscript"}

	redisChildrenOnce sync.Once
	redisCallChildren [len(redisScripts)][len(redisResults)]prometheus.Counter
	redisDurChildren  [len(redisScripts)]prometheus.Observer
)

// DecisionNames are the values of the decision label.
func DecisionNames() []string { return decisionNames[:] }

// SourceNames are the values of the source label.
func SourceNames() []string { return sourceNames[:] }

// RedisScripts are the values of the script label.
func RedisScripts() []string { return redisScripts[:] }

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

// observeRedis records one Redis round trip.
func observeRedis(script, result string, d time.Duration) {
	redisChildrenOnce.Do(func() {
		for i, s := range redisScripts {
			redisDurChildren[i] = collectors.redisDuration.WithLabelValues(s)
			for j, r := range redisResults {
				redisCallChildren[i][j] = collectors.redisCalls.WithLabelValues(s, r)
			}
		}
	})
	si, ri := indexOf(redisScripts[:], script), indexOf(redisResults[:], result)
	if si < 0 || ri < 0 {
		collectors.redisCalls.WithLabelValues(script, result).Inc()
		collectors.redisDuration.WithLabelValues(script).Observe(d.Seconds())
		return
	}
	redisCallChildren[si][ri].Inc()
	redisDurChildren[si].Observe(d.Seconds())
}

// tenantLabel makes a tenant a label value: valid UTF-8, at most
// maxTenantLabel bytes, cut at a character boundary.
func tenantLabel(s string) string {
	if len(s) <= maxTenantLabel && utf8.ValidString(s) {
		return s
	}
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= maxTenantLabel {
		return s
	}
	i := maxTenantLabel
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i]
}

// tenantTrackers holds one tracker per (n, policy names): the handlers of
// one config generation and the next share it, so tenant series continue
// across reloads, and series are deleted when the last user goes.
var tenantTrackers = caddy.NewUsagePool()

// tenantTracker gives per-tenant series to the n busiest tenants of its
// policies and counts every other tenant as _other. A tenant that drops
// out of the top n loses its series.
type tenantTracker struct {
	policies []string
	top      *topk.TopK[tenantSeries]
	// other holds the _other children per policy, resolved on first use;
	// guarded by top's lock.
	other [][numTenantSeries]prometheus.Counter
}

// tenantNear is the index, beside the decisions, of a tenant's series in
// caddy_rate_limit_tenant_near_limit_total.
const (
	tenantNear      = numDecisions
	numTenantSeries = numDecisions + 1
)

// tenantSeries are a member tenant's children, per policy and decision
// (and tenantNear), resolved on first use; guarded by the top-k's lock.
type tenantSeries struct {
	counters [][numTenantSeries]prometheus.Counter
}

func loadTenantTracker(n int, policies []string) (*tenantTracker, string, error) {
	key := "tenants/n=" + strconv.Itoa(n) + "/policies=" + strings.Join(policies, ",")
	v, _, err := tenantTrackers.LoadOrNew(key, func() (caddy.Destructor, error) {
		return newTenantTracker(n, policies), nil
	})
	if err != nil {
		return nil, "", err
	}
	return v.(*tenantTracker), key, nil
}

func newTenantTracker(n int, policies []string) *tenantTracker {
	t := &tenantTracker{
		policies: append([]string(nil), policies...),
		other:    make([][numTenantSeries]prometheus.Counter, len(policies)),
	}
	t.top = topk.New(n, 4*n+128, t.release)
	return t
}

// counter returns the child a decision of tenant in policy (by index) is
// counted in, and counts the tenant's traffic towards the top n.
func (t *tenantTracker) counter(policy int, tenant string, d decisionLabel) prometheus.Counter {
	c, _ := t.counters(policy, tenant, d, false)
	return c
}

// counters is counter, and with near also the tenant's near-limit child
// (nil without near).
func (t *tenantTracker) counters(policy int, tenant string, d decisionLabel, near bool) (c, nc prometheus.Counter) {
	t.top.Observe(tenantLabel(tenant), func(key string, s *tenantSeries) {
		var cells *[numTenantSeries]prometheus.Counter
		if s == nil {
			cells, key = &t.other[policy], otherTenant
		} else {
			if s.counters == nil {
				s.counters = make([][numTenantSeries]prometheus.Counter, len(t.policies))
			}
			cells = &s.counters[policy]
		}
		if cells[d] == nil {
			cells[d] = acquireTenantCounter(t.policies[policy], key, d)
		}
		c = cells[d]
		if near {
			if cells[tenantNear] == nil {
				cells[tenantNear] = acquireTenantCounter(t.policies[policy], key, tenantNear)
			}
			nc = cells[tenantNear]
		}
	})
	return c, nc
}

// release deletes the series of a tenant that left the top n; it runs
// under the top-k's lock.
func (t *tenantTracker) release(tenant string, s *tenantSeries) {
	for p := range s.counters {
		for d := range s.counters[p] {
			if s.counters[p][d] != nil {
				releaseTenantCounter(t.policies[p], tenant, decisionLabel(d))
			}
		}
	}
	s.counters = nil
}

// Destruct implements caddy.Destructor: the last handler is gone, its
// tenant series go too.
func (t *tenantTracker) Destruct() error {
	t.top.Reset()
	t.top.WithLock(func() { t.releaseOther() })
	return nil
}

// releaseOther deletes the _other series; with the top-k's lock held.
func (t *tenantTracker) releaseOther() {
	for p := range t.other {
		for d := range t.other[p] {
			if t.other[p][d] != nil {
				releaseTenantCounter(t.policies[p], otherTenant, decisionLabel(d))
				t.other[p][d] = nil
			}
		}
	}
}

// tenantSeriesRefs counts the trackers using each tenant series: trackers
// whose policy names overlap share series, and one must not delete what
// another still counts in.
var tenantSeriesRefs = struct {
	sync.Mutex
	n map[tenantSeriesKey]int
}{n: make(map[tenantSeriesKey]int)}

type tenantSeriesKey struct {
	policy, tenant string
	decision       decisionLabel
}

func acquireTenantCounter(policy, tenant string, d decisionLabel) prometheus.Counter {
	tenantSeriesRefs.Lock()
	defer tenantSeriesRefs.Unlock()
	tenantSeriesRefs.n[tenantSeriesKey{policy, tenant, d}]++
	if d == tenantNear {
		return collectors.tenantNear.WithLabelValues(policy, tenant)
	}
	return collectors.tenantRequests.WithLabelValues(policy, tenant, decisionNames[d])
}

func releaseTenantCounter(policy, tenant string, d decisionLabel) {
	tenantSeriesRefs.Lock()
	defer tenantSeriesRefs.Unlock()
	k := tenantSeriesKey{policy, tenant, d}
	if tenantSeriesRefs.n[k]--; tenantSeriesRefs.n[k] > 0 {
		return
	}
	delete(tenantSeriesRefs.n, k)
	if d == tenantNear {
		collectors.tenantNear.DeleteLabelValues(policy, tenant)
		return
	}
	collectors.tenantRequests.DeleteLabelValues(policy, tenant, decisionNames[d])
}
