package surface

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// Outcomes (count_status, refund_status): a policy may keep a request's
// units only for some response statuses, or give them back for some. The
// request is admitted as usual (a tenant over the limit is refused before
// the work); once the rest of the chain has answered, the units of the
// policies whose outcome says so go back (limiter.Decision.GiveBack).

// statusOf is the status a request was answered with: the error's when
// the chain failed with one (basic_auth's 401 is an error that the
// server's error handling writes), a 500 when it panicked (reverse_proxy
// aborts a response whose upstream failed mid-body with
// http.ErrAbortHandler, whatever status it wrote), else what the writer
// saw (200 when nothing was written: net/http's default).
func statusOf(written int, err error, panicked bool) int {
	if panicked && err == nil {
		return http.StatusInternalServerError
	}
	if err != nil {
		var he caddyhttp.HandlerError
		if errors.As(err, &he) && he.StatusCode != 0 {
			return he.StatusCode
		}
		return http.StatusInternalServerError
	}
	if written == 0 {
		return http.StatusOK
	}
	return written
}

// giveBack gives back the units of the verdicts st.back marks (see
// markBack). The request's context may be cancelled (client gone): the
// store call has its own deadline.
func (h *Server) giveBack(r *http.Request, st *requestState) {
	if err := h.gate.Store.GiveBack(context.WithoutCancel(r.Context()), &st.decision, st.back); err != nil {
		h.logger.Error("giving back the units of a request whose outcome does not count", zap.Error(err))
	}
	h.noteGiveBack(st)
}

// markBack sets st.back: which verdicts give their units back after a
// response of status. It reports whether any does.
func (st *requestState) markBack(status int) bool {
	st.back = st.back[:0]
	some := false
	for _, p := range st.policies {
		b := p.outcome != nil && p.outcome.GivesBack(status)
		st.back = append(st.back, b)
		some = some || b
	}
	return some
}

// serveOutcome passes the request on and gives its units back when its
// outcome says so.
func (h *Server) serveOutcome(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, st *requestState) (err error) {
	sw := &st.status
	sw.ResponseWriter, sw.status = w, 0
	defer func() {
		// Deferred: a handler that panics (reverse_proxy aborting a
		// response) answered too, as a 500 (statusOf).
		p := recover()
		if p != nil {
			defer panic(p)
		}
		sw.ResponseWriter = nil
		if st.markBack(statusOf(sw.status, err, p != nil)) {
			h.giveBack(r, st)
		}
	}()
	return next.ServeHTTP(sw, r)
}

// statusWriter records the status of a response, for outcomes.
type statusWriter struct {
	http.ResponseWriter
	status int
}

// WriteHeader records the first final status.
func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 && status >= 200 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

// Write records the implicit 200 of a body written without a status.
func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap returns the writer underneath (http.ResponseController).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ReadFrom lets the writer below copy (sendfile) once the status is known.
func (w *statusWriter) ReadFrom(r io.Reader) (int64, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(writerOnly{w.ResponseWriter}, r)
}

// Flush sends what is buffered to the client (streaming responses).
func (w *statusWriter) Flush() {
	_ = w.FlushError()
}

// FlushError is Flush for http.ResponseController.
func (w *statusWriter) FlushError() error {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack takes over the connection (protocol upgrades: 101).
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.status == 0 {
		w.status = http.StatusSwitchingProtocols
	}
	return http.NewResponseController(w.ResponseWriter).Hijack()
}
