package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/caddy-tollgate/protect"
)

// The protect block's metrics: the limit, the requests in flight and
// queued (summed over the live handlers' limiters of this instance), the
// waits by tier, and the requests shed by reason.

// protectLimiters are the live limiters the gauges read.
var protectLimiters = struct {
	sync.Mutex
	m map[*protect.Limiter]struct{}
}{m: map[*protect.Limiter]struct{}{}}

// TrackProtect makes l count in the gauges; UntrackProtect stops it.
func TrackProtect(l *protect.Limiter) {
	protectLimiters.Lock()
	protectLimiters.m[l] = struct{}{}
	protectLimiters.Unlock()
}

// UntrackProtect stops l counting in the gauges.
func UntrackProtect(l *protect.Limiter) {
	protectLimiters.Lock()
	delete(protectLimiters.m, l)
	protectLimiters.Unlock()
}

// protectSum sums f over the live limiters.
func protectSum(f func(protect.Stats) int) float64 {
	protectLimiters.Lock()
	defer protectLimiters.Unlock()
	n := 0
	for l := range protectLimiters.m {
		n += f(l.Stats())
	}
	return float64(n)
}

// protectWaitBuckets span 1ms to 10s.
var protectWaitBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

var protectCollectors = struct {
	limit, inflight, queued prometheus.GaugeFunc
	wait                    *prometheus.HistogramVec
	shed                    *prometheus.CounterVec
}{
	limit: newGaugeFunc("protect_limit",
		"The adaptive in-flight limit of the upstream (protect), summed over this instance's handlers.",
		func() float64 { return protectSum(func(s protect.Stats) int { return s.Limit }) }),
	inflight: newGaugeFunc("protect_inflight",
		"Requests in flight to the protected upstream, summed over this instance's handlers.",
		func() float64 { return protectSum(func(s protect.Stats) int { return s.InFlight }) }),
	queued: newGaugeFunc("protect_queued",
		"Requests waiting for a slot to the protected upstream, summed over this instance's handlers.",
		func() float64 { return protectSum(func(s protect.Stats) int { return s.Queued }) }),
	wait: NewHistogramVec("protect_wait_seconds",
		"How long requests that waited for a slot waited, by tier (tiers with a weight; the rest are \"other\").",
		protectWaitBuckets, "tier"),
	shed: NewCounterVec("shed_total",
		"Requests shed by protect, by reason: wait (waits kept above target_wait), timeout (max_wait), queue_full, shadow (would have waited; nothing shed).",
		"reason"),
}

// ObserveProtectWait records a request's wait for a slot.
func ObserveProtectWait(tier string, d time.Duration) {
	protectCollectors.wait.WithLabelValues(tier).Observe(d.Seconds())
}

// RecordShed counts a request shed (reason "shadow": it would have had
// to wait): in shed_total, and in requests_total as policy "protect",
// decision shed (shadow_denied for a would-shed).
func RecordShed(reason string) {
	protectCollectors.shed.WithLabelValues(reason).Inc()
	decision := decisionShed
	if reason == "shadow" {
		decision = decisionShadowDenied
	}
	collectors.requests.WithLabelValues("protect", decisionNames[decision]).Inc()
}
