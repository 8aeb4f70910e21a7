package tollgate

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
)

// llmUpstream is a small fake of a metered API. Every path reports the
// cost given in ?tokens=N its own way:
//
//	/json/...     an OpenAI-style chat completion (usage.total_tokens)
//	/sse/...      a streamed completion: chunks, a usage chunk, [DONE]
//	/header/...   the X-Tokens response header
//	/trailer/...  the X-Tokens trailer, after the body
//	/gzip/... /br/... /zstd/... /deflate/...
//	              the JSON completion (?sse: the streamed one, each event
//	              flushed) compressed with that Content-Encoding
//	/text/...     the JSON completion served as text/plain
//	/v1/chat/completions  OpenAI-compatible: streams when the request
//	              body says "stream": true, with a usage chunk when it asks
//	              for stream_options.include_usage
//
// sseBody and jsonBody give what it sends, so tests can compare the bytes
// the client got.
type llmUpstream struct {
	addr string
	// gate is received from before each SSE event after the first of a
	// ?gated request (a test paces the stream with it); gate2 the same
	// for ?gated=2.
	gate, gate2 chan struct{}
	// served counts the responses started.
	served atomic.Int64
	// sent holds the bytes of each compressed response, by X-Tenant.
	sent sync.Map
}

func jsonBody(tokens int) string {
	return fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello \"there\" {usage}"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`, tokens/3, tokens-tokens/3, tokens)
}

// sseEvents are the events of a streamed completion of tokens tokens;
// withUsage adds the usage chunk.
func sseEvents(tokens int, withUsage bool) []string {
	ev := []string{
		"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
		"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n",
		": keep-alive\n\n",
		"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world \\\"usage\\\": 999\"},\"finish_reason\":\"stop\"}]}\n\n",
	}
	if withUsage {
		// OpenAI adds "usage":null to every chunk once usage is asked.
		for i, e := range ev {
			if strings.HasPrefix(e, "data: {") {
				ev[i] = strings.TrimSuffix(e, "}\n\n") + ",\"usage\":null}\n\n"
			}
		}
		ev = append(ev, fmt.Sprintf("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", tokens/3, tokens-tokens/3, tokens))
	}
	return append(ev, "data: [DONE]\n\n")
}

func sseBody(tokens int) string { return strings.Join(sseEvents(tokens, true), "") }

func newLLMUpstream(t *testing.T) *llmUpstream {
	t.Helper()
	u := &llmUpstream{gate: make(chan struct{}), gate2: make(chan struct{})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = l.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(u.serve)}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return u
}

func (u *llmUpstream) serve(w http.ResponseWriter, r *http.Request) {
	u.served.Add(1)
	tokens, _ := strconv.Atoi(r.URL.Query().Get("tokens"))
	kind, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	switch kind {
	case "json":
		w.Header().Set("Content-Type", "application/json")
		body := jsonBody(tokens)
		if pad, _ := strconv.Atoi(r.URL.Query().Get("pad")); pad > 0 {
			// A longer answer: compressible past encode's minimum length.
			body = strings.Replace(body, `"Hello`, `"`+strings.Repeat("la ", pad)+`Hello`, 1)
		}
		io.WriteString(w, body)
	case "text":
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, jsonBody(tokens))
	case "gzip", "br", "zstd", "deflate":
		u.compressed(w, r, kind, tokens)
	case "header":
		// ?raw=v sends v as is; without tokens, no header at all.
		if v := r.URL.Query().Get("raw"); v != "" {
			w.Header().Set("X-Tokens", v)
		} else if r.URL.Query().Has("tokens") {
			w.Header().Set("X-Tokens", strconv.Itoa(tokens))
		}
		io.WriteString(w, "done")
	case "trailer":
		w.Header().Set("Trailer", "X-Tokens")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "done")
		w.Header().Set("X-Tokens", strconv.Itoa(tokens))
	case "sse":
		var gate chan struct{}
		switch r.URL.Query().Get("gated") {
		case "2":
			gate = u.gate2
		case "":
			if r.URL.Query().Has("gated") {
				gate = u.gate
			}
		}
		u.stream(w, r, sseEvents(tokens, true), gate)
	case "v1":
		var req struct {
			Stream        bool `json:"stream"`
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		if tokens == 0 {
			tokens = 7000
		}
		if req.Stream {
			u.stream(w, r, sseEvents(tokens, req.StreamOptions.IncludeUsage), nil)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, jsonBody(tokens))
	case "big":
		u.big(w, r, tokens)
	default:
		http.NotFound(w, r)
	}
}

// stream writes events as a text/event-stream, flushing each one; with a
// gate, it waits for it before each event after the first.
func (u *llmUpstream) stream(w http.ResponseWriter, r *http.Request, events []string, gate chan struct{}) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	for i, ev := range events {
		if i > 0 && gate != nil {
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		if _, err := io.WriteString(w, ev); err != nil {
			return
		}
		_ = rc.Flush()
	}
}

// compressed sends the completion compressed with enc, as JSON or (?sse)
// as an event stream flushed after each event, and keeps the bytes sent.
func (u *llmUpstream) compressed(w http.ResponseWriter, r *http.Request, enc string, tokens int) {
	var sent bytes.Buffer
	defer func() { u.sent.Store(r.Header.Get("X-Tenant"), sent.String()) }()
	out := io.MultiWriter(w, &sent)
	var zw interface {
		io.WriteCloser
		Flush() error
	}
	switch enc {
	case "gzip":
		zw = gzip.NewWriter(out)
	case "br":
		zw = brotli.NewWriter(out)
	case "zstd":
		zw, _ = zstd.NewWriter(out)
	case "deflate":
		zw = zlib.NewWriter(out)
	}
	w.Header().Set("Content-Encoding", enc)
	events := []string{jsonBody(tokens)}
	if r.URL.Query().Has("sse") {
		w.Header().Set("Content-Type", "text/event-stream")
		events = sseEvents(tokens, true)
	} else {
		w.Header().Set("Content-Type", "application/json")
	}
	rc := http.NewResponseController(w)
	for _, ev := range events {
		io.WriteString(zw, ev)
		zw.Flush()
		rc.Flush()
	}
	zw.Close()
}

// bigChunk is 32 KiB of text that never holds a usage value.
var bigChunk = strings.Repeat("lorem ipsum dolor sit amet, \\\"usage\\\" 12345 ", 32*1024/44+1)[:32*1024]

// big streams a JSON completion whose content is 50 MiB, usage at the end,
// slowly enough that the proxy cannot hold it all at once.
func (u *llmUpstream) big(w http.ResponseWriter, _ *http.Request, tokens int) {
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"choices":[{"message":{"content":"`)
	rc := http.NewResponseController(w)
	for i := range 50 * 32 {
		if _, err := io.WriteString(w, bigChunk); err != nil {
			return
		}
		if i%32 == 0 {
			// Slow: 50 pauses, so the answer streams for a while.
			_ = rc.Flush()
			time.Sleep(2 * time.Millisecond)
		}
	}
	fmt.Fprintf(w, `"}}],"usage":{"total_tokens":%d}}`, tokens)
}

