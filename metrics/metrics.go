// Package metrics holds Tollgate's Prometheus metrics. The collectors are
// created once per process and registered with the metrics registry of
// every config generation (Caddy makes a new registry on each load), so
// values continue across reloads and each family appears once on
// /metrics. Other packages add families of their own (caddy-ratelimit's,
// package compat) with NewCounterVec, NewHistogramVec and Define.
package metrics

// decisionLabel is the decision label of caddy_rate_limit_requests_total.
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
	decisionPenalty
	decisionShed
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
	decisionPenalty:         "penalty",
	decisionShed:            "shed",
}

// sourceLabel is the source label of caddy_rate_limit_decision_duration_seconds.
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

// DecisionNames are the values of the decision label.
func DecisionNames() []string { return decisionNames[:] }

// SourceNames are the values of the source label.
func SourceNames() []string { return sourceNames[:] }

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}
