package surface

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// precomputeHeaders renders the header values of the policy's own limit
// once; tiers, tenant limits and runtime overrides are rendered per
// request.
func (p *policyRuntime) precomputeHeaders() {
	p.ownPolicyHeader = policyHeader(p.Header, p.Engine.Algorithm, p.Engine.Limit.Rate)
	p.ownLimitHeader = strconv.FormatInt(p.Engine.Limit.Limit, 10)
}

// policyHeader renders an IETF RateLimit-Policy item: "name";q=limit;w=secs
// (name as headerName made it). A calendar limit's w= is the length of its
// current period.
func policyHeader(name string, algo limiter.Algorithm, rate limiter.Rate) string {
	if rate.Calendar != nil {
		return policyHeaderWindow(name, rate.Limit, periodLength(rate, time.Now()))
	}
	b := make([]byte, 0, len(name)+32)
	b = append(b, '"')
	b = append(b, name...)
	b = append(b, `";q=`...)
	b = strconv.AppendInt(b, rate.Limit, 10)
	if algo != limiter.Concurrency {
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, ceilSeconds(rate.Window), 10)
	}
	return string(b)
}

// ceilSeconds rounds d up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// pick chooses the verdict the response talks about: when denied, the
// enforced policy that denies for longest; otherwise the enforced policy
// with the least remaining quota; with only shadow policies, the shadow one
// with the least remaining. It returns -1 when nothing was counted.
func pick(d *limiter.Decision, enforcedOnly bool) int {
	best := -1
	for i := range d.Verdicts {
		v := &d.Verdicts[i]
		// A fail-open verdict knows nothing about the quota: nothing to show.
		if !v.Counted() || v.Path == limiter.PathFailedOpen || (enforcedOnly && !v.Enforced()) {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		b := &d.Verdicts[best]
		if d.Admitted {
			if v.Result.Remaining < b.Result.Remaining {
				best = i
			}
		} else if !v.Result.Allowed && (b.Result.Allowed || v.Result.RetryAfter > b.Result.RetryAfter) {
			best = i
		}
	}
	return best
}

// report sets the placeholders and headers of a decision and logs shadow
// would-denials. It returns the index of the verdict shown in headers, or
// -1 when no enforced policy counted the request.
func (h *Server) report(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, st *requestState) int {
	d := &st.decision
	shown := pick(d, true)
	placeholder := shown
	if placeholder < 0 {
		placeholder = pick(d, false)
	}
	for i := range d.Verdicts {
		v := &d.Verdicts[i]
		if v.ShadowDenied() {
			st.shadow = append(st.shadow, st.policies[i].Name)
			h.logShadowDenial(st.policies[i], &st.items[i], v)
		} else if v.Limit.Shadow && v.Result.Wait > 0 {
			h.logShadowDelay(st.policies[i], &st.items[i], v)
		}
	}
	st.wait = d.Wait()
	var pv placeholderValues
	if st.wait > 0 {
		pv.delay = st.wait
		if extra, ok := r.Context().Value(caddyhttp.ExtraLogFieldsCtxKey).(*caddyhttp.ExtraLogFields); ok {
			extra.Add(zap.Duration("rate_limit_delay", st.wait))
		}
	}
	if len(st.shadow) > 0 {
		if extra, ok := r.Context().Value(caddyhttp.ExtraLogFieldsCtxKey).(*caddyhttp.ExtraLogFields); ok {
			extra.Add(zap.Strings("rate_limit_shadow_denied", append([]string(nil), st.shadow...)))
		}
		pv.shadow = strings.Join(st.shadow, ",")
	}
	if placeholder >= 0 {
		it, v := &st.items[placeholder], &d.Verdicts[placeholder]
		pv.policy, pv.tenant = st.policies[placeholder].Name, it.Tenant
		pv.limit, pv.remaining = v.Limit.Limit, v.Result.Remaining
		if v.Source == limiter.SourcePolicy {
			pv.limit = st.policies[placeholder].Engine.Limit.Limit
		}
		pv.retryAfter = ceilSeconds(v.Result.RetryAfter)
	} else {
		// Nothing counted (unlimited tenants, or fail open): the first
		// matched policy, with -1 for "no limit known".
		pv.policy, pv.tenant = st.policies[0].Name, st.items[0].Tenant
		pv.limit, pv.remaining = -1, -1
	}
	setPlaceholders(r, repl, pv)
	if shown >= 0 && h.headerMode != config.HeadersOff {
		h.writeHeaders(w.Header(), st.policies[shown], &d.Verdicts[shown])
	}
	return shown
}

// Header names in canonical form (what http.Header.Set would store), so
// writing them skips the canonicalization and its allocation.
const (
	hdrPolicy    = "Ratelimit-Policy"
	hdrRateLimit = "Ratelimit"
	hdrLimit     = "X-Ratelimit-Limit"
	hdrRemaining = "X-Ratelimit-Remaining"
	hdrReset     = "X-Ratelimit-Reset"
)

// writeHeaders writes the IETF and/or legacy headers for one verdict. It
// runs on every request, so it allocates little: the numbers and the
// RateLimit item are rendered into one string and sliced, and the header
// values share one backing array.
func (h *Server) writeHeaders(hdr http.Header, p *policyRuntime, v *limiter.Verdict) {
	wait := v.Result.Reset
	if !v.Result.Allowed {
		wait = v.Result.RetryAfter
	}
	secs := ceilSeconds(wait)
	ietf := h.headerMode == config.HeadersBoth || h.headerMode == config.HeadersIETF
	legacy := h.headerMode == config.HeadersBoth || h.headerMode == config.HeadersLegacy

	// "name";r=R;t=T, then R and T alone.
	var buf [160]byte
	b := append(buf[:0], '"')
	b = append(b, p.Header...)
	b = append(b, `";r=`...)
	b = strconv.AppendInt(b, v.Result.Remaining, 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, secs, 10)
	item := len(b)
	b = strconv.AppendInt(b, v.Result.Remaining, 10)
	rem := len(b)
	b = strconv.AppendInt(b, secs, 10)
	all := string(b)

	var vals [5]string
	n := 0
	set := func(key, val string) {
		vals[n] = val
		hdr[key] = vals[n : n+1 : n+1]
		n++
	}
	if ietf {
		pol := p.ownPolicyHeader
		if v.Source != limiter.SourcePolicy {
			pol = policyHeader(p.Header, p.Engine.Algorithm, v.Limit.Rate)
		} else if p.Engine.Limit.Calendar != nil {
			pol = p.calendarHeader.get(p, time.Now())
		}
		set(hdrPolicy, pol)
		set(hdrRateLimit, all[:item])
	}
	if legacy {
		lim := p.ownLimitHeader
		if v.Source != limiter.SourcePolicy {
			lim = strconv.FormatInt(v.Limit.Limit, 10)
		}
		set(hdrLimit, lim)
		set(hdrRemaining, all[item:rem])
		set(hdrReset, all[rem:])
	}
}

// maxRetryWait bounds the wait a jitter can make: however large jitter
// is, Retry-After stays a sane number of seconds.
const maxRetryWait = 10 * 366 * 24 * time.Hour

// jittered is the wait a denial announces: wait plus up to jitter x wait
// at random (caddy-ratelimit's jitter), at most maxRetryWait.
func (h *Server) jittered(wait time.Duration) time.Duration {
	j := h.Jitter
	if !(j > 0) || wait <= 0 { // NaN: no jitter
		return wait
	}
	f := float64(wait) * (1 + rand.Float64()*j)
	if !(f < float64(maxRetryWait)) {
		return maxRetryWait
	}
	return time.Duration(f)
}

// retryAfterSeconds is the Retry-After value for a wait: whole seconds,
// rounded up, at least 1.
func retryAfterSeconds(wait time.Duration) int64 {
	return max(ceilSeconds(wait), 1)
}

// remoteIP is the address of the connection's peer, as caddy-ratelimit
// logs it: the host of RemoteAddr (not the client IP behind a proxy).
func remoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// deny answers 429 as a handler error, so handle_errors can render it. It
// sets {http.rate_limit.exceeded.name} to the denying policy, logs
// caddy-ratelimit's INFO line "rate limit exceeded" (zone, wait,
// remote_ip, and key with log_key) with Tollgate's fields, and emits the
// rate_limit_exceeded event with the same data.
func (h *Server) deny(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, st *requestState, shown int) error {
	p, it, v := st.policies[shown], &st.items[shown], &st.decision.Verdicts[shown]
	wait := h.jittered(v.Result.RetryAfter)
	secs := retryAfterSeconds(wait)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	setExceeded(r, repl, p.Name, secs)

	ip := remoteIP(r)
	if ce := h.logger.Check(zapcore.InfoLevel, "rate limit exceeded"); ce != nil {
		fields := make([]zap.Field, 0, 11)
		fields = append(fields, zap.String("zone", p.Name), zap.Duration("wait", wait), zap.String("remote_ip", ip))
		ce.Write(h.decisionFields(fields, p, it, v, secs)...)
	}
	if ds := h.gate.Store.Denials(); ds != nil {
		h.recordDenial(ds, p, it, v, secs)
	}
	if h.events != nil {
		data := exceededEvent(p.Name, wait, ip, v.Limit.Limit, secs)
		if h.Tenant != "" {
			data["tenant"] = gate.Loggable(it.Tenant)
		}
		if h.LogKey {
			data["key"] = gate.Loggable(h.bucketKey(it))
		}
		if v.Path == limiter.PathPenalty {
			data["reason"] = "penalty"
		}
		h.events.Emit(h.ctx, "rate_limit_exceeded", data)
	}
	return caddyhttp.Error(http.StatusTooManyRequests, fmt.Errorf("rate limit exceeded: policy %s", p.Name))
}

// bucketKey is the key a request was counted under, what log_key logs: the
// policy's key (the tenant itself when the handler has no tenant).
func (h *Server) bucketKey(it *limiter.Item) string {
	if h.Tenant == "" {
		// The key the request resolved, not the engine's tenant: an
		// empty key is logged empty, not as the anonymous tenant.
		return limiter.TenantOf(it.Tenant)
	}
	return it.Part
}

// recordDenial queues the stream entry of an enforced denial. Called on
// the 429 path: a struct copy into a channel, no I/O. The key-as-tenant of
// a handler without tenant is written only with log_key, like in logs.
func (h *Server) recordDenial(ds *fleet.DenialStream, p *policyRuntime, it *limiter.Item, v *limiter.Verdict, retryAfter int64) {
	e := fleet.Denial{
		TS:         time.Now().UnixMilli(),
		Policy:     p.Name,
		Limit:      v.Limit.Limit,
		RetryAfter: retryAfter,
		Penalty:    v.Path == limiter.PathPenalty,
	}
	switch {
	case h.Tenant != "":
		e.Tenant, e.TenantID = gate.DenialTenant(it.Tenant)
		if h.LogKey {
			e.Key = gate.Loggable(it.Part)
		}
	case h.LogKey:
		e.Tenant, e.TenantID = gate.DenialTenant(it.Tenant)
	}
	ds.Add(e)
}

var errMissingTenant = errors.New("rate limit: request has no tenant (missing_tenant deny)")

// denyMissingTenant answers 429 for a request without tenant identity.
// Retrying will not help, but clients expect Retry-After on every 429. No
// policy decided, so the placeholders say so: empty policy and tenant,
// limit and remaining 0, retry_after 1 (what Retry-After says), so a
// handle_errors template renders as it does for any other 429.
//
// It is reported as every denial is, so that alerts on 429s see it: the
// INFO line "rate limit exceeded" and the rate_limit_exceeded event, with
// an empty zone, policy and tenant and reason "missing_tenant", and one
// count in requests_total under policy "missing_tenant"
// (metrics.MissingTenantPolicy), decision denied. The denial stream does
// not record it: its entries are a tenant's history, and there is none.
func (h *Server) denyMissingTenant(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer) error {
	setPlaceholders(r, repl, placeholderValues{retryAfter: 1})
	setExceeded(r, repl, "", 1)
	w.Header().Set("Retry-After", "1")
	if h.metrics != nil {
		h.metrics.MissingTenantDenied()
	}
	ip := remoteIP(r)
	if ce := h.logger.Check(zapcore.InfoLevel, "rate limit exceeded"); ce != nil {
		ce.Write(zap.String("zone", ""), zap.Duration("wait", time.Second), zap.String("remote_ip", ip),
			zap.String("tenant", ""), zap.String("policy", ""), zap.Int64("limit", 0), zap.Int64("retry_after", 1),
			zap.String("reason", missingTenantReason), zap.String("template", h.Tenant))
	}
	if h.events != nil {
		data := exceededEvent("", time.Second, ip, 0, 1)
		data["tenant"], data["reason"] = "", missingTenantReason
		h.events.Emit(h.ctx, "rate_limit_exceeded", data)
	}
	return caddyhttp.Error(http.StatusTooManyRequests, errMissingTenant)
}

// missingTenantReason is the reason field of a missing_tenant denial's
// log line and event.
const missingTenantReason = "missing_tenant"

// exceededEvent is the data every rate_limit_exceeded event carries: the
// zone (the policy that denied; caddy-ratelimit's name), the wait, the
// client's IP, the policy, its limit and the Retry-After in seconds.
// Callers add tenant, key and reason as they apply.
func exceededEvent(policy string, wait time.Duration, ip string, limit, retryAfter int64) map[string]any {
	return map[string]any{
		"zone":        policy,
		"wait":        wait,
		"remote_ip":   ip,
		"policy":      policy,
		"limit":       limit,
		"retry_after": retryAfter,
	}
}

// logShadowDenial writes the INFO line of a shadow would-deny.
func (h *Server) logShadowDenial(p *policyRuntime, it *limiter.Item, v *limiter.Verdict) {
	if ce := h.logger.Check(zapcore.InfoLevel, "rate limit would deny"); ce != nil {
		ce.Write(h.decisionFields(make([]zap.Field, 0, 8), p, it, v, retryAfterSeconds(v.Result.RetryAfter))...)
	}
}

// logShadowDelay writes the INFO line of a shadow would-delay: the
// request passes at once, the policy's bucket took its turn.
func (h *Server) logShadowDelay(p *policyRuntime, it *limiter.Item, v *limiter.Verdict) {
	if ce := h.logger.Check(zapcore.InfoLevel, "rate limit would delay"); ce != nil {
		fields := make([]zap.Field, 0, 9)
		fields = append(fields, zap.Duration("delay", v.Result.Wait))
		ce.Write(h.decisionFields(fields, p, it, v, 0)...)
	}
}

// waitTurn holds an admitted request until its turn, the latest of its
// policies' turns (st.wait), in the request's own goroutine: a waiting
// request holds a timer and nothing else. A client that goes away
// meanwhile gives its turn back (limiter.Decision.Cancel), so a later
// request can have it, and the request ends with status 499 (client
// closed request, as reverse_proxy reports it). A config reload does not
// cut the wait short: the request passes at its turn through the handler
// chain it started in.
func (h *Server) waitTurn(r *http.Request, st *requestState) error {
	if ce := h.logger.Check(zapcore.DebugLevel, "rate limit: waiting for a turn"); ce != nil {
		ce.Write(zap.Duration("delay", st.wait))
	}
	t := st.startTimer(st.wait)
	select {
	case <-t.C:
		traceWait(r, st.wait)
		return nil
	case <-r.Context().Done():
		t.Stop()
	}
	err := h.gate.Store.Cancel(context.WithoutCancel(r.Context()), &st.decision)
	if ce := h.logger.Check(zapcore.DebugLevel, "rate limit: client went away while waiting for its turn; turn given back"); ce != nil {
		ce.Write(zap.Duration("delay", st.wait), zap.Error(err))
	}
	return caddyhttp.Error(statusClientClosedRequest, fmt.Errorf("rate limit: client went away while waiting %s for its turn", st.wait))
}

// statusClientClosedRequest is the status of a request whose client went
// away before it was answered (nginx's 499, which Caddy uses too).
const statusClientClosedRequest = 499

// decisionFields appends a verdict's log fields to fields. Privacy: keys
// (which may be API keys or addresses) are logged only with log_key, as in
// caddy-ratelimit; tenants are logged when the handler has a `tenant`
// template, which names an identity the operator chose for the purpose.
// Without one, the tenant is the key and follows the key's rule: the
// field is always there, empty unless log_key.
func (h *Server) decisionFields(fields []zap.Field, p *policyRuntime, it *limiter.Item, v *limiter.Verdict, retryAfter int64) []zap.Field {
	tenant := ""
	switch {
	case h.Tenant != "":
		tenant = gate.Loggable(it.Tenant)
	case h.LogKey:
		tenant = gate.Loggable(h.bucketKey(it))
	}
	fields = append(fields, zap.String("tenant", tenant))
	fields = append(fields,
		zap.String("policy", p.Name),
		zap.Int64("limit", v.Limit.Limit),
		zap.Int64("remaining", v.Result.Remaining),
		zap.Int64("retry_after", retryAfter),
		zap.String("limit_source", v.Source.String()),
	)
	if h.LogKey {
		fields = append(fields, zap.String("key", gate.Loggable(h.bucketKey(it))))
	}
	if v.Path == limiter.PathPenalty {
		// Refused by the bucket's penalty box, not by its count.
		fields = append(fields, zap.String("reason", "penalty"))
	}
	return fields
}

// storeWarningInterval is the least time between two store failure logs,
// so failures do not log once per request.
const storeWarningInterval = 10 * time.Second

// storeFailed logs a failed store call at DEBUG, at most once per
// storeWarningInterval. Outages are reported by the circuit breaker (one
// WARN when it opens, one INFO when it closes); calls refused by the open
// breaker are not logged at all.
func (h *Server) storeFailed(err error) {
	if errors.Is(err, limiter.ErrBreakerOpen) {
		return
	}
	now := time.Now().UnixNano()
	last := h.lastStoreWarning.Load()
	if now-last < int64(storeWarningInterval) || !h.lastStoreWarning.CompareAndSwap(last, now) {
		return
	}
	if ce := h.logger.Check(zapcore.DebugLevel, "rate limit store call failed; decided by fail mode"); ce != nil {
		ce.Write(zap.Error(err))
	}
}
