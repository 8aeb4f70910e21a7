package usage

import (
	"fmt"
	"strings"
	"testing"
)

// result is what an Extractor reports for a body.
type result struct {
	cost int64
	ok   bool
}

func (r result) String() string {
	if !r.ok {
		return "none"
	}
	return fmt.Sprint(r.cost)
}

// found and none build expected results.
func found(c int64) result { return result{c, true} }

var none = result{}

// mustPaths parses expr or fails the test.
func mustPaths(t testing.TB, expr string) *Paths {
	t.Helper()
	p, err := ParsePaths(expr)
	if err != nil {
		t.Fatalf("ParsePaths(%q): %v", expr, err)
	}
	return &p
}

// extractChunks scans body in chunks of size bytes (all of it when size <= 0).
func extractChunks(e *Extractor, p *Paths, f Format, body []byte, size int) result {
	e.Reset(p, f)
	if size <= 0 {
		size = len(body) + 1
	}
	for len(body) > 0 {
		k := min(size, len(body))
		e.Write(body[:k])
		body = body[k:]
	}
	c, ok := e.Cost()
	return result{c, ok}
}

// extractSplit scans body as two chunks, split at at.
func extractSplit(e *Extractor, p *Paths, f Format, body []byte, at int) result {
	e.Reset(p, f)
	e.Write(body[:at])
	e.Write(body[at:])
	c, ok := e.Cost()
	return result{c, ok}
}

// extractCase is one body, one cost expression, and the expected result.
type extractCase struct {
	name  string
	paths string
	body  string
	want  result
}

// checkCases runs each case in one chunk, in chunks of 1, 2, 3 and 7 bytes
// and in two chunks at every split point, with one Extractor reused
// throughout (as a pool would), and compares each run with want.
func checkCases(t *testing.T, f Format, cases []extractCase) {
	t.Helper()
	var e Extractor
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := mustPaths(t, tc.paths)
			body := []byte(tc.body)
			if got := extractChunks(&e, p, f, body, 0); got != tc.want {
				t.Fatalf("one chunk: got %v, want %v\nbody: %q", got, tc.want, tc.body)
			}
			for _, size := range []int{1, 2, 3, 7} {
				if got := extractChunks(&e, p, f, body, size); got != tc.want {
					t.Fatalf("chunks of %d: got %v, want %v", size, got, tc.want)
				}
			}
			for at := 0; at <= len(body); at++ {
				if got := extractSplit(&e, p, f, body, at); got != tc.want {
					t.Fatalf("split at %d (%q | %q): got %v, want %v", at, body[:at], body[at:], got, tc.want)
				}
			}
		})
	}
}

// openAICompletion is a chat completion response body, pretty-printed.
const openAICompletion = `{
  "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
  "object": "chat.completion",
  "created": 1741570283,
  "model": "gpt-4o-2024-08-06",
  "choices": [
    {
      "index": 0,
      "message": {
        "role": "assistant",
        "content": "The image shows a wooden boardwalk \"path\" through\na lush green field \\ caf\u00e9 \ud83d\ude00.",
        "refusal": null,
        "annotations": []
      },
      "logprobs": null,
      "finish_reason": "stop",
      "usage": {"total_tokens": 999}
    }
  ],
  "usage": {
    "prompt_tokens": 1117,
    "completion_tokens": 46,
    "total_tokens": 1163,
    "prompt_tokens_details": {
      "cached_tokens": 0,
      "audio_tokens": 0
    },
    "completion_tokens_details": {
      "reasoning_tokens": 0,
      "audio_tokens": 0,
      "accepted_prediction_tokens": 0,
      "rejected_prediction_tokens": 0
    }
  },
  "service_tier": "default",
  "system_fingerprint": "fp_fc9f1d7035"
}
`

func TestExtractJSON(t *testing.T) {
	checkCases(t, JSON, jsonCases())
}

