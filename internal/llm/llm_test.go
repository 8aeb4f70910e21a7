package llm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/usage"
)

func TestWithUsage(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"model":"m","stream":true}`, `{"stream_options":{"include_usage":true},"model":"m","stream":true}`},
		{` {"stream":true,"stream_options":null}`, ` {"stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream":true,"stream_options":{}}`, `{"stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream":true,"stream_options":{ }}`, `{"stream":true,"stream_options":{ "include_usage":true}}`},
		{`{"stream":true,"stream_options":{"include_usage":false}}`, `{"stream":true,"stream_options":{"include_usage":false,"include_usage":true}}`},
		{`{"stream":true,"x":{"stream_options":1},"stream_options" : {"a":"}"} }`, `{"stream":true,"x":{"stream_options":1},"stream_options" : {"a":"}","include_usage":true} }`},
		{`{"stream":true,"stream_options":{"include_usage":false}}`, `{"stream":true,"stream_options":{"include_usage":false,"include_usage":true}}`},
	} {
		got, ok := WithUsage([]byte(tc.in))
		if !ok || string(got) != tc.want {
			t.Errorf("WithUsage(%s) = %s, %v; want %s", tc.in, got, ok, tc.want)
			continue
		}
		req, ok := ParseRequest(got)
		if !ok || !req.Stream || !req.IncludeUsage {
			t.Errorf("WithUsage(%s) = %s: parsed as %+v", tc.in, got, req)
		}
	}
	if got, ok := WithUsage([]byte(`{"stream":true,"stream_options":"x"}`)); ok || string(got) != `{"stream":true,"stream_options":"x"}` {
		t.Errorf("a string stream_options: %s, %v; want it unchanged", got, ok)
	}
}

func TestParseRequest(t *testing.T) {
	for _, tc := range []struct {
		body string
		want Request
		ok   bool
	}{
		{`{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true}}`, Request{"gpt-4o", true, true}, true},
		{`{"model":7,"stream":"no"}`, Request{}, true},
		// Exact names, the last of duplicates, lenient truth.
		{`{"model":"gpt-4o","Model":"cheap"}`, Request{Model: "gpt-4o"}, true},
		{`{"stream":true,"STREAM":false}`, Request{Stream: true}, true},
		{`{"model":"a","model":"b","stream":1}`, Request{Model: "b", Stream: true}, true},
		{`{"stream":"true","stream_options":{"include_usage":1}}`, Request{Stream: true, IncludeUsage: true}, true},
		// What pydantic's bool takes for true (vLLM, SGLang, LiteLLM).
		{`{"stream":"on","stream_options":{"include_usage":"YES"}}`, Request{Stream: true, IncludeUsage: true}, true},
		{`{"stream":"t"}`, Request{Stream: true}, true},
		{`{"stream":"Y"}`, Request{Stream: true}, true},
		{`{"stream":1.0}`, Request{Stream: true}, true},
		{`{"stream":1e0}`, Request{Stream: true}, true},
		{`{"stream":"\u0074rue"}`, Request{Stream: true}, true},
		{`{"stream":2}`, Request{}, true},
		{`{"stream":"off"}`, Request{}, true},
		{`{"stream":" true"}`, Request{}, true},
		{`{"stream":null}`, Request{}, true},
		{`[1]`, Request{}, false},
		{`{"model":"m"`, Request{}, false},
		{`not json`, Request{}, false},
	} {
		got, ok := ParseRequest([]byte(tc.body))
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParseRequest(%s) = %+v, %v; want %+v, %v", tc.body, got, ok, tc.want, tc.ok)
		}
	}
}

// chunk is an OpenAI stream chunk as sent with include_usage (usage null)
// or without.
func chunk(content string, withUsage bool) string {
	c, _ := json.Marshal(content)
	s := `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":` + string(c) + `},"finish_reason":null}]`
	if withUsage {
		s += `,"usage":null`
	}
	return "data: " + s + "}\n\n"
}

