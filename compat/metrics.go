package compat

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/limiter"
	"github.com/tollgate/caddy-tollgate/metrics"
)

// caddy-ratelimit's metric families, so its dashboards and alerts keep
// working: declined_requests_total, process_time_seconds, keys_total and
// config, by zone. Its `key` label is left out (a label per key is an
// unbounded number of series; PromQL treats its zone-level series, whose
// key is "", as ones without the label, which these are). Its
// requests_total is not here: that name is Tollgate's own family (labels
// policy and decision); docs/observability.md rebuilds caddy-ratelimit's
// series from it with recording rules.

// processTimeBuckets are caddy-ratelimit's process_time_seconds buckets.
var processTimeBuckets = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1}

var compatCollectors = struct {
	declined    *prometheus.CounterVec
	processTime *prometheus.HistogramVec
	keys        *keysCollector
	config      *prometheus.CounterVec
}{
	declined: metrics.NewCounterVec("declined_requests_total",
		"Requests answered 429, by the zone (policy) that denied them (caddy-ratelimit's family, without its key label).",
		"zone"),
	processTime: metrics.NewHistogramVec("process_time_seconds",
		"Time taken to decide a request, by the zone (policy) the response describes (caddy-ratelimit's family, without its key label).",
		processTimeBuckets, "zone"),
	keys: newKeysCollector(),
	config: metrics.NewCounterVec("config",
		"Zone (policy) configurations, counted once per load (caddy-ratelimit's family).",
		"zone", "max_events", "window", "ipv4_prefix", "ipv6_prefix"),
}

// Metrics are a handler's children of caddy-ratelimit's families, per
// policy.
type Metrics struct {
	policies []compatChildren
}

// compatChildren are a policy's children.
type compatChildren struct {
	declined    prometheus.Counter
	processTime prometheus.Observer
}

// NewMetrics resolves the children of the policies of cfg (gate's, in
// its order) and counts their configuration, as caddy-ratelimit does at
// every provisioning.
func NewMetrics(cfg *config.Handler, policies []*gate.Policy) *Metrics {
	m := &Metrics{policies: make([]compatChildren, len(policies))}
	for i, p := range policies {
		pc := cfg.RateLimits[p.Name]
		m.policies[i] = compatChildren{
			declined:    compatCollectors.declined.WithLabelValues(p.Label),
			processTime: compatCollectors.processTime.WithLabelValues(p.Label),
		}
		compatCollectors.config.WithLabelValues(p.Label,
			strconv.FormatInt(pc.MaxEvents, 10),
			time.Duration(pc.Window).String(),
			strconv.Itoa(pc.IPv4Prefix),
			strconv.Itoa(pc.IPv6Prefix)).Inc()
	}
	return m
}

// Record records a decision: one process time per request, and a
// declined request when it was denied, under the policy the response
// describes (its index among the handler's policies).
func (m *Metrics) Record(policy int, admitted bool, secs float64) {
	p := &m.policies[policy]
	p.processTime.Observe(secs)
	if !admitted {
		p.declined.Inc()
	}
}

// keysCollector exports caddy_rate_limit_keys_total: the buckets each zone
// holds in the embedded store, counted when scraped. Handlers on Redis
// are left out (counting their keys would scan Redis).
type keysCollector struct {
	desc *prometheus.Desc
}

func newKeysCollector() *keysCollector {
	return metrics.Define("keys_total", "gauge", []string{"zone"}, &keysCollector{desc: prometheus.NewDesc(
		metrics.FQName("keys_total"),
		"Buckets (keys) each zone (policy) holds in the embedded store, expired ones not yet swept included (caddy-ratelimit's family).",
		[]string{"zone"}, nil)})
}

// Describe implements prometheus.Collector.
func (c *keysCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *keysCollector) Collect(ch chan<- prometheus.Metric) {
	gate.RLock()
	defer gate.RUnlock()
	counts := map[*limiter.MemoryStore]map[string]int{}
	values := map[string]int{}
	for _, h := range gate.Gates() {
		m, ok := h.Store.(*gate.Memory)
		if !ok || h.Config.DisableMetrics {
			continue
		}
		mem := m.MemoryStore()
		byPolicy, ok := counts[mem]
		if !ok {
			byPolicy = mem.PolicyCounts()
			counts[mem] = byPolicy
		}
		for _, p := range h.Policies {
			values[p.Label] = byPolicy[p.Engine.Name]
		}
	}
	for zone, n := range values {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), zone)
	}
}