// jsonCases are the JSON bodies of TestExtractJSON (and seeds of
// FuzzExtractor).
func jsonCases() []extractCase {
	long := strings.Repeat("7", 1000)
	seg64 := strings.Repeat("k", 64)
	deep := func(levels int) string { // levels of arrays under the root object
		return `{"deep":` + strings.Repeat("[", levels) + strings.Repeat("]", levels) +
			`,"usage":{"total_tokens":5}}`
	}
	return []extractCase{
		// A real response.
		{"openai total", "usage.total_tokens", openAICompletion, found(1163)},
		{"openai sum", "usage.prompt_tokens+usage.completion_tokens", openAICompletion, found(1163)},
		{"openai prompt", "usage.prompt_tokens", openAICompletion, found(1117)},
		{"openai nested", "usage.prompt_tokens_details.cached_tokens+usage.completion_tokens", openAICompletion, found(46)},
		{"openai absent", "usage.input_tokens", openAICompletion, none},
		{"openai object at path", "usage+usage.completion_tokens", openAICompletion, found(46)},
		{"openai compact", "usage.total_tokens", `{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`, found(3)},

		// Matching through objects only, from the root.
		{"one segment", "tokens", `{"tokens":8}`, found(8)},
		{"deeper than the path", "usage.total_tokens", `{"data":{"usage":{"total_tokens":5}}}`, none},
		{"path continues below a member", "usage.total_tokens", `{"usage":{"x":{"total_tokens":5}}}`, none},
		{"object at the path", "usage.total_tokens", `{"usage":{"total_tokens":{"total_tokens":5}}}`, none},
		{"not a prefix", "usage.total_tokens", `{"usagex":{"total_tokens":1},"usag":{"total_tokens":2},"usage":{"total_token":3,"total_tokens_":4}}`, none},
		{"siblings", "a.b.c+a.b.d+a.e", `{"a":{"b":{"c":1,"x":{"c":100},"d":2},"e":4,"b2":{"c":8}}}`, found(7)},
		{"same key at other depths", "a.a.a", `{"a":{"b":{"a":{"a":1}},"a":{"b":2,"a":3}}}`, found(3)},
		{"empty key", "usage.total_tokens", `{"":{"total_tokens":1},"usage":{"":2,"total_tokens":3}}`, found(3)},
		{"path of 8 segments", "a.b.c.d.e.f.g.h", `{"a":{"b":{"c":{"d":{"e":{"f":{"g":{"h":9,"i":{"j":1}}}}}}}}}`, found(9)},
		{"64-byte key", seg64 + ".n", `{"` + seg64 + `":{"n":3}}`, found(3)},
		{"65-byte key", seg64 + ".n", `{"` + seg64 + `k":{"n":3}}`, none},
		{"long key", "a.n", `{"` + strings.Repeat("a", 500) + `":{"n":3}}`, none},

		// Arrays.
		{"inside array", "usage.total_tokens", `{"choices":[{"usage":{"total_tokens":5}}]}`, none},
		{"array at the path", "usage.total_tokens", `{"usage":[{"total_tokens":5}]}`, none},
		{"array value", "usage.total_tokens", `{"usage":{"total_tokens":[5]}}`, none},
		{"after arrays", "usage.total_tokens", `{"a":[1,[2,{"usage":{"total_tokens":3}}],[],{}],"usage":{"total_tokens":4}}`, found(4)},
		{"array of numbers", "n", `{"x":[1e5,-2,0.5,true,null,"s",[[]]],"n":6}`, found(6)},

		// Duplicates: the last valid value wins.
		{"duplicate objects", "usage.total_tokens", `{"usage":{"total_tokens":5},"usage":{"total_tokens":6}}`, found(6)},
		{"duplicate members", "usage.total_tokens", `{"usage":{"total_tokens":5,"total_tokens":7}}`, found(7)},
		{"invalid after valid", "usage.total_tokens", `{"usage":{"total_tokens":5,"total_tokens":"x"},"usage":{"total_tokens":-1},"usage":null}`, found(5)},
		{"valid after invalid", "usage.total_tokens", `{"usage":{"total_tokens":null},"usage":{"total_tokens":9}}`, found(9)},

		// Escaped keys are compared unescaped.
		{"escaped letter", "usage.total_tokens", `{"us\u0061ge":{"total\u005Ftokens":5}}`, found(5)},
		{"escaped quote", `us"age.x\y`, `{"us\"age":{"x\\y":3}}`, found(3)},
		{"escaped slash", "a/b", `{"a\/b":3}`, found(3)},
		{"escaped controls", "a\bb", `{"a\bb":3,"a\fb":1,"x\n\r\t":1}`, found(3)},
		{"escaped utf-8", "café", `{"caf\u00e9":3}`, found(3)},
		{"raw utf-8", "café", `{"café":3}`, found(3)},
		{"surrogate pair", "😀", `{"\ud83d\ude00":3}`, found(3)},
		{"lone high surrogate", "\uFFFDx", `{"\ud83dx":3}`, found(3)},
		{"lone low surrogate", "\uFFFD", `{"\ude00":3}`, found(3)},
		{"high surrogate then escape", "\uFFFD/", `{"\ud83d\/":3}`, found(3)},
		{"two high surrogates", "\uFFFD😀", `{"\ud83d\ud83d\ude00":3}`, found(3)},
		{"high surrogate at the end", "\uFFFD", `{"\ud83d":3}`, found(3)},
		{"escaped key mismatch", "usage", `{"us\u0062ge":3}`, none},
		{"invalid escape in key", "ab", `{"a\qb":3,"ab":4}`, found(4)},
		{"invalid hex in key", "ab", `{"a\u00zb":3,"ab":4}`, found(4)},
		{"escapes in skipped strings", "n", `{"s":"\"\\\"\\","\"":"}","n":2}`, found(2)},

		// Numbers.
		{"zero", "n", `{"n":0}`, found(0)},
		{"negative zero", "n", `{"n":-0.0e5}`, found(0)},
		{"zero fraction", "n", `{"n":0.000}`, found(0)},
		{"fraction rounds up", "n", `{"n":12.2}`, found(13)},
		{"whole fraction", "n", `{"n":12.000}`, found(12)},
		{"small fraction", "n", `{"n":0.0001}`, found(1)},
		{"exponent", "n", `{"n":1e3}`, found(1000)},
		{"exponent plus", "n", `{"n":1E+2}`, found(100)},
		{"fraction exponent", "n", `{"n":1.55e1}`, found(16)},
		{"negative exponent", "n", `{"n":123e-2}`, found(2)},
		{"tiny", "n", `{"n":1e-400}`, found(1)},
		{"zero huge exponent", "n", `{"n":0e999999999999999999999}`, found(0)},
		{"max", "n", `{"n":9007199254740991}`, found(MaxCost)},
		{"max plus one", "n", `{"n":9007199254740992}`, found(MaxCost)},
		{"below max rounds up", "n", `{"n":9007199254740989.5}`, found(9007199254740990)},
		{"1e15", "n", `{"n":1e15}`, found(1_000_000_000_000_000)},
		{"1e16 clamps", "n", `{"n":1e16}`, found(MaxCost)},
		{"1e400 clamps", "n", `{"n":1e400}`, found(MaxCost)},
		{"huge exponent clamps", "n", `{"n":1e99999999999999999999999999}`, found(MaxCost)},
		{"30 digits clamp", "n", `{"n":123456789012345678901234567890}`, found(MaxCost)},
		{"1000 digits clamp", "n", `{"n":` + long + `}`, found(MaxCost)},
		{"1000 digits scaled down", "n", `{"n":` + long + `e-996}`, found(7778)},
		{"1000 fraction digits", "n", `{"n":0.` + strings.Repeat("0", 1000) + `1}`, found(1)},
		{"sticky fraction", "n", `{"n":1.0000000000000000000000000001}`, found(2)},
		{"sticky exact", "n", `{"n":1.00000000000000000000000000000}`, found(1)},
		{"long mantissa exponent", "n", `{"n":12345678901234567890.5e-10}`, found(1234567891)},
		{"long mantissa", "n", `{"n":12345678901234567890e-10}`, found(1234567891)},
		{"exact long mantissa", "n", `{"n":12345678900000000000e-10}`, found(1234567890)},
		{"sum clamps", "a+b", `{"a":9007199254740991,"b":9007199254740991}`, found(MaxCost)},

		// Invalid values.
		{"negative", "n", `{"n":-1}`, none},
		{"negative fraction", "n", `{"n":-0.5}`, none},
		{"string", "n", `{"n":"12"}`, none},
		{"null", "n", `{"n":null}`, none},
		{"true", "n", `{"n":true}`, none},
		{"false", "n", `{"n":false}`, none},
		{"object", "n", `{"n":{"n":1}}`, none},
		{"array", "n", `{"n":[1]}`, none},
		{"one invalid of two", "a+b", `{"a":-1,"b":2}`, found(2)},

		// Malformed and truncated documents.
		{"malformed after", "usage.total_tokens", `{"usage":{"total_tokens":5}, oops, "usage":{"total_tokens":6}}`, found(5)},
		{"malformed before", "usage.total_tokens", `{"oops" "usage":{"total_tokens":5}}`, none},
		{"bare key", "usage.total_tokens", `{usage:{"total_tokens":5}}`, none},
		{"trailing comma", "n", `{"a":[1,],"n":5}`, none},
		{"trailing comma in object", "n", `{"a":{"b":1,},"n":5}`, none},
		{"mismatched bracket", "n", `{"a":[1},"n":5}`, none},
		{"mismatched brace", "n", `{"a":{"b":1],"n":5}`, none},
		{"leading zero", "n", `{"a":01,"n":5}`, none},
		{"bad literal", "n", `{"a":nul,"n":5}`, none},
		{"literal suffix", "n", `{"a":truex,"n":5}`, none},
		{"bad fraction", "n", `{"a":1.,"n":5}`, none},
		{"bad exponent", "n", `{"a":1e,"n":5}`, none},
		{"bad exponent sign", "n", `{"a":1e+,"n":5}`, none},
		{"double fraction", "n", `{"a":1.2.3,"n":5}`, none},
		{"lone minus", "n", `{"a":-,"n":5}`, none},
		{"plus", "n", `{"a":+1,"n":5}`, none},
		{"number then garbage", "n", `{"n":5x}`, found(5)},
		{"trailing garbage", "n", `{"n":5}garbage`, found(5)},
		{"second document", "n", `{"n":5} {"n":6}`, found(5)},
		{"truncated in number", "n", `{"n":5`, none},
		{"truncated after number", "n", `{"n":5 `, found(5)},
		{"truncated after value", "n", `{"n":5,"x":"abc`, found(5)},
		{"truncated in key", "n", `{"n":5,"n`, found(5)},
		{"empty", "n", ``, none},
		{"whitespace only", "n", " \n\t\r ", none},
		{"root array", "n", `[{"n":5}]`, none},
		{"root string", "n", `"{\"n\":5}"`, none},
		{"root number", "n", `5`, none},
		{"depth 64", "usage.total_tokens", deep(63), found(5)},
		{"depth 65", "usage.total_tokens", deep(64), found(5)},
		{"depth 1000", "usage.total_tokens", deep(1000), found(5)},
		{"usage after 200 nested objects", "usage.total_tokens", `{"tool":` + strings.Repeat(`{"a":`, 200) + `1` + strings.Repeat("}", 200) + `,"usage":{"total_tokens":5}}`, found(5)},
		{"brackets in deep strings", "usage.total_tokens", `{"d":` + strings.Repeat("[", 70) + `"]}\"]]]", {"k]":"[{"}` + strings.Repeat("]", 70) + `,"usage":{"total_tokens":5}}`, found(5)},
		{"usage inside a deep value", "usage.total_tokens", `{"d":` + strings.Repeat("[", 70) + `{"usage":{"total_tokens":9}}` + strings.Repeat("]", 70) + `}`, none},
		{"truncated in a deep value", "usage.total_tokens", `{"usage":{"total_tokens":5},"d":` + strings.Repeat("[", 70), found(5)},
		{"depth 64 objects", "usage.total_tokens", `{"usage":{"total_tokens":5},"d":` + strings.Repeat(`{"d":`, 62) + `1` + strings.Repeat("}", 63), found(5)},
		{"byte order mark", "n", "\xEF\xBB\xBF{\"n\":5}", found(5)},
		{"partial byte order mark", "n", "\xEF\xBB{\"n\":5}", none},
		{"whitespace everywhere", "a.b", " \r\n\t{ \"a\" \n: { \"b\"\t:\r7 , \"c\" : [ 1 , 2 ] } }", found(7)},
	}
}

