package surface

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/metrics"
	"github.com/tollgate/caddy-tollgate/protect"
)

// protection is the handler's protect block: its limiter (this
// instance's) and how a shed request is answered.
type protection struct {
	limiter    *protect.Limiter
	priority   template
	status     int
	retryAfter time.Duration
	// tiers are the tiers with a weight: others are labelled "other" in
	// metrics, so a tier header cannot create series.
	tiers map[string]bool
}

// provisionProtect builds the handler's protection, nil without a
// protect block.
func (h *Server) provisionProtect() {
	c := h.Protect
	if c == nil {
		return
	}
	p := &protection{priority: compileTemplate(c.Priority), status: c.Status, retryAfter: time.Duration(c.RetryAfter), tiers: map[string]bool{}}
	if p.status == 0 {
		p.status = http.StatusServiceUnavailable
	}
	if p.retryAfter <= 0 {
		p.retryAfter = time.Second
	}
	for tier := range c.Weights {
		p.tiers[tier] = true
	}
	p.limiter = protect.New(protect.Options{
		Min: c.Min, Max: c.Max, Initial: c.Initial, Tolerance: c.Tolerance, Smoothing: c.Smoothing,
		TargetWait: time.Duration(c.TargetWait), Interval: time.Duration(c.Interval), MaxWait: time.Duration(c.MaxWait),
		QueueLimit: c.QueueLimit,
		Weight: func(tier string) int {
			if w, ok := c.Weights[tier]; ok {
				return w
			}
			return 1
		},
	})
	h.protection = p
	metrics.TrackProtect(p.limiter)
}

// closeProtect sheds what waits and stops reporting the limiter.
func (h *Server) closeProtect() {
	if p := h.protection; p != nil {
		metrics.UntrackProtect(p.limiter)
		p.limiter.Close()
	}
}

// Protection is the handler's limiter, nil without protect (the admin
// API's view).
func (h *Server) Protection() *protect.Limiter {
	if h.protection == nil {
		return nil
	}
	return h.protection.limiter
}

// serveProtected takes a slot for the request of tenant in tier (waiting
// in its tenant's queue when the limit is reached), passes it on, and
// gives the slot back with the upstream's latency and outcome. A shed
// request is answered with the protect block's status and a Retry-After,
// and the units the rate limits charged it are given back (it never
// reached the upstream).
func (h *Server) serveProtected(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, next caddyhttp.Handler, st *requestState, tenant, tier string) (err error) {
	p := h.protection
	prio := protect.Normal
	if p.priority.raw != "" {
		prio = protect.ParsePriority(p.priority.expand(repl, r))
	}
	enqueued := time.Now()
	slot, wouldQueue, aerr := p.limiter.Acquire(r.Context(), tenant, tier, prio, h.Shadow)
	if aerr != nil {
		if se, ok := aerr.(*protect.ShedError); ok {
			return h.shed(w, r, repl, st, tenant, tier, se.Reason)
		}
		return caddyhttp.Error(statusClientClosedRequest, fmt.Errorf("protect: %w", aerr))
	}
	if waited := time.Since(enqueued); waited > time.Millisecond && h.metrics != nil {
		metrics.ObserveProtectWait(p.tierLabel(tier), waited)
	}
	if wouldQueue {
		if h.metrics != nil {
			metrics.RecordShed("shadow")
		}
		if ce := h.logger.Check(zapcore.InfoLevel, "request would be shed (shadow)"); ce != nil {
			ce.Write(zap.String("tenant", gate.Loggable(tenant)), zap.Int("limit", p.limiter.Stats().Limit))
		}
	}
	sw := &st.upstream
	sw.ResponseWriter, sw.status = w, 0
	start := time.Now()
	defer func() {
		sw.ResponseWriter = nil
		failed := overloadAnswer(statusOf(sw.status, err, false)) // a panic: below
		if rec := recover(); rec != nil {
			slot.Release(time.Since(start), true)
			panic(rec)
		}
		slot.Release(time.Since(start), failed)
	}()
	return h.serveAdmitted(sw, r, next, st)
}

// overloadAnswer says whether status is what an overloaded upstream, or
// the proxy in front of it, answers: 429, 502, 503 or 504. A 500 is the
// application's own failure, and says nothing of the load.
func overloadAnswer(status int) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// tierLabel is tier as a metric label: a weighted tier, else "other".
func (p *protection) tierLabel(tier string) string {
	if p.tiers[tier] {
		return tier
	}
	return "other"
}

// shed answers a request the protection shed.
func (h *Server) shed(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, st *requestState, tenant, tier, reason string) error {
	p := h.protection
	if len(st.items) > 0 && st.decision.Admitted {
		back := st.back[:0]
		for range st.items {
			back = append(back, true)
		}
		st.back = back
		if err := h.gate.Store.GiveBack(context.WithoutCancel(r.Context()), &st.decision, st.back); err != nil {
			h.logger.Error("giving back the units of a shed request", zap.Error(err))
		}
	}
	if h.metrics != nil {
		metrics.RecordShed(reason)
	}
	secs := retryAfterSeconds(p.retryAfter)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	setExceeded(r, repl, "protect", secs)
	if ce := h.logger.Check(zapcore.InfoLevel, "request shed"); ce != nil {
		ce.Write(zap.String("reason", reason), zap.String("tenant", gate.Loggable(tenant)), zap.String("tier", p.tierLabel(tier)),
			zap.Int("limit", p.limiter.Stats().Limit), zap.Int64("retry_after", secs))
	}
	return caddyhttp.Error(p.status, fmt.Errorf("upstream overloaded: request shed (%s)", reason))
}
