package surface

import (
	"bufio"
	"context"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/internal/llm"
	"github.com/tollgate/caddy-tollgate/internal/usage"
	"github.com/tollgate/caddy-tollgate/limiter"
	"github.com/tollgate/caddy-tollgate/metrics"
)

// Metered costs (cost_after): a policy whose requests cost what their
// response says, e.g. LLM tokens. The request is admitted on its up-front
// cost; the response streams to the client through a meteredWriter, which
// reads the real cost from a header or trailer, or from the JSON numbers
// of the body as it passes (never holding the body); once the rest of the
// chain has returned, the difference is settled on the same buckets
// (limiter.Decision.Settle), into debt if need be.

// sameMeter returns the meter of one of policies that reads what m reads,
// else m: policies that read the same cost share one meter, so a response
// is read once for all of them (e.g. tokens per minute and per day).
func sameMeter(policies []*policyRuntime, m *config.Meter) *config.Meter {
	if m == nil {
		return nil
	}
	for _, p := range policies {
		if o := p.meter; o != nil && o.Header == m.Header && o.Missing == m.Missing && o.Preset == m.Preset && o.Prices == m.Prices && (o.Paths == nil) == (m.Paths == nil) &&
			(o.Paths == nil || o.Paths.String() == m.Paths.String()) {
			return o
		}
	}
	return m
}

// Why a metered response gave no cost: the reason label of
// caddy_rate_limit_cost_missing_total and of the debug log line.
const (
	missingNoValue    = metrics.CostNoValue
	missingCompressed = metrics.CostCompressed
	missingNotJSON    = metrics.CostNotJSON
	missingBadNumber  = metrics.CostInvalidNumber
	missingClientGone = metrics.CostClientGone
	// Not counted as missing: no cost was expected.
	missingNoResponse = "no_response" // the chain wrote nothing (an error is answered later)
	missingBodiless   = "no_body"     // HEAD, 204, 304 or an upgrade: no body to read
	missingFailed     = "failed"      // a 4xx or 5xx answer without a cost: the work was not done
)

// meteredWriter passes a response through unchanged and reads its real
// cost on the way: the header values when it is written, and the body,
// chunk by chunk after each chunk went on to the client, through one
// extractor per JSON meter.
type meteredWriter struct {
	http.ResponseWriter
	// meters are the request's metered policies (nil for the others),
	// by verdict.
	meters []*config.Meter
	// ex has an extractor per distinct JSON meter (policies reading the
	// same paths share one), exOf the index in ex of each verdict's; scan
	// is set once the header says the body can be read (else skip says
	// why not).
	ex          []usage.Extractor
	exOf        []int
	wroteHeader bool
	status      int
	scan        bool
	skip        string
	// bodiless: the response has no body by definition (HEAD, 204, 304)
	// or switched protocols: no cost is expected from it.
	bodiless bool
	// side decodes a compressed body for the extractors (nil when the
	// body is not compressed); sideErr says why it stopped early.
	side    *sideDecoder
	sideErr error
	// model is the request's model (preset prices); stripReq: take out
	// of an event stream what include_usage added (stripping once the
	// header says the body is one).
	model     string
	stripReq  bool
	stripping bool
	stripper  llm.UsageStripper
	// text counts the generated text of the body when some meter charges
	// an estimate for a missing cost (estimate is set).
	text     usage.TextCounter
	estimate bool
	// drain follows the client: once it is gone, the body is read
	// without being written (see drain.go). clientLeft: it went away
	// while nothing drained (drain off).
	drain      *drain
	clientLeft bool
	// headers holds, per verdict, the value of its meter's header when
	// the response header was written.
	headers []string
}

