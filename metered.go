package tollgate

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

	"github.com/tollgate/caddy-tollgate/internal/usage"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// Metered costs (cost_after): a policy whose requests cost what their
// response says, e.g. LLM tokens. The request is admitted on its up-front
// cost; the response streams to the client through a meteredWriter, which
// reads the real cost from a header or trailer, or from the JSON numbers
// of the body as it passes (never holding the body); once the rest of the
// chain has returned, the difference is settled on the same buckets
// (limiter.Decision.Settle), into debt if need be.

// CostAfterConfig says where a metered policy reads a request's real cost
// from its response. Exactly one of header and json is set.
type CostAfterConfig struct {
	// The response header, or trailer, that carries the real cost: a
	// non-negative integer, e.g. `X-Tokens-Used`. A trailer wins over a
	// header of the same name.
	Header string `json:"header,omitempty"`

	// The JSON numbers of the response body whose sum is the real cost:
	// dot-separated paths of object keys from the top-level object,
	// joined with `+`, e.g. `usage.total_tokens` or
	// `usage.prompt_tokens+usage.completion_tokens`. Read from an
	// application/json (or +json) body, or from each `data:` event of a
	// text/event-stream body, the last value seen for each path counting.
	// Fractions are rounded up. A compressed body, or one of another type,
	// is not read.
	JSON string `json:"json,omitempty"`
}

// costAfterForms is what the error messages offer.
const costAfterForms = "cost_after header <Name> | cost_after json <path>[+<path>...]"

// checkCostAfter checks the cost_after of a policy at path, whose
// algorithm is alg and up-front cost c, and compiles it.
func checkCostAfter(path []string, ca *CostAfterConfig, alg limiter.Algorithm, c Cost) (*meter, error) {
	if ca == nil {
		return nil, nil
	}
	switch {
	case ca.Header == "" && ca.JSON == "":
		return nil, at(path, "set header or json (%s)", costAfterForms)
	case ca.Header != "" && ca.JSON != "":
		return nil, at(path, "header and json exclude each other (%s)", costAfterForms)
	case alg == limiter.Concurrency:
		return nil, at(path, "not with algorithm concurrency, which counts requests in flight, not units (allowed: %s)", meteredAlgorithms)
	}
	if n, ok := c.constant(); ok && n == 0 {
		return nil, at(sub(path[:len(path)-1], "cost"), "0 with cost_after: a request must be charged at least 1 unit up front, or a tenant in debt is never refused")
	}
	if ca.Header != "" {
		if !validHeaderName(ca.Header) {
			return nil, at(sub(path, "header"), "%q: not a header name (letters, digits and !#$%%&'*+-.^_`|~)", ca.Header)
		}
		return &meter{header: http.CanonicalHeaderKey(ca.Header)}, nil
	}
	paths, err := usage.ParsePaths(ca.JSON)
	if err != nil {
		return nil, at(sub(path, "json"), "%q: %v", ca.JSON, err)
	}
	return &meter{paths: &paths}, nil
}

// meteredAlgorithms lists the algorithms cost_after works with.
const meteredAlgorithms = "token_bucket, gcra, sliding_window, fixed_window, sliding_log"

// validHeaderName reports whether s is an HTTP field name (RFC 9110 token).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// meter is a compiled cost_after: header is the canonical header name, or
// paths the JSON paths.
type meter struct {
	header string
	paths  *usage.Paths
}

// sameMeter returns the meter of one of policies that reads what m reads,
// else m: policies that read the same cost share one meter, so a response
// is read once for all of them (e.g. tokens per minute and per day).
func sameMeter(policies []*policyRuntime, m *meter) *meter {
	if m == nil {
		return nil
	}
	for _, p := range policies {
		if o := p.meter; o != nil && o.header == m.header && (o.paths == nil) == (m.paths == nil) &&
			(o.paths == nil || o.paths.String() == m.paths.String()) {
			return o
		}
	}
	return m
}

// parseCostAfter reads `cost_after header <Name>` or `cost_after json
// <path>[+<path>...]`.
func (p cfParser) costAfter() (*CostAfterConfig, error) {
	args, err := p.args(2, -1)
	if err != nil {
		return nil, err
	}
	switch {
	case args[0] == "header" && len(args) == 2:
		return &CostAfterConfig{Header: args[1]}, nil
	case args[0] == "json":
		// "usage.a + usage.b" arrives as three arguments.
		return &CostAfterConfig{JSON: strings.Join(args[1:], " ")}, nil
	case args[0] == "header":
		return nil, p.dirErr("wrong number of arguments (%d); usage: %s", len(args), costAfterForms)
	}
	return nil, p.dirErr("%q: unknown source (allowed: header, json); usage: %s", args[0], costAfterForms)
}

// Why a metered request was charged only its up-front cost.
const (
	missingNoValue    = "no value"       // the header, trailer or paths were absent or invalid
	missingCompressed = "compressed"     // a Content-Encoding other than identity
	missingNotJSON    = "not json"       // a body of another media type
	missingNoResponse = "no response"    // the chain wrote nothing (an error is answered later)
	missingBodiless   = "no body"        // HEAD, 204, 304 or an upgrade: no body to read
	missingBadNumber  = "invalid number" // the header is not a non-negative integer
)