// meteredSite is a site with one metered route per source of the fake
// upstream: limit 100 tokens an hour per tenant, 1 up front.
func meteredSite(upstream, algorithm string) string {
	var b strings.Builder
	b.WriteString("\thandle /metrics {\n\t\tmetrics\n\t}\n")
	for _, src := range []struct{ path, costAfter string }{
		{"json", "json usage.total_tokens"},
		{"sse", "json usage.total_tokens"},
		{"header", "header X-Tokens"},
		{"trailer", "header X-Tokens"},
		{"gzip", "json usage.total_tokens"},
		{"br", "json usage.total_tokens"},
		{"zstd", "json usage.total_tokens"},
		{"deflate", "json usage.total_tokens"},
		{"text", "json usage.total_tokens"},
		{"big", "json usage.total_tokens"},
	} {
		fmt.Fprintf(&b, `
	route /%[1]s/* {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			policy m_%[1]s {
				algorithm %[4]s
				limit 100
				window 1h
				cost_after %[2]s
			}
		}
		reverse_proxy %[3]s
	}
`, src.path, src.costAfter, upstream, algorithm)
	}
	return b.String()
}

// TestMeteredChargeSequence: limit 100 tokens, 30 per response, whatever
// the response reports them by: 4 requests pass (the 4th leaves the
// bucket 20 tokens in debt), the 5th is refused with nothing remaining;
// bodies reach the client byte for byte.
func TestMeteredChargeSequence(t *testing.T) {
	up := newLLMUpstream(t)
	for _, algo := range []string{"token_bucket", "fixed_window", "sliding_window"} {
		t.Run(algo, func(t *testing.T) {
			s := startCaddy(t, "", meteredSite(up.addr, algo), nil)
			want := map[string]string{"json": jsonBody(30), "sse": sseBody(30), "header": "done", "trailer": "done"}
			for _, src := range []string{"json", "sse", "header", "trailer"} {
				tenant := "seq-" + src
				for i := 1; i <= 5; i++ {
					res := s.get("/"+src+"/x?tokens=30", "X-Tenant", tenant)
					if i <= 4 {
						if res.status != 200 || res.body != want[src] {
							t.Fatalf("%s request %d: status %d body %q, want 200 and the upstream's bytes", src, i, res.status, res.body)
						}
						if rem, wantRem := res.header.Get("X-Ratelimit-Remaining"), strconv.Itoa(100-1-30*(i-1)); rem != wantRem {
							t.Errorf("%s request %d: remaining %s, want %s (1 up front, 29 settled per response)", src, i, rem, wantRem)
						}
						continue
					}
					if res.status != http.StatusTooManyRequests || res.header.Get("X-Ratelimit-Remaining") != "0" || res.header.Get("Retry-After") == "" {
						t.Errorf("%s request 5: status %d remaining %q retry-after %q, want a 429 with 0 remaining", src, res.status, res.header.Get("X-Ratelimit-Remaining"), res.header.Get("Retry-After"))
					}
				}
			}
		})
	}
}

