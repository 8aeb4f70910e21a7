package tollgate

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// llmAPI is a fake OpenAI-compatible and Anthropic API. It answers every
// request with an answer of ?tokens=N tokens (a third of them input, and
// ?cached=C of those from the prompt cache) and remembers, per X-Tenant,
// the body and Accept-Encoding it received.
//
//	/v1/chat/completions  OpenAI: streamed when "stream" is true, with
//	                      "usage":null on each chunk and a usage chunk
//	                      when stream_options.include_usage is true
//	/v1/messages          Anthropic: message_start with the input
//	                      tokens, message_delta with the output tokens
type llmAPI struct {
	addr     string
	mu       sync.Mutex
	received map[string]llmReceived
}

type llmReceived struct {
	body string
}

func newLLMAPI(t *testing.T) *llmAPI {
	t.Helper()
	a := &llmAPI{received: map[string]llmReceived{}}
	a.addr = newHTTPServer(t, http.HandlerFunc(a.serve))
	return a
}

func (a *llmAPI) got(tenant string) llmReceived {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.received[tenant]
}

// openAIChunks is what the fake streams for tokens tokens; withUsage as
// with include_usage.
func openAIChunks(tokens, cached int, withUsage bool) string {
	in, out := tokens/3, tokens-tokens/3
	var b strings.Builder
	for _, w := range []string{"", "The", " answer", " is", " \"usage\":null", "."} {
		c, _ := json.Marshal(w)
		fmt.Fprintf(&b, `data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"content":%s},"logprobs":null,"finish_reason":null}]`, c)
		if withUsage {
			b.WriteString(`,"usage":null`)
		}
		b.WriteString("}\n\n")
	}
	if withUsage {
		fmt.Fprintf(&b, `data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini","system_fingerprint":"fp_1","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`+"\n\n", in, out, tokens, cached)
	}
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

func (a *llmAPI) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	a.mu.Lock()
	a.received[r.Header.Get("X-Tenant")] = llmReceived{string(body)}
	a.mu.Unlock()
	tokens, _ := strconv.Atoi(r.URL.Query().Get("tokens"))
	cached, _ := strconv.Atoi(r.URL.Query().Get("cached"))
	in, out := tokens/3, tokens-tokens/3
	var req struct {
		Stream        bool `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	_ = json.Unmarshal(body, &req)
	rc := http.NewResponseController(w)
	switch r.URL.Path {
	case "/v1/chat/completions":
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			// ?deep=N: a tool call's arguments nested N objects deep
			// come before the usage.
			deep, _ := strconv.Atoi(r.URL.Query().Get("deep"))
			fmt.Fprintf(w, `{"id":"chatcmpl-9","object":"chat.completion","model":"gpt-4o-mini","tool":%s1%s,"choices":[{"index":0,"message":{"role":"assistant","content":"The answer."},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`, strings.Repeat(`{"a":`, deep), strings.Repeat("}", deep), in, out, tokens, cached)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range strings.SplitAfter(openAIChunks(tokens, cached, req.StreamOptions.IncludeUsage), "\n\n") {
			io.WriteString(w, ev)
			rc.Flush()
		}
	case "/v1/models":
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[{"id":"gpt-4o-mini","object":"model","created":1,"owned_by":"openai"}]}`)
	case "/v1/responses/resp_1":
		// A stored answer, fetched again: its usage was the POST's.
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"resp_1","object":"response","model":"gpt-4o-mini","status":"completed","usage":{"input_tokens":10,"output_tokens":1000,"total_tokens":1010}}`)
	case "/v1/messages":
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range []string{
			fmt.Sprintf("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"claude-x\",\"usage\":{\"input_tokens\":%d,\"cache_read_input_tokens\":%d,\"output_tokens\":1}}}\n\n", in-cached, cached),
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"The answer.\"}}\n\n",
			fmt.Sprintf("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":%d}}\n\n", out),
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
		} {
			io.WriteString(w, ev)
			rc.Flush()
		}
	default:
		http.NotFound(w, r)
	}
}

// TestLLMPresets: cost_after openai charges the tokens of every answer
// however the client asks: a stream without include_usage gets it asked
// for on the way up and reaches the client exactly as it would have
// without Tollgate (no usage chunk, no "usage":null); a client that asked
// gets its stream untouched. A price table charges money per model; a
// model it cannot price is refused before anything is charged.
// cost_after anthropic reads input and output from their two events.
func TestLLMPresets(t *testing.T) {
	api := newLLMAPI(t)
	s := startCaddyAdmin(t, "", `
	handle /metrics {
		metrics
	}
	route /openai/* {
		uri strip_prefix /openai
		rate_limit {
			tenant {http.request.header.X-Tenant}
			policy tokens {
				algorithm fixed_window
				limit 1000000
				window 1h
				cost_after openai
			}
		}
		reverse_proxy `+api.addr+`
	}
	route /priced/* {
		uri strip_prefix /priced
		rate_limit {
			tenant {http.request.header.X-Tenant}
			policy money {
				calendar day
				limit 100000000
				cost_after openai
				price gpt-4o* input 2500 output 10000 cached 1250
				price claude-* input 3000 output 15000
			}
		}
		reverse_proxy `+api.addr+`
	}
	route /anthropic/* {
		uri strip_prefix /anthropic
		rate_limit {
			tenant {http.request.header.X-Tenant}
			policy a_tokens {
				algorithm fixed_window
				limit 1000000
				window 1h
				cost_after anthropic
			}
		}
		reverse_proxy `+api.addr+`
	}`, nil)
	before := scrapeMetrics(t, s.base+"/metrics")

	post := func(path, tenant, body string, headers ...string) response {
		t.Helper()
		return s.post(path, body, append([]string{"X-Tenant", tenant}, headers...)...)
	}
	// charged returns what tenant has been charged on path's policy of
	// limit: a probe answer of 0 tokens costs its 1 unit up front only.
	charged := func(path, tenant string, limit int) int {
		t.Helper()
		res := post(path+"?tokens=0", tenant, `{"model":"gpt-4o","messages":[]}`)
		rem, err := strconv.Atoi(res.header.Get("X-Ratelimit-Remaining"))
		if err != nil {
			t.Fatalf("%s probe: status %d, remaining %q", tenant, res.status, res.header.Get("X-Ratelimit-Remaining"))
		}
		return limit - rem - 1
	}
	const chat = "/openai/v1/chat/completions"
	streamBody := `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"What is the answer?"}]}`

	// A stream without include_usage: asked on the way up, taken out on
	// the way back, charged 7000.
	res := post(chat+"?tokens=7000", "no-usage", streamBody, "Accept-Encoding", "gzip")
	if want := openAIChunks(7000, 0, false); res.body != want {
		t.Errorf("stream without include_usage: the client got\n%q\nwant what it gets without Tollgate\n%q", res.body, want)
	}
	got := api.got("no-usage")
	if !strings.Contains(got.body, `"stream_options":{"include_usage":true}`) || !strings.HasSuffix(got.body, streamBody[1:]) {
		t.Errorf("the upstream received %s, want include_usage set and the rest as sent", got.body)
	}
	// The client's Accept-Encoding is not passed on (the usage chunk is
	// taken out of what it receives, which a compressed stream would not
	// allow): the proxy's own transport asks for gzip and decompresses.
	if ce := res.header.Get("Content-Encoding"); ce != "" {
		t.Errorf("stream without include_usage: Content-Encoding %q, want none", ce)
	}
	if c := charged(chat, "no-usage", 1000000); c != 7000 {
		t.Errorf("stream without include_usage: charged %d, want 7000", c)
	}

	// A client that asked: its stream as sent, charged 7000.
	asked := `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[]}`
	res = post(chat+"?tokens=7000", "asked", asked)
	if want := openAIChunks(7000, 0, true); res.body != want {
		t.Errorf("stream with include_usage: the client got\n%q\nwant\n%q", res.body, want)
	}
	if got := api.got("asked").body; got != asked {
		t.Errorf("the upstream received %s, want the body as sent %s", got, asked)
	}
	if c := charged(chat, "asked", 1000000); c != 7000 {
		t.Errorf("stream with include_usage: charged %d, want 7000", c)
	}

	// Not streamed: charged the usage, even after a tool call nested 200
	// objects deep.
	post(chat+"?tokens=900&deep=200", "json", `{"model":"gpt-4o-mini","messages":[]}`)
	if c := charged(chat, "json", 1000000); c != 900 {
		t.Errorf("JSON answer after a 200-level tool call: charged %d, want 900", c)
	}

	// Prices: 3000 tokens of gpt-4o, 1000 input of which 400 cached,
	// 2000 output.
	const priced = "/priced/v1/chat/completions"
	post(priced+"?tokens=3000&cached=400", "money", `{"model":"gpt-4o-2024-08-06","messages":[]}`)
	want := 600*2500 + 400*1250 + 2000*10000
	// The probe (gpt-4o, 0 tokens) costs 1 up front and 0 afterwards.
	if c := charged(priced, "money", 100000000); c != want {
		t.Errorf("priced answer: charged %d, want %d", c, want)
	}
	// The admin API shows the money left: the probe's unit included.
	money := adminPolicy(t, s.adminOK(http.MethodGet, "/rate_limit/usage?tenant=money", ""), "money")
	if left := money["remaining"]; left != float64(100000000-want-1) {
		t.Errorf("admin usage of a priced policy: remaining %v, want %d", left, 100000000-want-1)
	}
	// A model without a price (no "*"): 400, nothing charged.
	if res := post(priced+"?tokens=3000", "unpriced", `{"model":"llama-3","messages":[]}`); res.status != http.StatusBadRequest {
		t.Errorf("unpriced model: status %d, want 400", res.status)
	}
	if c := charged(priced, "unpriced", 100000000); c != 0 {
		t.Errorf("unpriced model: charged %d, want 0", c)
	}

	// Anthropic: input 1000 (of which 100 cached) + output 2000.
	post("/anthropic/v1/messages?tokens=3000&cached=100", "claude", `{"model":"claude-x","stream":true,"messages":[]}`)
	if c := charged("/anthropic/v1/messages", "claude", 1000000); c != 3000 {
		t.Errorf("anthropic stream: charged %d, want 3000", c)
	}

	// A request without a body (listing models) asks for no tokens: its
	// unit up front, not a missing cost.
	if res := s.get("/openai/v1/models", "X-Tenant", "models"); res.status != 200 {
		t.Errorf("GET /v1/models: status %d", res.status)
	}
	if c := charged(chat, "models", 1000000); c != 1 {
		t.Errorf("GET /v1/models: charged %d, want its 1 unit up front", c)
	}
	// Nor does fetching a stored answer again, though it shows the usage
	// its generation reported (and was charged) then.
	for range 2 {
		if res := s.get("/openai/v1/responses/resp_1", "X-Tenant", "stored"); res.status != 200 {
			t.Errorf("GET /v1/responses/resp_1: status %d", res.status)
		}
	}
	if c := charged(chat, "stored", 1000000); c != 2 {
		t.Errorf("GET /v1/responses/resp_1 twice: charged %d, want 1 unit up front each time", c)
	}
	// ... even where a price table has no default: no model to price.
	if res := s.get("/priced/v1/models", "X-Tenant", "models"); res.status != 200 {
		t.Errorf("GET /v1/models on a price table without *: status %d, want 200", res.status)
	}
	// A body too large to be read whole (padding costs no tokens) would
	// escape its price and its usage: refused before anything happens.
	padded := `{"model":"gpt-4o","stream":true,"messages":[]}` + strings.Repeat(" ", 4<<20)
	if res := post(priced+"?tokens=3000", "padded", padded); res.status != http.StatusRequestEntityTooLarge {
		t.Errorf("a 4 MiB padded body: status %d, want 413", res.status)
	}
	if got := api.got("padded").body; got != "" {
		t.Errorf("the upstream received the padded request (%d bytes)", len(got))
	}

	after := scrapeMetrics(t, s.base+"/metrics")
	for _, policy := range []string{"tokens", "money", "a_tokens"} {
		for _, reason := range []string{"no_value", "client_gone", "not_json"} {
			if d := after.value("caddy_rate_limit_cost_missing_total", "policy", policy, "reason", reason) - before.value("caddy_rate_limit_cost_missing_total", "policy", policy, "reason", reason); d != 0 {
				t.Errorf("cost_missing_total{policy=%s,reason=%s} grew by %v, want 0: every answer had its usage", policy, reason, d)
			}
		}
	}
	for result, want := range map[string]float64{"usage_requested": 1} {
		if d := after.value("caddy_rate_limit_llm_requests_total", "result", result) - before.value("caddy_rate_limit_llm_requests_total", "result", result); d != want {
			t.Errorf("llm_requests_total{result=%s} grew by %v, want %v", result, d, want)
		}
	}
}

// TestCostBefore: cost_before reserves max_tokens up front, so a tenant
// cannot start an answer its bucket cannot afford; the settlement gives
// back what the answer did not use; a huge max_tokens is refused before
// the upstream sees it; without the value, cost applies.
func TestCostBefore(t *testing.T) {
	api := newLLMAPI(t)
	s := startCaddy(t, "", `
	rate_limit {
		tenant {http.request.header.X-Tenant}
		policy reserved {
			algorithm token_bucket
			limit 10000
			window 1000h
			cost_after openai
			cost_before json max_tokens
		}
	}
	reverse_proxy `+api.addr, nil)
	ask := func(tenant string, maxTokens string, tokens int) response {
		t.Helper()
		body := `{"model":"gpt-4o-mini","messages":[]}`
		if maxTokens != "" {
			body = `{"model":"gpt-4o-mini","max_tokens":` + maxTokens + `,"messages":[]}`
		}
		return s.post("/v1/chat/completions?tokens="+strconv.Itoa(tokens), body, "X-Tenant", tenant)
	}
	// 6000 reserved of 10000 (4000 left while it runs), 1000 used.
	if res := ask("t", "6000", 1000); res.status != 200 || res.header.Get("X-Ratelimit-Remaining") != "4000" {
		t.Fatalf("first answer: status %d, remaining %s while it ran; want 200 and 4000", res.status, res.header.Get("X-Ratelimit-Remaining"))
	}
	// 9000 left: 9500 is refused, 8000 is not.
	if res := ask("t", "9500", 1000); res.status != http.StatusTooManyRequests {
		t.Errorf("reserving 9500 of 9000 left: status %d, want 429", res.status)
	}
	if res := ask("t", "8000", 1000); res.status != 200 || res.header.Get("X-Ratelimit-Remaining") != "1000" {
		t.Errorf("reserving 8000 of 9000 left: status %d, remaining %s; want 200 and 1000", res.status, res.header.Get("X-Ratelimit-Remaining"))
	}
	// 8000 left. A huge max_tokens never reaches the upstream.
	if res := ask("huge", "1e15", 1000); res.status != http.StatusTooManyRequests {
		t.Errorf("max_tokens 1e15: status %d, want 429", res.status)
	}
	if got := api.got("huge").body; got != "" {
		t.Errorf("the upstream received a request with max_tokens 1e15: %s", got)
	}
	// No max_tokens: 1 up front.
	if res := ask("t", "", 1000); res.status != 200 || res.header.Get("X-Ratelimit-Remaining") != "7999" {
		t.Errorf("without max_tokens: status %d, remaining %s; want 200 and 7999 (1 up front)", res.status, res.header.Get("X-Ratelimit-Remaining"))
	}
}