// meteredWriter passes a response through unchanged and reads its real
// cost on the way: the header values when it is written, and the body,
// chunk by chunk after each chunk went on to the client, through one
// extractor per JSON meter.
type meteredWriter struct {
	http.ResponseWriter
	// meters are the request's metered policies (nil for the others),
	// by verdict.
	meters []*meter
	// ex has an extractor per distinct JSON meter (policies reading the
	// same paths share one), exOf the index in ex of each verdict's; scan
	// is set once the header says the body can be read (else skip says
	// why not).
	ex          []usage.Extractor
	exOf        []int
	wroteHeader bool
	scan        bool
	skip        string
	// bodiless: the response has no body by definition (HEAD, 204, 304)
	// or switched protocols: no cost is expected from it.
	bodiless bool
	// headers holds, per verdict, the value of its meter's header when
	// the response header was written.
	headers []string
}

// reset prepares w for a response to rw with meters.
func (w *meteredWriter) reset(rw http.ResponseWriter, meters []*meter) {
	w.ResponseWriter = rw
	w.meters = meters
	w.wroteHeader, w.scan, w.skip, w.bodiless = false, false, "", false
	w.headers = w.headers[:0]
	for range meters {
		w.headers = append(w.headers, "")
	}
	w.exOf = w.exOf[:0]
	n := 0
	for i, m := range meters {
		k := -1
		if m != nil && m.paths != nil {
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
	w.ResponseWriter = nil
	w.meters = nil
	clear(w.headers)
}

// WriteHeader notes the header values and whether the body can be read.
func (w *meteredWriter) WriteHeader(status int) {
	switch {
	case w.wroteHeader:
	case status == http.StatusSwitchingProtocols:
		w.bodiless = true
	case status >= 200:
		w.wroteHeader = true
		w.bodiless = w.bodiless || status == http.StatusNoContent || status == http.StatusNotModified
		w.inspect()
	}
	w.ResponseWriter.WriteHeader(status)
}

// inspect reads the header meters and decides how to read the body.
func (w *meteredWriter) inspect() {
	hdr := w.ResponseWriter.Header()
	for i, m := range w.meters {
		if m != nil && m.header != "" {
			w.headers[i] = hdr.Get(m.header)
		}
	}
	if len(w.ex) == 0 {
		return
	}
	if enc := hdr.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		w.skip = missingCompressed
		return
	}
	format := bodyFormat(hdr.Get("Content-Type"))
	if format == 0 {
		w.skip = missingNotJSON
		return
	}
	for i, k := range w.exOf {
		if k >= 0 {
			w.ex[k].Reset(w.meters[i].paths, format) // a shared one again: harmless
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

// Write passes p on, then reads what was written.
func (w *meteredWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	n, err := w.ResponseWriter.Write(p)
	if w.scan && n > 0 {
		for k := range w.ex {
			w.ex[k].Write(p[:n])
		}
	}
	return n, err
}

// Unwrap returns the writer underneath (http.ResponseController).
func (w *meteredWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ReadFrom copies r through Write: the wrapped writer's ReadFrom would
// bypass the reading.
func (w *meteredWriter) ReadFrom(r io.Reader) (int64, error) {
	if w.wroteHeader && !w.scan {
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
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// cost returns the real cost the response reported for verdict i, or
// limiter.NotMetered and why not.
func (w *meteredWriter) cost(i int) (int64, string) {
	m := w.meters[i]
	if !w.wroteHeader {
		return limiter.NotMetered, missingNoResponse
	}
	if w.bodiless && m.header == "" {
		return limiter.NotMetered, missingBodiless
	}
	if m.header != "" {
		hdr := w.ResponseWriter.Header()
		v := hdr.Get(http.TrailerPrefix + m.header)
		if v == "" {
			v = hdr.Get(m.header) // an announced trailer, or the header
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
	if n, ok := w.ex[w.exOf[i]].Cost(); ok {
		return n, ""
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
// panicked: reverse_proxy aborts a response whose client went away with
// http.ErrAbortHandler, and that request is charged what it saw too.
func (h *Handler) serveMetered(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, st *requestState) error {
	mw := &st.writer
	mw.reset(w, st.meters)
	mw.bodiless = r.Method == http.MethodHead
	defer func() {
		h.settle(r, st, mw)
		mw.release()
	}()
	return next.ServeHTTP(mw, r)
}

// settle charges the real costs the response reported. The request's
// context may be cancelled (client gone): the store calls have their own
// deadlines.
func (h *Handler) settle(r *http.Request, st *requestState, mw *meteredWriter) {
	real := st.real[:0]
	for i, m := range st.meters {
		if m == nil {
			real = append(real, limiter.NotMetered)
			continue
		}
		n, why := mw.cost(i)
		if n < 0 {
			// Charged only the up-front cost.
			p := st.policies[i]
			if why != missingNoResponse && why != missingBodiless && h.metrics != nil {
				p.metrics.costMissing.Inc()
			}
			if ce := h.logger.Check(zapcore.DebugLevel, "metered cost missing; charged the up-front cost only"); ce != nil {
				ce.Write(zap.String("policy", p.name), zap.String("reason", why), zap.Int64("cost", st.items[i].Cost))
			}
		}
		real = append(real, n)
	}
	st.real = real
	ctx := context.WithoutCancel(r.Context())
	var err error
	if h.stack != nil {
		err = h.stack.Settle(ctx, &st.decision, real)
	} else {
		err = st.decision.Settle(ctx, limiter.Fallback{}, real)
	}
	if err != nil {
		h.settleFailed(err)
	}
}

// settleFailed reports a settlement the store could not take. A store
// failure was settled on the fallback store (Decision.Settle); it is not
// worth more than a debug line per response.
func (h *Handler) settleFailed(err error) {
	if ce := h.logger.Check(zapcore.DebugLevel, "settling a metered cost failed"); ce != nil {
		ce.Write(zap.Error(err))
	}
}
