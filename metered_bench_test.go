package tollgate

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tollgate/caddy-tollgate/internal/caddyreq"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// Benchmarks of metered costs (cost_after) through the whole handler:
//
//	go test -run xxx -bench ServeHTTPMetered -benchmem -count 3 .
//
// Every case answers the same way: 30 tokens, 1 unit up front. The
// "unmetered" case is the same handler and response without cost_after;
// the difference is the cost of wrapping the writer, reading the cost and
// settling it. The next handlers allocate nothing of their own.

// meteredBenchTokens is the real cost every response reports.
const meteredBenchTokens = 30

// meteredBenchLimit never denies during a benchmark and refills slowly
// (31.7 units/s over 365 days), so a Peek right after a request sees the
// units it was charged, to the unit.
const meteredBenchLimit = 1_000_000_000

// meteredSmallJSON is a small completion with its usage.
var meteredSmallJSON = []byte(fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion","usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":%d}}`, meteredBenchTokens))

// meteredJSON is an OpenAI-style chat completion of about 1 KB, its usage
// at the end as OpenAI sends it.
var meteredJSON = func() []byte {
	content := strings.Repeat(`Lorem ipsum dolor sit amet, \"consectetur\" adipiscing elit, sed do {usage: 999}. `, 9)
	return []byte(fmt.Sprintf(`{"id":"chatcmpl-9xYz0123456789abcdef","object":"chat.completion","created":1718000000,"model":"gpt-4o-2024-05-13",`+
		`"choices":[{"index":0,"message":{"role":"assistant","content":"%s"},"logprobs":null,"finish_reason":"stop"}],`+
		`"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":%d},"system_fingerprint":"fp_0123456789"}`,
		content, meteredBenchTokens))
}()

// meteredSSE is a streamed completion: 6 events, the usage in the 5th.
var meteredSSE = [][]byte{
	[]byte("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"),
	[]byte("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n"),
	[]byte(": keep-alive\n\n"),
	[]byte("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world \\\"usage\\\": 999\"},\"finish_reason\":\"stop\"}]}\n\n"),
	[]byte(fmt.Sprintf("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":20,\"total_tokens\":%d}}\n\n", meteredBenchTokens)),
	[]byte("data: [DONE]\n\n"),
}

// Header values shared by every response, so that the next handlers do
// not allocate them.
var (
	meteredCTJSON  = []string{"application/json"}
	meteredCTSSE   = []string{"text/event-stream"}
	meteredXTokens = []string{fmt.Sprint(meteredBenchTokens)}
)

// meteredNext returns a next handler that answers with body (written in
// one Write per chunk, each flushed when flush is set), of content type
// ct, with the X-Tokens header when tokens is set.
func meteredNext(ct []string, tokens bool, flush bool, body ...[]byte) caddyhttp.Handler {
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		h := w.Header()
		h["Content-Type"] = ct
		if tokens {
			h["X-Tokens"] = meteredXTokens
		}
		w.WriteHeader(http.StatusOK)
		for _, chunk := range body {
			if _, err := w.Write(chunk); err != nil {
				return err
			}
			if flush {
				w.(http.Flusher).Flush()
			}
		}
		return nil
	})
}

// discardWriter is a ResponseWriter that keeps the header and drops the
// body (an httptest.ResponseRecorder would keep every body of the loop).
type discardWriter struct {
	h       http.Header
	status  int
	written int64
}

func newDiscardWriter() *discardWriter { return &discardWriter{h: make(http.Header)} }

func (w *discardWriter) Header() http.Header { return w.h }
func (w *discardWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}
func (w *discardWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.written += int64(len(p))
	return len(p), nil
}
func (w *discardWriter) Flush() {}

// reset prepares w for the next response (keeping the map).
func (w *discardWriter) reset() {
	clear(w.h)
	w.status, w.written = 0, 0
}

// meteredCase is one sub-benchmark: the policy's cost_after (JSON, "" for
// none) and the response.
type meteredCase struct {
	name      string
	costAfter string
	next      caddyhttp.Handler
	// body, when set, is POSTed to /v1/chat/completions (a preset reads
	// it).
	body []byte
}

// Request bodies of an OpenAI-style chat request, about 300 bytes:
// streamed with or without include_usage, and not streamed.
var (
	meteredChatBody = func(extra string) []byte {
		return []byte(`{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Tell me about rate limiting in one paragraph, please, with an example."}],"temperature":0.7` + extra + `}`)
	}
	meteredBodyJSON   = meteredChatBody("")
	meteredBodyAsked  = meteredChatBody(`,"stream":true,"stream_options":{"include_usage":true}`)
	meteredBodyStream = meteredChatBody(`,"stream":true`)
)

// meteredSSEAsked is meteredSSE as OpenAI sends it to a request that
// asked for usage: "usage":null on every chunk.
var meteredSSEAsked = func() [][]byte {
	out := make([][]byte, len(meteredSSE))
	for i, ev := range meteredSSE {
		s := string(ev)
		if strings.HasPrefix(s, "data: {") && !strings.Contains(s, `"usage":{`) {
			s = strings.TrimSuffix(s, "}\n\n") + `,"usage":null}` + "\n\n"
		}
		out[i] = []byte(s)
	}
	return out
}()