// reset prepares w for a response to rw with meters.
func (w *meteredWriter) reset(rw http.ResponseWriter, meters []*config.Meter) {
	w.ResponseWriter = rw
	w.meters = meters
	w.wroteHeader, w.scan, w.skip, w.bodiless, w.status = false, false, "", false, 0
	w.side, w.sideErr, w.drain, w.clientLeft = nil, nil, nil, false
	w.model, w.stripReq, w.stripping = "", false, false
	w.text.Reset()
	w.estimate = false
	for _, m := range meters {
		w.estimate = w.estimate || (m != nil && m.Missing == config.MissingEstimate)
	}
	w.headers = w.headers[:0]
	for range meters {
		w.headers = append(w.headers, "")
	}
	w.exOf = w.exOf[:0]
	n := 0
	for i, m := range meters {
		k := -1
		if m != nil && m.Paths != nil {
			for j := range i {
				if meters[j] == m {
					k = w.exOf[j]
					break
				}
			}
			if k < 0 {
				k = n
				n++
			}
		}
		w.exOf = append(w.exOf, k)
	}
	if cap(w.ex) < n {
		w.ex = make([]usage.Extractor, n)
	}
	w.ex = w.ex[:n]
}

// release drops the references to the request before pooling.
func (w *meteredWriter) release() {
	w.finishBody()
	w.ResponseWriter = nil
	w.meters = nil
	w.drain = nil
	clear(w.headers)
}

// WriteHeader notes the header values and whether the body can be read.
func (w *meteredWriter) WriteHeader(status int) {
	switch {
	case w.wroteHeader:
	case status == http.StatusSwitchingProtocols:
		w.bodiless = true
		if w.status == 0 {
			w.status = status // an upgrade, for outcomes
		}
	case status >= 200:
		w.wroteHeader, w.status = true, status
		w.bodiless = w.bodiless || status == http.StatusNoContent || status == http.StatusNotModified
		w.inspect()
	}
	w.ResponseWriter.WriteHeader(status)
}

// inspect reads the header meters and decides how to read the body.
func (w *meteredWriter) inspect() {
	hdr := w.ResponseWriter.Header()
	for i, m := range w.meters {
		if m != nil && m.Header != "" {
			w.headers[i] = hdr.Get(m.Header)
		}
	}
	if len(w.ex) == 0 && !w.estimate {
		return
	}
	enc := hdr.Get("Content-Encoding")
	compressed := enc != "" && !strings.EqualFold(enc, "identity")
	if compressed && !sideDecodable(enc) {
		w.skip = missingCompressed
		return
	}
	format := bodyFormat(hdr.Get("Content-Type"))
	if format == 0 {
		w.skip = missingNotJSON
		return
	}
	if compressed {
		w.side = startSideDecoder(enc, w.feed)
	}
	if w.stripReq && format == usage.SSE && !compressed && hdr.Get("Content-Length") == "" {
		w.stripping = true
		w.stripper.Reset(w.ResponseWriter)
	}
	for i, k := range w.exOf {
		if k >= 0 {
			w.ex[k].Reset(w.meters[i].Paths, format) // a shared one again: harmless
		}
	}
	w.scan = true
}

// bodyFormat tells how a body of media type ct is read; 0 when it is not.
func bodyFormat(ct string) usage.Format {
	mt := ct
	if i := strings.IndexByte(mt, ';'); i >= 0 {
		mt = mt[:i]
	}
	mt = strings.ToLower(strings.TrimSpace(mt))
	switch {
	case mt == "application/json", strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"):
		return usage.JSON
	case mt == "text/event-stream":
		return usage.SSE
	}
	return 0
}

// Write passes p on, then reads what was written. Once the client is
// gone, p is read without being written, within the drain's bounds.
func (w *meteredWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	dr := w.drain
	if dr != nil && dr.gone.Load() {
		return w.drained(p, 0)
	}
	n, err := w.clientWrite(p)
	if err != nil && dr != nil {
		// The client is gone, though its context may not say so yet.
		dr.clientGone()
		if dr.gone.Load() {
			w.read(p[:n])
			return w.drained(p, n)
		}
	}
	w.read(p[:n])
	return n, err
}

// clientWrite writes p to the client, through the stripper if need be.
func (w *meteredWriter) clientWrite(p []byte) (int, error) {
	if w.stripping {
		return w.stripper.Write(p)
	}
	return w.ResponseWriter.Write(p)
}

// finishStripping writes what the stripper holds (an unfinished last
// event), once the chain has returned.
func (w *meteredWriter) finishStripping() {
	if w.stripping {
		w.stripping = false
		if w.drain == nil || !w.drain.gone.Load() {
			_ = w.stripper.Close()
		}
		w.stripper.Reset(nil)
	}
}

