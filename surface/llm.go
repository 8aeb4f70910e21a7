package surface

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/internal/llm"
	"github.com/tollgate/caddy-tollgate/internal/usage"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// The cost_after presets (openai, anthropic) and cost_before read the
// request body before the decision: its model prices the answer,
// cost_before takes the up-front cost from it, and a streamed OpenAI-style
// chat or completions request that did not ask for its usage is made to
// (stream_options.include_usage), so that a client cannot stream an
// answer for free; what that adds to the stream is taken out again on the
// way back (llm.UsageStripper). The body is read up to maxLLMBody: a
// larger one is refused with 413 before the decision (unread, it could not
// be priced nor reserved); one that is not a JSON object (a multipart
// upload) passes on untouched; caddy_rate_limit_llm_requests_total counts
// each case.

// maxLLMBody is the most of a request body read for a preset.
const maxLLMBody = 4 << 20

// maxLLMBodies bounds the bytes of the preset request bodies this process
// holds at once, every handler's together: each body is held until its
// request ends, so without a bound a client opening many connections
// would make the process hold 4 MiB per connection. A request whose body
// would take it over is refused with 503 and Retry-After: 1
// (llm_requests_total's "busy").
const maxLLMBodies = 256 << 20

// llmBodies is the bytes of preset request bodies held (maxLLMBodies).
var llmBodies atomic.Int64

// budgetReader reads r, counting what it read in llmBodies (n); once
// that would pass maxLLMBodies it stops with errLLMBusy.
type budgetReader struct {
	r io.Reader
	n int64
}

var errLLMBusy = errors.New("request bodies of metered LLM requests take all the memory allowed them")

func (b *budgetReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if n > 0 {
		if llmBodies.Add(int64(n)) > maxLLMBodies {
			llmBodies.Add(-int64(n))
			return 0, errLLMBusy
		}
		b.n += int64(n)
	}
	return n, err
}

// Results of reading an LLM request (llm_requests_total's result).
const (
	llmRead           = "read"            // read: its model is known
	llmUsageRequested = "usage_requested" // read, and include_usage was set for the client
	llmTooLarge       = "too_large"       // larger than maxLLMBody: refused with 413
	llmNotJSON        = "not_json"        // not a JSON object: passed on untouched
	llmNotUTF8        = "not_utf8"        // JSON in UTF-16 or UTF-32: refused with 400
	llmBusy           = "busy"            // the bodies held take maxLLMBodies: refused with 503
	llmNoBody         = "no_body"         // no body at all
)

// utf8BOM is the byte order mark some clients put before UTF-8 JSON.
var utf8BOM = []byte("\xef\xbb\xbf")

// wideJSON reports whether body, of media type ct (JSON, or none), looks
// like JSON in UTF-16 or UTF-32, as Python's json (which the
// OpenAI-compatible servers written in it read bodies with) tells them:
// a UTF-16 byte order mark, or a NUL among the first two bytes.
func wideJSON(body []byte, ct string) bool {
	if ct != "" && bodyFormat(ct) != usage.JSON {
		return false // a multipart or binary upload
	}
	return bytes.HasPrefix(body, []byte("\xfe\xff")) || bytes.HasPrefix(body, []byte("\xff\xfe")) ||
		(len(body) >= 2 && (body[0] == 0 || body[1] == 0))
}

// preset returns the first preset among the request's meters.
func (st *requestState) preset() llm.Provider {
	for _, m := range st.meters {
		if m != nil && m.Preset != 0 {
			return m.Preset
		}
	}
	return 0
}

// readRequestBody reads r's body for the policies of st that need it:
// for OpenAI, it asks for the usage of a streamed answer; cost_before
// costs are taken from it. It returns the error that refuses the request
// (w gets its Retry-After) for a body too large (413), in UTF-16 or
// UTF-32 (400), or beyond what the process holds of such bodies (503),
// and for a model that a price table of st cannot price (400).
func (h *Server) readRequestBody(w http.ResponseWriter, r *http.Request, st *requestState) error {
	result := h.inspectLLMRequest(r, st, st.preset())
	if h.metrics != nil {
		h.metrics.LLMRequest(result)
	}
	switch result {
	case llmTooLarge:
		// Unread, it would be priced, reserved and streamed without its
		// usage as the client pleases (padding a body costs no tokens).
		return caddyhttp.Error(http.StatusRequestEntityTooLarge,
			fmt.Errorf("request body over %d bytes: a metered LLM request is read whole to be priced", maxLLMBody))
	case llmBusy:
		// Held until their requests end, the bodies being read would
		// otherwise grow this process's memory without bound.
		w.Header().Set("Retry-After", "1")
		return caddyhttp.Error(http.StatusServiceUnavailable, errLLMBusy)
	case llmNotUTF8:
		// A lenient upstream would read it, model, stream and all, where
		// Tollgate could not: it would escape its price and its usage.
		return caddyhttp.Error(http.StatusBadRequest,
			errors.New("request body in UTF-16 or UTF-32: a metered LLM request's JSON must be UTF-8 (RFC 8259)"))
	}
	for i, m := range st.meters {
		if m == nil || m.Prices == nil || st.noBody {
			continue
		}
		if len(st.model) > llm.MaxModel {
			return caddyhttp.Error(http.StatusBadRequest,
				fmt.Errorf("model name of %d bytes: policy %s prices names of at most %d", len(st.model), st.policies[i].Name, llm.MaxModel))
		}
		if _, ok := m.Prices.Lookup(st.model); !ok {
			return caddyhttp.Error(http.StatusBadRequest,
				fmt.Errorf("model %q has no price in policy %s (and no default price \"*\")", st.model, st.policies[i].Name))
		}
	}
	for i, p := range st.policies {
		if p.costBefore != nil {
			st.items[i].Cost = upFrontCost(p, st, st.items[i].Cost)
		}
	}
	return nil
}

