package surface

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/metrics"
)

// Draining: a metered response goes on being read after its client went
// away, so that the usage the upstream reports at its end (the last event
// of an LLM stream) is charged. A metered request is passed on with a
// context that the client's departure does not cancel, so the upstream
// request goes on; once the client is gone, the meteredWriter reads what
// the upstream sends without writing it anywhere, until the response ends
// or a bound is reached (time since the client left, bytes read since,
// responses draining at once on this handler: config.DrainConfig). At a
// bound the upstream request is cancelled, as it would have been without
// draining, and the response is charged what was seen (see cost_missing).

// errDrainCut cancels an upstream request whose drain reached a bound.
var errDrainCut = errors.New("rate_limit: client gone and the metered response's drain reached its bound")

// drainer holds a handler's drain slots.
type drainer struct {
	slots   chan struct{}
	timeout time.Duration
	// maxBytes is read by Write on the request's goroutine.
	maxBytes int64
	metrics  *metrics.Handler
}

// newDrainer returns the drainer of cfg, or nil with `drain off`.
func newDrainer(cfg *config.Handler, m *metrics.Handler) *drainer {
	timeout, maxBytes, maxConcurrent, off := cfg.DrainBounds()
	if off {
		return nil
	}
	return &drainer{slots: make(chan struct{}, maxConcurrent), timeout: timeout, maxBytes: maxBytes, metrics: m}
}

// drain follows one metered request: whether its client is gone, and the
// bounds of reading on without it.
type drain struct {
	d *drainer
	// ctx is the context the request is passed on with: not cancelled
	// when the client goes, only by cut or end.
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   func() bool
	// gone is set once the client is gone and the response is being
	// drained (a slot is held).
	gone atomic.Bool
	// read counts the bytes read since (request goroutine only).
	read int64

	mu    sync.Mutex
	ended bool
	slot  bool
	cut   bool
	timer *time.Timer
}

// watch starts following r; end it when the chain has returned. A nil
// drainer (drain off) follows nothing: the request keeps its context.
func (d *drainer) watch(r *http.Request) *drain {
	if d == nil {
		return nil
	}
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(r.Context()))
	dr := &drain{d: d, ctx: ctx, cancel: cancel}
	dr.stop = context.AfterFunc(r.Context(), dr.clientGone)
	return dr
}

// clientGone starts draining, if a slot is free; else it cancels the
// upstream request as if there were no draining. It is called once the
// client's context is done, or when writing to the client failed.
func (dr *drain) clientGone() {
	dr.mu.Lock()
	defer dr.mu.Unlock()
	if dr.ended || dr.slot || dr.cut {
		return
	}
	select {
	case dr.d.slots <- struct{}{}:
	default:
		dr.cutLocked(metrics.DrainRefused)
		return
	}
	dr.slot = true
	dr.gone.Store(true)
	dr.d.count(metrics.DrainStarted)
	dr.timer = time.AfterFunc(dr.d.timeout, func() {
		dr.mu.Lock()
		defer dr.mu.Unlock()
		if !dr.ended {
			dr.cutLocked(metrics.DrainCutTime)
		}
	})
}

// readGone counts n bytes read without a client, and cuts the drain
// (reporting false) past its byte bound.
func (dr *drain) readGone(n int) bool {
	dr.read += int64(n)
	if dr.read <= dr.d.maxBytes {
		return true
	}
	dr.mu.Lock()
	defer dr.mu.Unlock()
	dr.cutLocked(metrics.DrainCutBytes)
	return false
}

// cutLocked cancels the upstream request; event says why.
func (dr *drain) cutLocked(event string) {
	if dr.cut {
		return
	}
	dr.cut = true
	dr.cancel(errDrainCut)
	dr.d.count(event)
}

// isCut reports whether the drain was cut (or refused).
func (dr *drain) isCut() bool {
	if dr == nil {
		return false
	}
	dr.mu.Lock()
	defer dr.mu.Unlock()
	return dr.cut
}

// end stops following the request once the chain has returned, and gives
// its slot back.
func (dr *drain) end() {
	if dr == nil {
		return
	}
	dr.stop()
	dr.mu.Lock()
	dr.ended = true
	if dr.timer != nil {
		dr.timer.Stop()
	}
	if dr.slot {
		<-dr.d.slots
		if !dr.cut {
			dr.d.count(metrics.DrainCompleted)
		}
	}
	dr.mu.Unlock()
	dr.cancel(context.Canceled)
}

func (d *drainer) count(event string) {
	if d.metrics != nil {
		d.metrics.Drain(event)
	}
}
