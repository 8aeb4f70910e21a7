package metrics

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Every family is caddy_rate_limit_<name>.
const (
	metricsNamespace = "caddy"
	metricsSubsystem = "rate_limit"
)

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

// BreakerOpen reports whether the Redis circuit breaker of a connection
// in use is open: set once by the module (fleet.AnyBreakerOpen), so this
// package needs nothing of the fleet's.
var BreakerOpen func() bool

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
	drains         *prometheus.CounterVec
	llmRequests    *prometheus.CounterVec
	redisQueue     prometheus.Histogram
	redisQueueShed prometheus.Counter
	notifications  *prometheus.CounterVec
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
			if f := BreakerOpen; f != nil && f() {
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
		"Metered requests (cost_after) whose response gave no valid cost, by policy and reason: no_value, compressed, not_json, invalid_number, client_gone.",
		"policy", "reason"),
	drains: NewCounterVec("drains_total",
		"Metered responses read on after their client went away, so that the usage at their end is charged, by event: started, completed, cut_time, cut_bytes (cut at a bound), refused (every drain slot taken: not drained).",
		"event"),
	llmRequests: NewCounterVec("llm_requests_total",
		"Request bodies read for a cost_after preset (openai, anthropic), by result: read, usage_requested (stream_options.include_usage set for the client), too_large (refused with 413), not_json (passed on untouched), not_utf8 (JSON in UTF-16 or UTF-32, refused with 400), busy (the bodies held reached 256 MiB: refused with 503), no_body.",
		"result"),
	redisQueue: newHistogram("redis_queue_seconds",
		"Time Redis calls waited in this instance before they were written to Redis (not counted against the Redis timeout)."),
	notifications: NewCounterVec("notifications_total",
		"Webhook deliveries (notify), by event and result: sent, failed (given up), retried (an attempt that failed and is tried again), dropped (a full queue or a reload).",
		"event", "result"),
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
