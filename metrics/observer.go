package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// Observer reports what a fleet.Backend measures into the collectors. It
// is the fleet.Observer of every handler that records metrics (the module
// checks that it is one).
type Observer struct{}

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

// ObserveNotification counts a webhook delivery (fleet.NotifyOptions.Observe).
func ObserveNotification(event, result string) {
	collectors.notifications.WithLabelValues(event, result).Inc()
}

// leaseCounters caches, per policy, the children of
// caddy_rate_limit_lease_units_total, so counting spent units on the
// request path is a map read and an atomic add.
var leaseCounters sync.Map // policy name -> *leaseChildren

// leaseChildren are one policy's series, by event label.
type leaseChildren [len(leaseEventNames)]prometheus.Counter

// leaseEventNames are the values of the event label; leaseLabel maps each
// engine event to one of them.
var (
	leaseEventNames = [...]string{"acquired", "spent", "returned", "expired"}
	leaseLabel      = [limiter.NumLeaseEvents]int{
		limiter.LeaseAcquired: 0,
		limiter.LeaseSpent:    1,
		limiter.LeaseReturned: 2,
		limiter.LeaseExpired:  3,
		limiter.LeaseLost:     -1, // acquired and expired, below
	}
)

// LeaseEventNames are the values of the event label of
// caddy_rate_limit_lease_units_total.
func LeaseEventNames() []string { return leaseEventNames[:] }

// ObserveLeaseUnits implements limiter.LeaseOptions.Observe.
//
// The engine's LeaseLost (units a lease call whose reply never arrived may
// have taken from the store) has no series of its own: those units count
// as acquired (the store may have charged them) and expired (no request
// was served from them, none went back), so that acquired = spent +
// returned + expired + held stays true and the label keeps its four
// values. Both counts are upper bounds for such units.
func ObserveLeaseUnits(policy string, ev limiter.LeaseEvent, units int64) {
	v, ok := leaseCounters.Load(policy)
	if !ok {
		var cs leaseChildren
		for i, name := range leaseEventNames {
			cs[i] = collectors.leaseUnits.WithLabelValues(policy, name)
		}
		v, _ = leaseCounters.LoadOrStore(policy, &cs)
	}
	if ev >= limiter.NumLeaseEvents || units <= 0 {
		return
	}
	cs := v.(*leaseChildren)
	if i := leaseLabel[ev]; i >= 0 {
		cs[i].Add(float64(units))
		return
	}
	cs[leaseLabel[limiter.LeaseAcquired]].Add(float64(units))
	cs[leaseLabel[limiter.LeaseExpired]].Add(float64(units))
}

// The scripts and results the Redis store reports, so their label
// children are resolved once; anything else is resolved per call.
var (
	redisScripts = [...]string{"decide", "peek", "dry", "force", "release", "lease", "lease_return"}
	redisResults = [...]string{"ok", "error", "timeout", "noscript"}

	redisChildrenOnce sync.Once
	redisCallChildren [len(redisScripts)][len(redisResults)]prometheus.Counter
	redisDurChildren  [len(redisScripts)]prometheus.Observer
)

// RedisScripts are the values of the script label.
func RedisScripts() []string { return redisScripts[:] }

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