// openAIStream is a streamed chat completion with include_usage.
const openAIStream = `data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"content":" there: \"usage\": {\"total_tokens\": 1}\n"},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}

data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21,"prompt_tokens_details":{"cached_tokens":0}}}

data: [DONE]

`

// anthropicStream is a streamed Messages API response.
const anthropicStream = `event: message_start
data: {"type":"message_start","message":{"id":"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"!"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}

event: message_stop
data: {"type":"message_stop"}

`

func TestExtractSSE(t *testing.T) {
	checkCases(t, SSE, sseCases())
}

// sseCases are the event-stream bodies of TestExtractSSE (and seeds of
// FuzzExtractor).
func sseCases() []extractCase {
	crlf := strings.ReplaceAll(openAIStream, "\n", "\r\n")
	cr := strings.ReplaceAll(openAIStream, "\n", "\r")
	ev := func(n int) string { return fmt.Sprintf("data: {\"usage\":{\"total_tokens\":%d}}\n\n", n) }
	return []extractCase{
		{"openai total", "usage.total_tokens", openAIStream, found(21)},
		{"openai sum", "usage.prompt_tokens+usage.completion_tokens", openAIStream, found(21)},
		{"openai absent", "usage.input_tokens", openAIStream, none},
		{"anthropic", "message.usage.input_tokens+usage.output_tokens", anthropicStream, found(40)},
		{"anthropic input", "message.usage.input_tokens", anthropicStream, found(25)},
		{"anthropic output", "usage.output_tokens", anthropicStream, found(15)},
		{"anthropic start output", "message.usage.output_tokens", anthropicStream, found(1)},
		{"crlf", "usage.total_tokens", crlf, found(21)},
		{"cr", "usage.total_tokens", cr, found(21)},
		{"mixed line ends", "n", "data: {\"n\":\r\ndata: 1}\r\r\ndata: {\"n\":2}\n\rdata: {\"n\":\r\n\rdata: 3}\n\n", found(2)},
		{"cr then event", "n", "data: {\"n\":1}\r\rdata: {\"n\":2}\r\r", found(2)},
		{"no space", "usage.total_tokens", "data:{\"usage\":{\"total_tokens\":3}}\n\n", found(3)},
		{"two spaces", "usage.total_tokens", "data:  {\"usage\":{\"total_tokens\":3}}\n\n", found(3)},
		{"multi-line data", "usage.total_tokens", "data: {\"usage\":\ndata: {\"total_tokens\"\ndata: :\ndata:7}}\n\n", found(7)},
		{"data without colon", "n", "data: {\"n\":\ndata\ndata: 4}\n\n", found(4)},
		{"number split by a data line", "n", "data: {\"n\":1\ndata: 2}\n\n", found(1)},
		{"comments", "n", ": ping\n:data: {\"n\":9}\ndata: {\"n\":\n: between\ndata: 5}\n: after\n\n", found(5)},
		{"other fields", "n", "event: x\nid: 1\nretry: 10\ndata: {\"n\":5}\nid\n\n", found(5)},
		{"field names are exact", "n", "Data: {\"n\":1}\n\ndatax: {\"n\":2}\n\ndat: {\"n\":3}\n\n data: {\"n\":4}\n\ndat\n\nd\n\n", none},
		{"last event wins", "usage.total_tokens", ev(5) + ev(7), found(7)},
		{"invalid does not erase", "usage.total_tokens", ev(5) + "data: {\"usage\":{\"total_tokens\":\"x\"}}\n\n" + "data: {\"usage\":null}\n\n", found(5)},
		{"done then event", "usage.total_tokens", "data: [DONE]\n\n" + ev(3), found(3)},
		{"done only", "usage.total_tokens", "data: [DONE]\n\n", none},
		{"malformed then good", "usage.total_tokens", "data: {\"usage\" oops}\n\n" + ev(6), found(6)},
		{"unclosed then good", "usage.total_tokens", "data: {\"usage\":{\"total_tokens\":[\n\n" + ev(6), found(6)},
		{"unterminated string then good", "usage.total_tokens", "data: {\"usage\":\"abc\n\n" + ev(6), found(6)},
		{"deep event then usage", "usage.total_tokens", "data: {\"tool\":" + strings.Repeat(`{"a":`, 200) + "1" + strings.Repeat("}", 200) + ",\"usage\":{\"total_tokens\":7}}\n\n", found(7)},
		{"too deep then good", "usage.total_tokens", "data: {\"a\":" + strings.Repeat("[", 70) + "\n\n" + ev(6), found(6)},
		{"malformed keeps what it showed", "usage.total_tokens", "data: {\"usage\":{\"total_tokens\":4},]\n\n", found(4)},
		{"second document in event", "n", "data: {\"n\":1}\ndata: {\"n\":2}\n\n", found(1)},
		{"no final blank line", "n", "data: {\"n\":1}", found(1)},
		{"no final line end", "n", "data: {\"n\":1}\n\ndata: {\"n\":2}", found(2)},
		{"truncated number", "n", "data: {\"n\":1}\n\ndata: {\"n\":2", found(1)},
		{"blank lines", "n", "\n\n\r\n\r\rdata: {\"n\":1}\n\n\n\n", found(1)},
		{"byte order mark", "n", "\xEF\xBB\xBFdata: {\"n\":1}\n\n", found(1)},
		{"partial byte order mark", "n", "\xEF\xBBdata: {\"n\":1}\n\ndata: {\"n\":2}\n\n", found(2)},
		{"partial byte order mark line", "n", "\xEF\ndata: {\"n\":1}\n\n", found(1)},
		{"data not json", "n", "data: hello\n\ndata: {\"n\":2}\n\n", found(2)},
		{"empty", "n", "", none},
	}
}