// TestMeteredCompressed: a gzip, br or zstd body, JSON or an event stream
// flushed event by event, reaches the client as the upstream compressed
// it, byte for byte, and is charged what it reports: 30 tokens each, so
// the 5th request is refused.
func TestMeteredCompressed(t *testing.T) {
	up := newLLMUpstream(t)
	s := startCaddy(t, "", meteredSite(up.addr, "token_bucket"), nil)
	for _, enc := range []string{"gzip", "br", "zstd"} {
		for _, q := range []string{"", "&sse"} {
			tenant := enc + q
			var got []int
			for i := range 5 {
				res := s.get("/"+enc+"/x?tokens=30"+q, "X-Tenant", tenant, "Accept-Encoding", enc)
				got = append(got, res.status)
				if res.status != 200 {
					continue
				}
				sent, _ := up.sent.Load(tenant)
				if res.header.Get("Content-Encoding") != enc || res.body != sent.(string) {
					t.Errorf("%s request %d: Content-Encoding %q, body %q; want %s and the %d bytes sent %q", tenant, i+1, res.header.Get("Content-Encoding"), res.body, enc, len(sent.(string)), sent)
				}
			}
			if fmt.Sprint(got) != "[200 200 200 200 429]" {
				t.Errorf("%s: statuses %v, want 4 admitted then 429 (30 tokens each of 100)", tenant, got)
			}
		}
	}
}

// TestMeteredCostMissing: a body in a coding Tollgate does not read, a body that is not JSON, a
// missing header and malformed values charge the up-front cost only and
// are counted in cost_missing_total; a cost of 0 is a valid cost.
func TestMeteredCostMissing(t *testing.T) {
	up := newLLMUpstream(t)
	s := startCaddy(t, "", meteredSite(up.addr, "fixed_window"), nil)
	before := scrapeMetrics(t, s.base+"/metrics")
	for _, c := range []struct {
		path, tenant string
		missing      bool
	}{
		{"/deflate/x?tokens=30", "deflate", true},
		{"/text/x?tokens=30", "text", true},
		{"/header/x", "none", true},
		{"/header/x?raw=abc", "abc", true},
		{"/header/x?raw=-5", "negative", true},
		{"/header/x?raw=1.5", "fraction", true},
		{"/header/x?tokens=0", "zero", false},
	} {
		for i := 1; i <= 10; i++ {
			if res := s.get(c.path, "X-Tenant", c.tenant); res.status != 200 {
				t.Fatalf("%s request %d: status %d", c.path, i, res.status)
			}
		}
		// Every request was charged its 1 unit up front (a window keeps
		// it when the real cost is 0).
		if got := s.get(c.path, "X-Tenant", c.tenant).header.Get("X-Ratelimit-Remaining"); got != "89" {
			t.Errorf("%s: remaining %s after 11 requests, want 89 (1 unit each)", c.path, got)
		}
	}
	after := scrapeMetrics(t, s.base+"/metrics")
	for _, c := range []struct {
		policy, reason string
		want           float64
	}{
		{"m_deflate", "compressed", 11}, {"m_deflate", "no_value", 0},
		{"m_text", "not_json", 11}, {"m_text", "no_value", 0},
		{"m_header", "no_value", 11}, {"m_header", "invalid_number", 33},
	} {
		if got := after.value("caddy_rate_limit_cost_missing_total", "policy", c.policy, "reason", c.reason) - before.value("caddy_rate_limit_cost_missing_total", "policy", c.policy, "reason", c.reason); got != c.want {
			t.Errorf("cost_missing_total{policy=%q,reason=%q} grew by %v, want %v", c.policy, c.reason, got, c.want)
		}
	}
}

