package surface

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// OpenTelemetry: when Caddy's tracing wraps rate_limit (its default
// order: tracing comes first), the request's span gets the decision as
// attributes (prefix rate_limit.) and events for a denial, a wait for a
// turn and a settled metered cost. Without a recording span nothing is
// built: one interface call per request.

// traceDecision puts the decision of st on r's span.
func (h *Server) traceDecision(r *http.Request, st *requestState, shown int) {
	span := trace.SpanFromContext(r.Context())
	if !span.IsRecording() {
		return
	}
	d := &st.decision
	attrs := make([]attribute.KeyValue, 0, 12)
	names := make([]string, 0, len(st.policies))
	for i, p := range st.policies {
		if d.Verdicts[i].Counted() {
			names = append(names, p.Name)
		}
	}
	attrs = append(attrs,
		attribute.StringSlice("rate_limit.policies", names),
		attribute.String("rate_limit.decision", traceDecisionName(d, st, shown)),
		attribute.String("rate_limit.store", h.gate.Store.Status().Kind))
	if h.Tenant != "" {
		tenant := st.items[0].Tenant
		sum := sha256.Sum256([]byte(tenant))
		attrs = append(attrs, attribute.String("rate_limit.tenant.digest", hex.EncodeToString(sum[:8])))
		if h.LogKey {
			attrs = append(attrs, attribute.String("rate_limit.tenant", gate.Loggable(tenant)))
		}
	}
	if shown >= 0 {
		v := &d.Verdicts[shown]
		attrs = append(attrs,
			attribute.String("rate_limit.policy", st.policies[shown].Name),
			attribute.Int64("rate_limit.limit", v.Limit.Limit),
			attribute.Int64("rate_limit.remaining", v.Result.Remaining),
			attribute.String("rate_limit.limit_source", v.Source.String()),
			attribute.Bool("rate_limit.lease_hit", v.Result.From == limiter.OriginLease))
		if fm := traceFailMode(v.Path); fm != "" {
			attrs = append(attrs, attribute.String("rate_limit.fail_mode", fm))
		}
		if !d.Admitted {
			span.AddEvent("rate_limit.denied", trace.WithAttributes(
				attribute.String("rate_limit.policy", st.policies[shown].Name),
				attribute.Float64("rate_limit.retry_after", v.Result.RetryAfter.Seconds())))
		}
	}
	span.SetAttributes(attrs...)
}

// traceDecisionName names the decision as the requests_total metric's
// decision label does, for the verdict shown (-1: none counted).
func traceDecisionName(d *limiter.Decision, st *requestState, shown int) string {
	if shown < 0 {
		return "allowed"
	}
	v := &d.Verdicts[shown]
	switch {
	case !d.Admitted && v.Path == limiter.PathPenalty:
		return "penalty"
	case !d.Admitted && v.Path == limiter.PathFailedClosed:
		return "failed_closed"
	case !d.Admitted && v.Path == limiter.PathFallback:
		return "fallback_denied"
	case !d.Admitted:
		return "denied"
	case st.wait > 0:
		return "delayed"
	case v.Path == limiter.PathFailedOpen:
		return "failed_open"
	case v.Path == limiter.PathFallback:
		return "fallback_allowed"
	}
	return "allowed"
}

// traceFailMode is the fail mode a verdict was decided by, "" when the
// store answered.
func traceFailMode(p limiter.Path) string {
	switch p {
	case limiter.PathFailedOpen:
		return "open"
	case limiter.PathFailedClosed:
		return "closed"
	case limiter.PathFallback:
		return "local"
	}
	return ""
}

// traceWait notes on r's span that the request waited for its turn.
func traceWait(r *http.Request, wait time.Duration) {
	if span := trace.SpanFromContext(r.Context()); span.IsRecording() {
		span.AddEvent("rate_limit.delay", trace.WithAttributes(attribute.Float64("rate_limit.delay_waited", wait.Seconds())))
	}
}

// traceSettle notes on r's span the real costs settled.
func traceSettle(r *http.Request, st *requestState, real []int64) {
	span := trace.SpanFromContext(r.Context())
	if !span.IsRecording() {
		return
	}
	for i, n := range real {
		if n >= 0 {
			span.AddEvent("rate_limit.settled", trace.WithAttributes(
				attribute.String("rate_limit.policy", st.policies[i].Name),
				attribute.Int64("rate_limit.cost.up_front", st.items[i].Cost),
				attribute.Int64("rate_limit.cost.settled", n)))
		}
	}
}