// TestExtractorReuse: Reset forgets everything about the previous body,
// whatever state it was left in.
func TestExtractorReuse(t *testing.T) {
	p := mustPaths(t, "usage.total_tokens")
	q := mustPaths(t, "n")
	var e Extractor
	leftovers := []struct {
		f    Format
		body string
	}{
		{JSON, `{"usage":{"total_tokens":5`},
		{JSON, `{"usage":{"total_tokens":5}}`},
		{JSON, `{"usage":{"tot\ud83d`},
		{JSON, `{"usage":"abc\`},
		{JSON, "\xEF\xBB"},
		{SSE, "data: {\"usage\":{\"total_tokens\":5}}\r"},
		{SSE, "data: {\"usage\":[[["},
		{SSE, "dat"},
		{SSE, ": comment"},
	}
	for _, l := range leftovers {
		for _, f := range []Format{JSON, SSE} {
			e.Reset(p, l.f)
			e.Write([]byte(l.body))
			body := `{"n":3}`
			if f == SSE {
				body = "\ndata: " + body + "\n\n"
			}
			if got := extractChunks(&e, q, f, []byte(body), 0); got != found(3) {
				t.Errorf("after %q: got %v, want 3", l.body, got)
			}
		}
	}
}

// TestExtractorUnusable: a nil Paths, a zero Paths, an unknown format and a
// zero Extractor find nothing and do not panic.
func TestExtractorUnusable(t *testing.T) {
	body := []byte(`{"n":3}`)
	var e Extractor
	e.Write(body)
	if c, ok := e.Cost(); ok || c != 0 {
		t.Errorf("zero Extractor: got %d, %v", c, ok)
	}
	for _, tc := range []struct {
		p *Paths
		f Format
	}{{nil, JSON}, {&Paths{}, JSON}, {nil, SSE}, {mustPaths(t, "n"), 0}, {mustPaths(t, "n"), 9}} {
		e.Reset(tc.p, tc.f)
		e.Write(body)
		e.Write([]byte("data: {\"n\":3}\n\n"))
		if c, ok := e.Cost(); ok || c != 0 {
			t.Errorf("Reset(%v, %d): got %d, %v", tc.p, tc.f, c, ok)
		}
	}
}