// TestMeteredStreams: the events of a streamed response reach the client
// as the upstream sends them (the next one is sent only once the client
// has read the previous one), and a client that goes away after the
// usage event is charged what it saw.
func TestMeteredStreams(t *testing.T) {
	up := newLLMUpstream(t)
	up.gate = make(chan struct{})
	s := startCaddy(t, "", meteredSite(up.addr, "token_bucket"), nil)

	read := func(ctx context.Context, tenant string, events int) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.base+"/sse/x?tokens=30&gated", nil)
		req.Header.Set("X-Tenant", tenant)
		res, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		br := bufio.NewReader(res.Body)
		want := sseEvents(30, true)
		for i := range events {
			var got strings.Builder
			for !strings.HasSuffix(got.String(), "\n\n") {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("event %d: %v after %q", i, err, got.String())
				}
				got.WriteString(line)
			}
			if got.String() != want[i] {
				t.Fatalf("event %d: %q, want %q", i, got.String(), want[i])
			}
			if i+1 < events {
				select {
				case up.gate <- struct{}{}:
				case <-time.After(5 * time.Second):
					t.Fatalf("the upstream did not ask for event %d", i+1)
				}
			}
		}
	}
	// All events, one at a time: each reached the client before the
	// upstream sent the next.
	all := len(sseEvents(30, true))
	read(context.Background(), "stream-all", all)

	// Gone right after the usage event (the 5th of 6): charged 30, once
	// the upstream, which goes on, has sent the rest.
	ctx, cancel := context.WithCancel(context.Background())
	read(ctx, "stream-gone", 5)
	cancel()
	up.gate <- struct{}{}
	// The settlement follows the end of the proxied request; a request
	// that costs 0 in the end shows the bucket in its header.
	var rem string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if rem = s.get("/sse/x?tokens=0", "X-Tenant", "stream-gone").header.Get("X-Ratelimit-Remaining"); rem == "69" {
			break
		}
	}
	if rem != "69" {
		t.Errorf("after a client left past the usage event: remaining %s, want 69 (30 charged, then 1 up front)", rem)
	}
}

// TestMeteredBigBodyMemoryFlat: a 50 MiB JSON body streams through with
// its usage at the very end: the client gets every byte, the cost is
// charged, and the process's heap does not grow with the body.
func TestMeteredBigBodyMemoryFlat(t *testing.T) {
	up := newLLMUpstream(t)
	s := startCaddy(t, "", meteredSite(up.addr, "token_bucket"), nil)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	var peak atomic.Uint64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var m runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > peak.Load() {
				peak.Store(m.HeapAlloc)
			}
		}
	}()
	req, _ := http.NewRequest(http.MethodGet, s.base+"/big/x?tokens=30", nil)
	req.Header.Set("X-Tenant", "big")
	res, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, res.Body)
	res.Body.Close()
	close(stop)
	<-done
	if err != nil || n < 50<<20 {
		t.Fatalf("read %d bytes (%v), want the whole 50 MiB body", n, err)
	}
	growth := int64(peak.Load()) - int64(base)
	t.Logf("heap: base %d MiB, peak %d MiB during the 50 MiB stream", base>>20, peak.Load()>>20)
	if growth > 24<<20 {
		t.Errorf("heap grew by %d MiB while streaming 50 MiB: the body is being held", growth>>20)
	}
	if rem := s.get("/big/x?tokens=0", "X-Tenant", "big").header.Get("X-Ratelimit-Remaining"); rem != "69" {
		t.Errorf("after the 50 MiB response: remaining %s, want 69", rem)
	}
}

