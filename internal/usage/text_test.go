package usage

import (
	"strings"
	"testing"
)

func TestTextCounter(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       int64
	}{
		{"openai stream", openAIStream, int64(len("Hello") + len(` there: \"usage\": {\"total_tokens\": 1}\n`))},
		{"openai json", `{"choices":[{"message":{"role":"assistant","content":"Hi there"}}],"usage":{"total_tokens":3}}`, 8},
		{"tool call arguments", `{"choices":[{"delta":{"tool_calls":[{"function":{"name":"f","arguments":"{\"a\":1}"}}]}}]}`, int64(len(`{\"a\":1}`))},
		{"anthropic deltas", "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"abc\"}}\n\ndata: {\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"k\\\"\"}}\n\n", 3 + int64(len(`{\"k\"`))},
		{"responses api delta", `data: {"type":"response.output_text.delta","delta":"Hey"}` + "\n\n", 3},
		{"object value not counted", `{"content":{"text":"ab"}}`, 2},
		{"key as value not a key", `{"x":"content","y":"zz"}`, 0},
		{"array of strings not counted", `{"content":["ab","cd"]}`, 0},
		{"long key", `{"` + strings.Repeat("c", 40) + `":"abc","text":"d"}`, 1},
		{"prefix of a key", `{"conten":"abc","texts":"d"}`, 0},
		{"unterminated line", "data: {\"content\":\"ab\ndata: {\"text\":\"cd\"}\n\n", 4},
		{"not json", "hello \"content\": world", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for chunk := 1; chunk <= len(tc.body); chunk++ {
				var c TextCounter
				for rest := tc.body; len(rest) > 0; {
					k := min(chunk, len(rest))
					c.Write([]byte(rest[:k]))
					rest = rest[k:]
				}
				if c.Bytes() != tc.want {
					t.Fatalf("chunks of %d: %d bytes, want %d", chunk, c.Bytes(), tc.want)
				}
			}
		})
	}
}

func TestTextCounterAllocs(t *testing.T) {
	var c TextCounter
	body := []byte(openAIStream)
	if n := testing.AllocsPerRun(100, func() { c.Reset(); c.Write(body) }); n != 0 {
		t.Errorf("%v allocations per body, want 0", n)
	}
}
