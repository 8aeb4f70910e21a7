package surface

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/tollgate/caddy-tollgate/internal/caddyreq"
	"github.com/tollgate/caddy-tollgate/internal/llm"
)

// TestInspectLLMRequestLenient: a request body is read as leniently as
// the OpenAI-compatible servers written in Python read it, so that a
// client cannot ask them for a stream, or name a model, that Tollgate
// does not see: pydantic's true ("on", "yes", 1.0) asks for a stream
// (and gets include_usage set), JSON after a UTF-8 byte order mark is
// read (and passed on without it), and JSON in UTF-16 or UTF-32, which
// Python's json reads too, is refused. (A stream asked for with "on"
// went without include_usage and was charged an estimate; a body with a
// byte order mark was priced at the default price.)
func TestInspectLLMRequestLenient(t *testing.T) {
	utf16le := func(s string) string {
		var b bytes.Buffer
		for _, u := range utf16.Encode([]rune(s)) {
			b.WriteByte(byte(u))
			b.WriteByte(byte(u >> 8))
		}
		return b.String()
	}
	const chat = `{"model":"gpt-4o","stream":true,"messages":[]}`
	for _, tc := range []struct {
		name, body, ct string
		result, model  string
		forwarded      string // "" means: the body as sent
	}{
		{"stream on", `{"model":"gpt-4o","stream":"on","messages":[]}`, "application/json", llmUsageRequested, "gpt-4o", `{"stream_options":{"include_usage":true},"model":"gpt-4o","stream":"on","messages":[]}`},
		{"include_usage yes", `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":"yes"}}`, "application/json", llmRead, "gpt-4o", ""},
		{"byte order mark", "\xef\xbb\xbf" + chat, "application/json", llmUsageRequested, "gpt-4o", `{"stream_options":{"include_usage":true},"model":"gpt-4o","stream":true,"messages":[]}`},
		{"utf-16", "\xff\xfe" + utf16le(chat), "application/json", llmNotUTF8, "", ""},
		{"utf-16 without a mark", utf16le(chat), "", llmNotUTF8, "", ""},
		{"a binary upload", "\x00\x01binary", "application/octet-stream", llmNotJSON, "", ""},
		{"multipart", "--x\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\n\xef\xbb\xbfdata\r\n--x--\r\n", "multipart/form-data; boundary=x", llmNotJSON, "", ""},
	} {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(tc.body))
		if tc.ct != "" {
			r.Header.Set("Content-Type", tc.ct)
		}
		r.Header.Set("Content-Length", strconv.Itoa(len(tc.body)))
		st := &requestState{bodyLen: -1}
		h := &Server{}
		if got := h.inspectLLMRequest(r, st, llm.OpenAI); got != tc.result {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.result)
		}
		if st.model != tc.model {
			t.Errorf("%s: model %q, want %q", tc.name, st.model, tc.model)
		}
		want := tc.forwarded
		if want == "" {
			want = tc.body
		}
		if got, _ := io.ReadAll(r.Body); string(got) != want {
			t.Errorf("%s: forwarded\n%q\nwant\n%q", tc.name, got, want)
		}
		if tc.forwarded != "" && (r.ContentLength != int64(len(want)) || r.Header.Get("Content-Length") != strconv.Itoa(len(want))) {
			t.Errorf("%s: Content-Length %d, header %q, want %d", tc.name, r.ContentLength, r.Header.Get("Content-Length"), len(want))
		}
	}
}

// TestLLMBodiesBounded: the preset request bodies the process holds are
// bounded all together: a request whose body would take them past
// maxLLMBodies is refused with 503 and Retry-After: 1, and every body is
// given back when its request ends, refused or not. (Each request held up
// to 4 MiB, with no bound on how many.)
func TestLLMBodiesBounded(t *testing.T) {
	h := provisionServer(t, `{"tenant":"{http.request.header.X-Tenant}","rate_limits":{"tokens":{"algorithm":"token_bucket","max_events":1000000,"window":60000000000,"cost_after":{"preset":"openai"}}}}`)
	post := func(body string) (int, http.Header) {
		t.Helper()
		r := caddyreq.New(httptest.NewRecorder(), "acme")
		r.Method, r.Body, r.ContentLength = http.MethodPost, io.NopCloser(strings.NewReader(body)), int64(len(body))
		r.URL.Path = "/v1/chat/completions"
		w := httptest.NewRecorder()
		err := h.ServeHTTP(w, r, caddyreq.OK)
		var he caddyhttp.HandlerError
		if errors.As(err, &he) {
			return he.StatusCode, w.Header()
		}
		if err != nil {
			t.Fatal(err)
		}
		return w.Code, w.Header()
	}
	body := `{"model":"gpt-4o","stream":true,"messages":[]}`
	before := llmBodies.Load()
	if code, _ := post(body); code != http.StatusOK {
		t.Fatalf("status %d, want 200", code)
	}
	if got := llmBodies.Load(); got != before {
		t.Errorf("bodies held %d after the request ended, want %d", got, before)
	}
	llmBodies.Add(maxLLMBodies - 10) // others hold nearly all
	t.Cleanup(func() { llmBodies.Add(-(maxLLMBodies - 10)) })
	code, hdr := post(body)
	if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") != "1" {
		t.Errorf("a body past the bound: status %d, Retry-After %q; want 503, 1", code, hdr.Get("Retry-After"))
	}
	if got := llmBodies.Load(); got != before+maxLLMBodies-10 {
		t.Errorf("bodies held %d after the refused request, want %d", got, before+maxLLMBodies-10)
	}
}

// TestLongModelRefused: a model name longer than llm.MaxModel is refused
// with 400 where a price table would look it up, before anything is
// charged, rather than matched against every glob (milliseconds of CPU
// for a megabyte-long name) or priced at the default.
func TestLongModelRefused(t *testing.T) {
	h := provisionServer(t, `{"tenant":"{http.request.header.X-Tenant}","rate_limits":{"dollars":{"algorithm":"token_bucket","max_events":1000000,"window":60000000000,
		"cost_after":{"preset":"openai"},"prices":[{"model":"gpt-4o*","input":100,"output":100},{"model":"*","input":1,"output":1}]}}}`)
	for _, tc := range []struct {
		model string
		want  int
	}{{"gpt-4o" + strings.Repeat("-x", 125), http.StatusOK}, {"gpt-4o" + strings.Repeat("-x", 126), http.StatusBadRequest}} {
		body := `{"model":"` + tc.model + `","messages":[]}`
		r := caddyreq.New(httptest.NewRecorder(), "long-model")
		r.Method, r.Body, r.ContentLength = http.MethodPost, io.NopCloser(strings.NewReader(body)), int64(len(body))
		r.URL.Path = "/v1/chat/completions"
		w := httptest.NewRecorder()
		code := http.StatusOK
		var he caddyhttp.HandlerError
		if err := h.ServeHTTP(w, r, caddyreq.OK); errors.As(err, &he) {
			code = he.StatusCode
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.want {
			t.Errorf("a model name of %d bytes: status %d, want %d", len(tc.model), code, tc.want)
		}
	}
}