// TestMeteredWithEncode: in a site with encode, the client gets gzip and
// the tokens are charged whether rate_limit reads the body before encode
// compresses it (ordered after encode, as the docs say) or after (the
// default order: read through a decompressor on the side).
func TestMeteredWithEncode(t *testing.T) {
	up := newLLMUpstream(t)
	for _, order := range []string{"\torder rate_limit after encode\n", ""} {
		t.Run(fmt.Sprintf("ordered=%v", order != ""), func(t *testing.T) {
			testMeteredWithEncode(t, up, order)
		})
	}
}

func testMeteredWithEncode(t *testing.T, up *llmUpstream, order string) {
	globals := order + "\tlog {\n\t\toutput discard\n\t}"
	s := startCaddy(t, globals, `
	encode gzip
	rate_limit {
		tenant {http.request.header.X-Tenant}
		policy enc {
			algorithm token_bucket
			limit 100
			window 1h
			cost_after json usage.total_tokens
		}
	}
	reverse_proxy `+up.addr, nil)
	var got []int
	for range 5 {
		res := s.get("/json/x?tokens=30&pad=400", "X-Tenant", "enc", "Accept-Encoding", "gzip")
		if res.status == 200 && res.header.Get("Content-Encoding") != "gzip" {
			t.Fatalf("Content-Encoding %q, want gzip: the example must compress", res.header.Get("Content-Encoding"))
		}
		got = append(got, res.status)
	}
	if fmt.Sprint(got) != "[200 200 200 200 429]" {
		t.Errorf("statuses %v, want 4 admitted then 429 (30 tokens each of 100)", got)
	}
}