// drained reads p[n:] for a client that is gone, as if written.
func (w *meteredWriter) drained(p []byte, n int) (int, error) {
	if !w.drain.readGone(len(p) - n) {
		return n, errDrainCut
	}
	w.read(p[n:])
	return len(p), nil
}

// read passes the next bytes of the body on to be read, if it is.
func (w *meteredWriter) read(p []byte) {
	if !w.scan || len(p) == 0 {
		return
	}
	if w.side != nil {
		w.side.Write(p)
	} else {
		w.feed(p)
	}
}

// feed passes the next bytes of the (decompressed) body to the extractors.
func (w *meteredWriter) feed(p []byte) {
	for k := range w.ex {
		w.ex[k].Write(p)
	}
	if w.estimate {
		w.text.Write(p)
	}
}

// finishBody waits until a compressed body's decoder has fed everything
// to the extractors (it runs in a goroutine of its own until then).
func (w *meteredWriter) finishBody() {
	if w.side != nil {
		w.sideErr = w.side.finish()
		w.side = nil
	}
}

// Unwrap returns the writer underneath (http.ResponseController).
func (w *meteredWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ReadFrom copies r through Write: the wrapped writer's ReadFrom would
// bypass the reading.
func (w *meteredWriter) ReadFrom(r io.Reader) (int64, error) {
	if w.wroteHeader && !w.scan && w.drain == nil {
		// Nothing to read on the way: let the writer below copy (sendfile).
		if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
			return rf.ReadFrom(r)
		}
	}
	return io.Copy(writerOnly{w}, r)
}