// upFrontCost is the up-front cost cost_before reads from the request
// body, or fallback when the body has none of its values.
func upFrontCost(p *policyRuntime, st *requestState, fallback int64) int64 {
	cb := p.costBefore
	var out, in int64
	found := false
	if cb.Paths != nil && st.body != nil {
		var e usage.Extractor
		e.Reset(cb.Paths, usage.JSON)
		e.Write(st.body)
		out, found = e.Cost()
	}
	if cb.PromptEstimate && st.bodyLen >= 0 {
		in, found = (st.bodyLen+3)/4, true
	}
	if !found {
		return fallback
	}
	n := priceTokens(p.meter, llm.Tokens{Input: in, Output: out}, st.model)
	return min(max(n, 1), limiter.MaxCount)
}

func (h *Server) inspectLLMRequest(r *http.Request, st *requestState, preset llm.Provider) string {
	if windowMemory.Load() > maxWindowMemory-windowHeadroom {
		// Windows nearly all taken: an answer in zstd or br could not be
		// read, so the upstream is asked for gzip (or nothing) instead.
		onlyGzip(r.Header)
	}
	if r.Body == nil || r.Body == http.NoBody {
		st.noBody = true
		return llmNoBody
	}
	orig := r.Body
	br := &budgetReader{r: io.LimitReader(orig, maxLLMBody+1)}
	body, err := io.ReadAll(br)
	st.llmHeld = br.n // given back when the request ends (putRequestState)
	// What was read goes on first, whatever happens next.
	restore := func(b []byte) {
		r.Body = bodyReadCloser{Reader: io.MultiReader(bytes.NewReader(b), orig), Closer: orig}
	}
	if errors.Is(err, errLLMBusy) {
		restore(body)
		return llmBusy
	}
	if err != nil || len(body) > maxLLMBody {
		restore(body)
		return llmTooLarge
	}
	st.bodyLen, st.body = int64(len(body)), body
	if len(body) == 0 {
		restore(body)
		st.noBody = true
		return llmNoBody
	}
	req, ok := llm.ParseRequest(body)
	if !ok && bytes.HasPrefix(body, utf8BOM) {
		// JSON after a UTF-8 byte order mark, which Python's json skips:
		// read, and passed on without the mark.
		if req, ok = llm.ParseRequest(body[len(utf8BOM):]); ok {
			body = body[len(utf8BOM):]
			st.bodyLen, st.body = int64(len(body)), body
		}
	}
	if !ok {
		restore(body)
		if wideJSON(body, r.Header.Get("Content-Type")) {
			return llmNotUTF8
		}
		return llmNotJSON
	}
	st.model = req.Model
	result := llmRead
	if preset == llm.OpenAI && req.Stream && !req.IncludeUsage && llm.AsksUsage(r.URL.Path) {
		if b, ok := llm.WithUsage(body); ok {
			body, st.strip, result = b, true, llmUsageRequested
			st.llmHeld += int64(len(b)) // a copy, held beside the original
			llmBodies.Add(int64(len(b)))
			// The usage chunk is taken out of the stream on the way
			// back, which a compressed stream would not allow.
			r.Header.Del("Accept-Encoding")
		}
	}
	r.Body = bodyReadCloser{Reader: bytes.NewReader(body), Closer: orig}
	r.ContentLength = int64(len(body))
	if r.Header.Get("Content-Length") != "" {
		// What a transport that reads the header (fastcgi) sends.
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	}
	r.TransferEncoding = nil
	r.GetBody = nil
	return result
}

// windowHeadroom is the room left for decoder windows under which a
// preset request asks its upstream for gzip only: a 16 MiB brotli window
// and an 8 MiB zstd one still fit.
const windowHeadroom = 24 << 20

// onlyGzip keeps gzip (whose decoder needs no window budget) as the only
// compression h accepts.
func onlyGzip(h http.Header) {
	ae := h.Get("Accept-Encoding")
	if ae == "" {
		return
	}
	for _, coding := range strings.Split(ae, ",") {
		name, _, _ := strings.Cut(strings.TrimSpace(coding), ";")
		if strings.EqualFold(name, "gzip") {
			h.Set("Accept-Encoding", "gzip")
			return
		}
	}
	h.Del("Accept-Encoding")
}

// bodyReadCloser is a request body read (partly) ahead: its Reader
// starts with what was read, and Close closes the original body.
type bodyReadCloser struct {
	io.Reader
	io.Closer
}

// priceTokens is the cost of t under m's prices for model, or their total.
func priceTokens(m *config.Meter, t llm.Tokens, model string) int64 {
	if p, ok := m.Prices.Lookup(model); ok {
		return p.Cost(t)
	}
	return t.Total()
}