// TestReadmeLLMExample runs the README's LLM example as written (auth and
// upstream addresses replaced by fakes): an OpenAI-compatible upstream
// that reports 7000 tokens per answer, streamed or not. 20 000 tokens a
// minute: 3 answers pass, the 4th request gets a 429 until 1001 tokens
// have refilled; the day's quota and the admin API show the 21 000
// tokens; a stream without include_usage is charged its 7000 tokens all
// the same, and its client receives the stream it asked for (no usage
// chunk, no "usage":null).
func TestReadmeLLMExample(t *testing.T) {
	block := docBlockWith(t, "tokens_per_day", "reverse_proxy localhost:8000")
	up := newLLMUpstream(t)
	auth := fakeAuth(t, map[string]string{"alice": "free", "bob": "free"})
	admin := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := &caddyServer{t: t, port: freePort(t), admin: admin}
	s.base = fmt.Sprintf("http://127.0.0.1:%d", s.port)
	caddyMu.Lock()
	t.Cleanup(caddyMu.Unlock)
	t.Cleanup(func() { stopCaddy(t) })
	_, rest, _ := strings.Cut(strings.TrimSpace(block), " {")
	src := fmt.Sprintf("{\n\tadmin %s\n\tpersist_config off\n\tauto_https off\n\tlog {\n\t\toutput discard\n\t}\n}\n\n%s {%s\n", admin, s.base, rest)
	src = strings.NewReplacer("auth:9000", auth, "localhost:8000", up.addr).Replace(src)
	if err := loadConfig(t, adaptCaddyfile(t, src)); err != nil {
		t.Fatalf("loading: %v\n%s", err, src)
	}
	testClient.CloseIdleConnections()
	waitListening(t, s.port)

	chat := func(user string, stream, usage bool) response {
		t.Helper()
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}]`
		if stream {
			body += `,"stream":true`
			if usage {
				body += `,"stream_options":{"include_usage":true}`
			}
		}
		// X-Tenant-Id: spoofing, overwritten by forward_auth.
		return s.post("/v1/chat/completions", body+"}", "Authorization", "Bearer "+user, "X-Tenant-Id", "bob")
	}
	if r := chat("alice", false, false); r.status != 200 || r.body != jsonBody(7000) {
		t.Fatalf("answer 1: %d %q", r.status, r.body)
	}
	if r := chat("alice", true, true); r.status != 200 || r.body != strings.Join(sseEvents(7000, true), "") {
		t.Fatalf("streamed answer 2: %d %q", r.status, r.body)
	}
	if r := chat("alice", true, true); r.status != 200 {
		t.Fatalf("answer 3: %d", r.status)
	}
	r := chat("alice", false, false)
	// 1001 tokens at 20000/min is 3.003s, less what refilled since the
	// 3rd answer (a loaded machine takes a while): 3 or 4 whole seconds.
	if ra := r.header.Get("Retry-After"); r.status != http.StatusTooManyRequests || (ra != "4" && ra != "3") || !strings.Contains(r.header.Get("RateLimit"), `"tokens_per_minute";r=0`) {
		t.Errorf("request 4: status %d Retry-After %q RateLimit %q; want a 429 for 1001 tokens at 20000/min (3.003s: 4, or 3 after a refill), r=0",
			r.status, r.header.Get("Retry-After"), r.header.Get("RateLimit"))
	}
	for range 2 {
		if r := chat("bob", true, false); r.status != 200 || r.body != strings.Join(sseEvents(7000, false), "") {
			t.Fatalf("bob's stream without include_usage: %d %q, want the stream without usage", r.status, r.body)
		}
	}

	usage := func(tenant string) map[string]int64 {
		t.Helper()
		res, err := testClient.Get("http://" + admin + "/rate_limit/usage?tenant=" + tenant)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var u struct {
			Policies []struct {
				Policy    string `json:"policy"`
				Remaining int64  `json:"remaining"`
			} `json:"policies"`
		}
		if err := json.NewDecoder(res.Body).Decode(&u); err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, p := range u.Policies {
			got[p.Policy] = p.Remaining
		}
		return got
	}
	if got := usage("alice"); got["tokens_per_day"] != 1_000_000-21_000 || got["tokens_per_minute"] != 0 {
		t.Errorf("alice's usage %v, want 979000 tokens left today and none this minute", got)
	}
	// A day is a fixed window: exact whenever it is read.
	if got := usage("bob"); got["tokens_per_day"] != 1_000_000-14_000 {
		t.Errorf("bob's usage after 2 streams without include_usage: %v, want 986000 tokens left today (7000 each)", got)
	}
}

// TestMeteredReviewCases: a client cannot make a metered request free by
// sending a cost of 0 up front; a client that leaves before the usage
// event is charged the usage all the same (the upstream request goes on
// and is drained); HEAD answers are not counted as missing a cost; spaces
// around + are accepted in the Caddyfile.
func TestMeteredReviewCases(t *testing.T) {
	up := newLLMUpstream(t)
	s := startCaddy(t, "", `
	handle /metrics {
		metrics
	}
	route /json/* {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			policy rv_json {
				algorithm token_bucket
				limit 100
				window 1h
				cost {http.request.header.X-Max-Tokens}
				cost_after json usage.prompt_tokens + usage.completion_tokens
			}
		}
		reverse_proxy `+up.addr+`
	}
	route /sse/* {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			policy rv_sse {
				algorithm token_bucket
				limit 100
				window 1h
				cost_after json usage.total_tokens
			}
		}
		reverse_proxy `+up.addr+`
	}`, nil)
	before := scrapeMetrics(t, s.base+"/metrics")

	// X-Max-Tokens: 0 still costs 1 up front: once in debt, refused.
	var got []int
	for range 6 {
		got = append(got, s.get("/json/x?tokens=60", "X-Tenant", "zero", "X-Max-Tokens", "0").status)
	}
	if fmt.Sprint(got) != "[200 200 429 429 429 429]" {
		t.Errorf("a client sending cost 0: statuses %v, want 2 admitted (60 tokens each of 100) then 429", got)
	}

	// Gone after 2 events of 6 (before the usage event): the upstream
	// is not cancelled, sends the rest, and the 30 tokens are charged.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.base+"/sse/x?tokens=30&gated", nil)
	req.Header.Set("X-Tenant", "early")
	res, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(res.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	up.gate <- struct{}{}
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	res.Body.Close()
	// Once the server has seen the client go (else the rest would just
	// be written to a closed connection), the upstream goes on.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		after := scrapeMetrics(t, s.base+"/metrics")
		if after.value("caddy_rate_limit_drains_total", "event", "started")-before.value("caddy_rate_limit_drains_total", "event", "started") == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no drain started 5s after the client left")
		}
	}
	for i := 2; i < len(sseEvents(30, true)); i++ {
		select {
		case up.gate <- struct{}{}:
		case <-time.After(5 * time.Second):
			t.Fatalf("the upstream did not ask for event %d after the client left: cancelled?", i)
		}
	}
	var rem string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		// The probe costs 0 in the end: its header shows the bucket.
		if rem = s.get("/sse/x?tokens=0", "X-Tenant", "early").header.Get("X-Ratelimit-Remaining"); rem == "69" {
			break
		}
	}
	if rem != "69" {
		t.Errorf("after a client left before the usage event: remaining %s, want 69 (the 30 tokens drained, then the probe's 1)", rem)
	}

	// HEAD has no body: charged up front, not a missing cost.
	for range 3 {
		req, _ := http.NewRequest(http.MethodHead, s.base+"/sse/x?tokens=30", nil)
		req.Header.Set("X-Tenant", "head")
		res, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	// Nothing is missing a cost: the early leaver was drained, HEAD
	// answers are not counted.
	after := scrapeMetrics(t, s.base+"/metrics")
	for _, reason := range []string{"no_value", "client_gone"} {
		if d := after.value("caddy_rate_limit_cost_missing_total", "policy", "rv_sse", "reason", reason) - before.value("caddy_rate_limit_cost_missing_total", "policy", "rv_sse", "reason", reason); d != 0 {
			t.Errorf("cost_missing_total{policy=rv_sse,reason=%s} grew by %v, want 0", reason, d)
		}
	}
	for event, want := range map[string]float64{"started": 1, "completed": 1, "cut_time": 0, "cut_bytes": 0, "refused": 0} {
		if d := after.value("caddy_rate_limit_drains_total", "event", event) - before.value("caddy_rate_limit_drains_total", "event", event); d != want {
			t.Errorf("drains_total{event=%s} grew by %v, want %v", event, d, want)
		}
	}
}

// TestMeteredCostMissingCharges: a response without usage (a stream whose
// request did not ask for it) is charged what cost_missing says: a fixed
// number of units, or an estimate of 4 bytes per token of the request body
// and of the generated text; the default stays the up-front cost.
func TestMeteredCostMissingCharges(t *testing.T) {
	up := newLLMUpstream(t)
	s := startCaddy(t, "", `
	handle /metrics {
		metrics
	}
	rate_limit {
		tenant {http.request.header.X-Tenant}
		policy est {
			match {
				header X-Missing estimate
			}
			algorithm token_bucket
			limit 1000
			window 1h
			cost_after json usage.total_tokens
			cost_missing estimate
		}
		policy fixed {
			match {
				header X-Missing fixed
			}
			algorithm token_bucket
			limit 1000
			window 1h
			cost_after json usage.total_tokens
			cost_missing 500
		}
		policy upfront {
			match {
				header X-Missing upfront
			}
			algorithm token_bucket
			limit 1000
			window 1h
			cost_after json usage.total_tokens
		}
	}
	reverse_proxy `+up.addr, nil)
	body := `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Say hello to the world, please."}]}`
	post := func(tenant, missing string) http.Header {
		return s.post("/v1/chat/completions?tokens=30", body, "X-Tenant", tenant, "X-Missing", missing).header
	}
	// The generated text, as sent (escapes included): "" + "Hello" +
	// ` world \"usage\": 999`.
	text := len("Hello") + len(` world \"usage\": 999`)
	estimate := (len(body)+3)/4 + (text+3)/4
	for _, c := range []struct {
		missing string
		charged int
	}{{"estimate", estimate}, {"fixed", 500}, {"upfront", 1}} {
		post(c.missing, c.missing)
		// A probe that costs 1 up front and is then charged the same.
		rem := post(c.missing, c.missing).Get("X-Ratelimit-Remaining")
		if want := strconv.Itoa(1000 - c.charged - 1); rem != want {
			t.Errorf("cost_missing %s: remaining %s after one answer without usage, want %s (charged %d, then 1 up front)", c.missing, rem, want, c.charged)
		}
	}
}

// TestMeteredCompressedMemory measures the heap of 100 concurrent
// compressed answers of 50 MiB each (gzip, then zstd), metered (read
// through a decoder on the side) and not, and checks that a metered one
// costs at most its decoder's window and buffers. It takes a minute of
// both cores, so it runs only with TOLLGATE_MEASURE=1:
//
//	TOLLGATE_MEASURE=1 go test -run TestMeteredCompressedMemory -v .
func TestMeteredCompressedMemory(t *testing.T) {
	if os.Getenv("TOLLGATE_MEASURE") == "" {
		t.Skip("a measurement: set TOLLGATE_MEASURE=1")
	}
	const streams, size = 100, 50 << 20
	// Words drawn from a small vocabulary compress about 3 to 1, like text.
	rng := rand.New(rand.NewPCG(1, 2))
	words := strings.Fields("the a rate limit token bucket tenant request answer model stream usage upstream caddy redis fleet window quota")
	var plain bytes.Buffer
	plain.WriteString(`{"choices":[{"message":{"content":"`)
	for plain.Len() < size {
		plain.WriteString(words[rng.IntN(len(words))])
		plain.WriteByte(' ')
	}
	plain.WriteString(`"}}],"usage":{"total_tokens":30}}`)
	bodies := map[string][]byte{}
	for _, enc := range []string{"gzip", "zstd"} {
		var b bytes.Buffer
		var zw io.WriteCloser
		if enc == "gzip" {
			zw = gzip.NewWriter(&b)
		} else {
			zw, _ = zstd.NewWriter(&b)
		}
		zw.Write(plain.Bytes())
		zw.Close()
		bodies[enc] = b.Bytes()
	}
	plain = bytes.Buffer{}
	upstream := newHTTPServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		enc := path.Base(r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", enc)
		body := bodies[enc]
		for i := 0; i < len(body); i += 256 << 10 {
			w.Write(body[i:min(i+256<<10, len(body))])
		}
	}))
	s := startCaddy(t, "", `
	handle /m/* {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			policy m {
				algorithm fixed_window
				limit 1000000
				window 1h
				cost_after json usage.total_tokens
			}
		}
		reverse_proxy `+upstream+`
	}
	handle /u/* {
		reverse_proxy `+upstream+`
	}
	handle /metrics {
		metrics
	}`, nil)
	client := &http.Client{Transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: streams}}
	for _, enc := range []string{"gzip", "zstd"} {
		for _, metered := range []bool{false, true} {
			route := "/u/" + enc
			if metered {
				route = "/m/" + enc
			}
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			base := ms.HeapAlloc
			var peak atomic.Uint64
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				var m runtime.MemStats
				for {
					select {
					case <-stop:
						return
					case <-time.After(50 * time.Millisecond):
					}
					runtime.ReadMemStats(&m)
					if m.HeapAlloc > peak.Load() {
						peak.Store(m.HeapAlloc)
					}
				}
			}()
			start := time.Now()
			var wg sync.WaitGroup
			for i := range streams {
				wg.Go(func() {
					req, _ := http.NewRequest(http.MethodGet, s.base+route, nil)
					req.Header.Set("X-Tenant", fmt.Sprintf("%s-%d", enc, i))
					// Asked for: else the proxy's transport asks for gzip
					// itself and decompresses.
					req.Header.Set("Accept-Encoding", enc)
					res, err := client.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					defer res.Body.Close()
					if n, err := io.Copy(io.Discard, res.Body); err != nil || n != int64(len(bodies[enc])) {
						t.Errorf("read %d bytes (%v), want %d", n, err, len(bodies[enc]))
					}
				})
			}
			wg.Wait()
			close(stop)
			<-sampled
			growth := int64(peak.Load()) - int64(base)
			t.Logf("%s metered=%v: %d streams of %d MiB (%d MiB compressed) in %v; heap peak +%d MiB (%d KiB per stream)",
				enc, metered, streams, size>>20, len(bodies[enc])>>20, time.Since(start).Round(time.Millisecond), growth>>20, growth/streams>>10)
			if metered {
				after := scrapeMetrics(t, s.base+"/metrics")
				t.Logf("%s: %v answers not read (decoder windows over 256 MiB)", enc, after.value("caddy_rate_limit_cost_missing_total", "policy", "m", "reason", "compressed"))
				// An answer alone is read to its usage.
				rem := s.get("/m/"+enc, "X-Tenant", enc+"-0").header.Get("X-Ratelimit-Remaining")
				if rem != strconv.Itoa(1000000-30-1) {
					t.Errorf("%s: remaining %s after one answer, want %d", enc, rem, 1000000-31)
				}
			}
		}
	}
}