// Hijack takes over the connection (protocol upgrades).
func (w *meteredWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.bodiless = true
	if w.status == 0 {
		w.status = http.StatusSwitchingProtocols
	}
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// writerOnly hides every method but Write (io.Copy would call ReadFrom).
type writerOnly struct{ io.Writer }

// Flush sends what is buffered to the client (streaming responses).
func (w *meteredWriter) Flush() {
	_ = w.FlushError()
}

// FlushError is Flush for http.ResponseController.
func (w *meteredWriter) FlushError() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.drain != nil && w.drain.gone.Load() {
		return nil // nobody to flush to
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// cost returns the real cost the response reported for verdict i, or
// limiter.NotMetered and why not.
func (w *meteredWriter) cost(i int) (int64, string) {
	n, why := w.readCost(i)
	if n < 0 && w.status >= 400 && why != missingNoResponse && why != missingBodiless {
		why = missingFailed // the work was not done: no cost is expected
	}
	return n, why
}

// readCost is cost, whatever the status.
func (w *meteredWriter) readCost(i int) (int64, string) {
	m := w.meters[i]
	if !w.wroteHeader {
		return limiter.NotMetered, missingNoResponse
	}
	if w.bodiless && m.Header == "" {
		return limiter.NotMetered, missingBodiless
	}
	if m.Header != "" {
		hdr := w.ResponseWriter.Header()
		v := hdr.Get(http.TrailerPrefix + m.Header)
		if v == "" {
			v = hdr.Get(m.Header) // an announced trailer, or the header
		}
		if v == "" {
			v = w.headers[i]
		}
		if v == "" {
			return limiter.NotMetered, missingNoValue
		}
		return parseCostValue(v)
	}
	if !w.scan {
		return limiter.NotMetered, w.skip
	}
	ex := &w.ex[w.exOf[i]]
	if m.Preset != 0 {
		if t, ok := m.Preset.Tokens(ex); ok {
			return priceTokens(m, t, w.model), ""
		}
	} else if n, ok := ex.Cost(); ok {
		return n, ""
	}
	if w.sideErr != nil {
		return limiter.NotMetered, missingCompressed
	}
	if w.drain.isCut() || w.clientLeft {
		return limiter.NotMetered, missingClientGone
	}
	return limiter.NotMetered, missingNoValue
}

// parseCostValue parses a header's cost: a non-negative integer, clamped
// to limiter.MaxCount.
func parseCostValue(v string) (int64, string) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	switch {
	case err == nil && n >= 0:
		return min(n, limiter.MaxCount), ""
	case err != nil && n == math.MaxInt64:
		return limiter.MaxCount, "" // beyond an int64: clamped
	}
	return limiter.NotMetered, missingBadNumber
}

// serveMetered passes r on through a meteredWriter and settles the real
// costs of the metered policies once the chain has returned, or has
// panicked (reverse_proxy aborts a response it could not finish with
// http.ErrAbortHandler; that request is charged what was seen too). The
// request goes on with a context its client's departure does not cancel:
// the response is drained for its cost, within bounds (drain.go).
func (h *Server) serveMetered(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, st *requestState) (err error) {
	mw := &st.writer
	mw.reset(w, st.meters)
	mw.bodiless = r.Method == http.MethodHead
	mw.model, mw.stripReq = st.model, st.strip
	dr := h.drains.watch(r)
	mw.drain = dr
	defer func() {
		// A chain that panics (reverse_proxy aborting a response) is
		// settled too, and judged as a 500 (statusOf).
		p := recover()
		if p != nil {
			defer panic(p)
		}
		mw.finishStripping()
		dr.end()
		mw.clientLeft = dr == nil && r.Context().Err() != nil
		back := st.outcomes && st.markBack(statusOf(mw.status, err, p != nil))
		h.settle(r, st, mw, back)
		if back {
			h.giveBack(r, st)
		}
		mw.release()
	}()
	if dr != nil {
		r = r.WithContext(dr.ctx)
	}
	return next.ServeHTTP(mw, r)
}

// settle charges the real costs the response reported, but for the
// verdicts that give their units back (back: st.back is set, see
// markBack). The request's context may be cancelled (client gone): the
// store calls have their own deadlines.
func (h *Server) settle(r *http.Request, st *requestState, mw *meteredWriter, back bool) {
	mw.finishBody()
	real := st.real[:0]
	for i, m := range st.meters {
		if m == nil || (back && st.back[i]) {
			real = append(real, limiter.NotMetered)
			continue
		}
		if m.Preset != 0 && st.noBody {
			// A request without a body to an LLM API (listing models,
			// fetching a stored answer, which shows the usage its
			// generation reported and was charged then) generated
			// nothing: its up-front cost, not a missing one.
			real = append(real, limiter.NotMetered)
			continue
		}
		n, why := mw.cost(i)
		if n < 0 && why != missingNoResponse && why != missingBodiless && why != missingFailed {
			p := st.policies[i]
			if h.metrics != nil {
				h.metrics.CostMissing(p.index, why)
			}
			switch m.Missing {
			case config.MissingUpFront:
			case config.MissingEstimate:
				n = estimateCost(m, st, r, mw)
			default:
				n = m.Missing
			}
			if ce := h.logger.Check(zapcore.DebugLevel, "metered cost missing"); ce != nil {
				ce.Write(zap.String("policy", p.Name), zap.String("reason", why), zap.Int64("up_front", st.items[i].Cost), zap.Int64("charged", max(n, st.items[i].Cost)))
			}
		}
		real = append(real, n)
	}
	st.real = real
	ctx := context.WithoutCancel(r.Context())
	if err := h.gate.Store.Settle(ctx, &st.decision, real); err != nil {
		h.settleFailed(err)
	}
	h.noteSettle(st, real)
	traceSettle(r, st, real)
}

// estimateCost estimates what a response without a usage cost, in
// tokens (priced for a preset with prices): about 4 bytes of text per
// token, for the request's body (its prompt, as sent; 0 when its length
// is unknown) and for the text the response generated
// (internal/usage.TextCounter), rounded up, at least 1.
func estimateCost(m *config.Meter, st *requestState, r *http.Request, mw *meteredWriter) int64 {
	prompt := st.bodyLen
	if prompt < 0 {
		prompt = max(r.ContentLength, 0)
	}
	t := llm.Tokens{Input: (prompt + 3) / 4, Output: (mw.text.Bytes() + 3) / 4}
	return max(1, priceTokens(m, t, st.model))
}

// settleFailed reports a settlement the store could not take. A store
// failure was settled on the fallback store (Decision.Settle); it is not
// worth more than a debug line per response.
func (h *Server) settleFailed(err error) {
	if ce := h.logger.Check(zapcore.DebugLevel, "settling a metered cost failed"); ce != nil {
		ce.Write(zap.Error(err))
	}
}