func stream(withUsage bool, eol string) string {
	var b strings.Builder
	for _, w := range []string{"", "Hello", " \"usage\":null, world", "!"} {
		b.WriteString(chunk(w, withUsage))
	}
	b.WriteString(": keep-alive\n\n")
	if withUsage {
		b.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}` + "\n\n")
	}
	b.WriteString("data: [DONE]\n\n")
	return strings.ReplaceAll(b.String(), "\n", eol)
}

func TestUsageStripper(t *testing.T) {
	for _, eol := range []string{"\n", "\r\n", "\r"} {
		in, want := stream(true, eol), stream(false, eol)
		for size := 1; size <= len(in); size++ {
			var out bytes.Buffer
			var s UsageStripper
			s.Reset(&out)
			for rest := in; len(rest) > 0; {
				k := min(size, len(rest))
				if n, err := s.Write([]byte(rest[:k])); n != k || err != nil {
					t.Fatalf("Write: %d, %v", n, err)
				}
				rest = rest[k:]
			}
			s.Close()
			if out.String() != want {
				t.Fatalf("eol %q, chunks of %d:\n got %q\nwant %q", eol, size, out.String(), want)
			}
		}
	}
}

func TestUsageStripperLeaves(t *testing.T) {
	for _, ev := range []string{
		"data: {\"usage\":{\"total_tokens\":1},\"choices\":[{\"index\":0}]}\n\n", // usage beside choices
		"data: {\"a\":1}\ndata: {\"usage\":null}\n\n",                            // two data lines
		"event: x\ndata: {\"usage\":null}\n\n",
		"data: {\"usage\":null\n\n", // not JSON
		"data: [DONE]\n\n",
		"data: {\"x\":\"usage\"}\n\n",
		"data: {\"usage\":null,\"choices\":[]}",                            // no end: held, then written as is
		"data: {\"choices\":[],\"usage\":{\"total_tokens\":3}}\nid: 7\n\n", // another field: not an event of one line
	} {
		var out bytes.Buffer
		var s UsageStripper
		s.Reset(&out)
		s.Write([]byte(ev))
		s.Close()
		if out.String() != ev {
			t.Errorf("%q became %q", ev, out.String())
		}
	}
	var out bytes.Buffer
	var s UsageStripper
	// Events separated by more than one empty line: each edited alike.
	s.Reset(&out)
	s.Write([]byte("data: {\"a\":1,\"usage\":null}\n\n\ndata: {\"b\":2,\"usage\":null}\n\n\n\ndata: {\"choices\":[],\"usage\":{\"total_tokens\":3}}\n\n"))
	s.Close()
	if want := "data: {\"a\":1}\n\n\ndata: {\"b\":2}\n\n\n\n"; out.String() != want {
		t.Errorf("extra empty lines: %q, want %q", out.String(), want)
	}
	out.Reset()
	s.Reset(&out)
	s.Write([]byte("data: {\"usage\":null,\"a\":1}\n\n"))
	if out.String() != "data: {\"a\":1}\n\n" {
		t.Errorf("usage first: %q", out.String())
	}
	// A giant event passes on as is once it outgrows MaxEvent, and so
	// does the rest.
	out.Reset()
	s.Reset(&out)
	big := "data: {\"c\":\"" + strings.Repeat("x", MaxEvent) + "\",\"usage\":null}\n\n"
	s.Write([]byte(big[:MaxEvent+1]))
	s.Write([]byte(big[MaxEvent+1:]))
	s.Write([]byte(chunk("a", true)))
	s.Close()
	if out.String() != big+chunk("a", true) {
		t.Errorf("after a giant event: %d bytes, want %d as sent", out.Len(), len(big)+len(chunk("a", true)))
	}
}

// TestUsageStripperLinear checks that the stripper's time is linear in
// the stream: an event held while it arrives in small writes was scanned
// again from its start at each write, and the events of one write moved
// the rest of it down one by one; a 256 KiB event byte by byte took 35 s,
// 512 KiB of empty lines in one write 5 s.
func TestUsageStripperLinear(t *testing.T) {
	const size = 256 << 10
	budget := 2 * time.Second
	var s UsageStripper
	s.Reset(io.Discard)
	ev := []byte("data: {\"c\":\"" + strings.Repeat("x", size) + "\",\"usage\":null}\r\n\r\n")
	start := time.Now()
	for i := range ev {
		s.Write(ev[i : i+1])
		if i%4096 == 0 && time.Since(start) > budget {
			t.Fatalf("an event of %d bytes, byte by byte: %d bytes in %v", len(ev), i, time.Since(start))
		}
	}
	s.Reset(io.Discard)
	start = time.Now()
	s.Write(bytes.Repeat([]byte("\n"), 2*size))
	if d := time.Since(start); d > budget {
		t.Fatalf("%d empty lines in one write: %v", 2*size, d)
	}
}

func TestTokens(t *testing.T) {
	for _, tc := range []struct {
		p    Provider
		body string
		sse  bool
		want Tokens
		ok   bool
	}{
		{OpenAI, `{"usage":{"prompt_tokens":100,"completion_tokens":20,"total_tokens":120,"prompt_tokens_details":{"cached_tokens":60}}}`, false, Tokens{100, 20, 60}, true},
		{OpenAI, stream(true, "\n"), true, Tokens{9, 4, 0}, true},
		{OpenAI, stream(false, "\n"), true, Tokens{}, false},
		{OpenAI, `{"usage":{"input_tokens":50,"output_tokens":5,"input_tokens_details":{"cached_tokens":10}}}`, false, Tokens{50, 5, 10}, true},
		{OpenAI, "data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":7,\"output_tokens\":3}}}\n\n", true, Tokens{7, 3, 0}, true},
		{OpenAI, `{"usage":{"prompt_tokens":0,"completion_tokens":0}}`, false, Tokens{}, true},
		{Anthropic, `{"usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":100,"cache_creation_input_tokens":20}}`, false, Tokens{130, 5, 100}, true},
		// Cut after message_start: its output_tokens 1 is a placeholder.
		{Anthropic, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n", true, Tokens{}, false},
		{Anthropic, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1,\"cache_read_input_tokens\":5}}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n", true, Tokens{30, 15, 5}, true},
	} {
		var e usage.Extractor
		f := usage.JSON
		if tc.sse {
			f = usage.SSE
		}
		e.Reset(tc.p.Paths(), f)
		e.Write([]byte(tc.body))
		got, ok := tc.p.Tokens(&e)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s %.60q: %+v %v, want %+v %v", tc.p, tc.body, got, ok, tc.want, tc.ok)
		}
	}
	_ = fmt.Sprint()
}

func TestPrices(t *testing.T) {
	table := NewPrices([]PriceEntry{
		{"gpt-4o*", Price{2500, 10000, 1250}},
		{"gpt-4o-mini*", Price{150, 600, 75}}, // never reached by a glob: gpt-4o* comes first
		{"gpt-4o-mini", Price{150, 600, 75}},
		{"*", Price{1, 2, 1}},
		{"claude-?-haiku", Price{80, 400, 8}},
		{"openai/*", Price{3, 3, 3}},
	})
	for _, tc := range []struct {
		model string
		want  Price
	}{
		{"gpt-4o-mini", Price{150, 600, 75}},
		{"gpt-4o-2024-08-06", Price{2500, 10000, 1250}},
		{"gpt-4o-mini-2024", Price{2500, 10000, 1250}},
		{"gpt-4o*-mini", Price{2500, 10000, 1250}}, // a '*' in the model is matched by the glob's, not as a letter
		{"claude-3-haiku", Price{80, 400, 8}},
		{"openai/gpt-x/y", Price{3, 3, 3}},
		{"llama", Price{1, 2, 1}},
		{"", Price{1, 2, 1}},
	} {
		if got, ok := table.Lookup(tc.model); !ok || got != tc.want {
			t.Errorf("%q: %+v %v, want %+v", tc.model, got, ok, tc.want)
		}
	}
	if _, ok := NewPrices([]PriceEntry{{"gpt-*", Price{}}}).Lookup("claude"); ok {
		t.Error("no default: an unknown model has a price")
	}
	// A name longer than MaxModel is not looked up, not even for the
	// default: a megabyte of '-mini-2024-07-1' took 30 ms per glob.
	long := "gpt-4o" + strings.Repeat("-mini-2024-07-1", (4<<20)/15)
	if got, ok := table.Lookup(long); ok {
		t.Errorf("a %d-byte model name: priced %+v", len(long), got)
	}
	if _, ok := table.Lookup("gpt-4o" + strings.Repeat("x", MaxModel-6)); !ok {
		t.Errorf("a model name of MaxModel bytes is not priced")
	}
	p := Price{Input: 2500, Output: 10000, Cached: 1250}
	if got, want := p.Cost(Tokens{Input: 1000, Output: 200, Cached: 600}), int64(400*2500+600*1250+200*10000); got != want {
		t.Errorf("Cost: %d, want %d", got, want)
	}
	if got := p.Cost(Tokens{Input: 1 << 62, Output: 1}); got != usage.MaxCost {
		t.Errorf("Cost of a huge count: %d, want MaxCost", got)
	}
}