// request returns the benchmark's request of mc for tenant.
func (mc meteredCase) request(w http.ResponseWriter, tenant string) *http.Request {
	r := caddyreq.New(w, tenant)
	if mc.body != nil {
		r.Method, r.URL.Path = http.MethodPost, "/v1/chat/completions"
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(mc.body)), int64(len(mc.body))
	}
	return r
}

var meteredCases = []meteredCase{
	{"unmetered", "", meteredNext(meteredCTJSON, true, false, meteredSmallJSON), nil},
	{"header", `"cost_after":{"header":"X-Tokens"},`, meteredNext(meteredCTJSON, true, false, meteredSmallJSON), nil},
	{"json", `"cost_after":{"json":"usage.total_tokens"},`, meteredNext(meteredCTJSON, false, false, meteredJSON), nil},
	{"sse", `"cost_after":{"json":"usage.total_tokens"},`, meteredNext(meteredCTSSE, false, true, meteredSSE...), nil},
	// The presets read the request body: a JSON answer; a stream whose
	// request asked for usage; one that did not, whose request gets
	// include_usage and whose stream loses what that added.
	{"openai_json", `"cost_after":{"preset":"openai"},`, meteredNext(meteredCTJSON, false, false, meteredJSON), meteredBodyJSON},
	{"openai_sse_asked", `"cost_after":{"preset":"openai"},`, meteredNext(meteredCTSSE, false, true, meteredSSEAsked...), meteredBodyAsked},
	{"openai_sse_rewritten", `"cost_after":{"preset":"openai"},`, meteredNext(meteredCTSSE, false, true, meteredSSEAsked...), meteredBodyStream},
}

// meteredHandler provisions a handler of one token_bucket policy "api" with
// cost_after ca, on the store that store configures ("" embedded).
func meteredHandler(b *testing.B, store, ca string) *Handler {
	return provisionHandler(b, `{`+store+`"tenant":"{http.request.header.X-Tenant}","headers":"off",
		"rate_limits":{"api":{"algorithm":"token_bucket",`+ca+`"max_events":`+fmt.Sprint(meteredBenchLimit)+`,"window":31536000000000000}}}`)
}

// verifyTenants makes the tenants of verifyMetered unique in the process
// (the embedded store is shared by every handler, and -count reruns).
var verifyTenants atomic.Int64

// verifyMetered serves one request of a fresh tenant and checks with a
// Peek of its bucket that it was charged want units (30 when settled, 1,
// the up-front cost, when not), so that no case measures a no-op.
func verifyMetered(b *testing.B, h *Handler, mc meteredCase, want int64) {
	b.Helper()
	tenant := fmt.Sprintf("verify-%d", verifyTenants.Add(1))
	w := newDiscardWriter()
	if err := h.ServeHTTP(w, mc.request(w, tenant), mc.next); err != nil {
		b.Fatal(err)
	}
	if w.status != http.StatusOK || w.written == 0 {
		b.Fatalf("status %d, %d bytes: the response did not go through", w.status, w.written)
	}
	if len(h.gate.Policies) != 1 {
		b.Fatalf("%d policies, want 1", len(h.gate.Policies))
	}
	p := h.gate.Policies[0].Engine
	res := make([]limiter.Result, 1)
	c := limiter.Check{Algorithm: p.Algorithm, Tenant: tenant, Policy: p.Name, Rate: p.Limit.Rate}
	if err := h.gate.Store.Peek(context.Background(), []limiter.Check{c}, res); err != nil {
		b.Fatal(err)
	}
	// The bucket refills 31.7 units/s: at most one unit back by now.
	if charged := meteredBenchLimit - res[0].Remaining; charged != want && charged != want-1 {
		b.Fatalf("the bucket was charged %d units, want %d (remaining %d)", charged, want, res[0].Remaining)
	}
}

// benchMetered runs the requests of mc on h.
func benchMetered(b *testing.B, h *Handler, mc meteredCase) {
	want := int64(meteredBenchTokens)
	if mc.costAfter == "" {
		want = 1
	}
	verifyMetered(b, h, mc, want)
	w := newDiscardWriter()
	b.ReportAllocs()
	for b.Loop() {
		w.reset()
		if err := h.ServeHTTP(w, mc.request(w, "acme"), mc.next); err != nil {
			b.Fatal(err)
		}
	}
	if w.status != http.StatusOK {
		b.Fatalf("status %d", w.status)
	}
}

// BenchmarkServeHTTPMetered: the handler on the embedded store, a
// response that reports 30 tokens, unmetered and metered three ways.
func BenchmarkServeHTTPMetered(b *testing.B) {
	for _, mc := range meteredCases {
		b.Run(mc.name, func(b *testing.B) {
			benchMetered(b, meteredHandler(b, "", mc.costAfter), mc)
		})
	}
}

// BenchmarkServeHTTPMeteredRedis: the same on Redis without a lease, so
// a metered request is two script calls (decide, then the settlement's
// forced charge) against one.
func BenchmarkServeHTTPMeteredRedis(b *testing.B) {
	srv := redistest.StartStandalone(b, redistest.Options{})
	store := `"redis":{"addresses":["` + srv.Addr + `"]},`
	for _, mc := range meteredCases {
		if mc.name != "unmetered" && mc.name != "json" {
			continue
		}
		b.Run(mc.name, func(b *testing.B) {
			benchMetered(b, meteredHandler(b, store, mc.costAfter), mc)
		})
	}
}
