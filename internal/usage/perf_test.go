package usage

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// streamBig feeds prefix, then size bytes of filler in 32 KB chunks, then
// suffix, to a warm Extractor, and checks that the heap does not grow by 1 MB
// or more and that the value is found.
func streamBig(t *testing.T, f Format, prefix, suffix string, want int64) {
	const size = 50 << 20
	p := mustPaths(t, "usage.total_tokens")
	// Filler for a JSON string: text with escapes, cut at a whole pattern.
	pattern := `The model said: \"hello\"\n and then caf\u00e9 \\ more text. `
	chunk := []byte(strings.Repeat(pattern, (32<<10)/len(pattern)))
	pre, suf := []byte(prefix), []byte(suffix)

	var e Extractor
	e.Reset(p, f)
	e.Write(pre)
	e.Write(chunk)
	e.Write(suf)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	e.Reset(p, f)
	e.Write(pre)
	for n := 0; n < size; n += len(chunk) {
		e.Write(chunk)
	}
	e.Write(suf)
	cost, ok := e.Cost()
	runtime.ReadMemStats(&after)

	if !ok || cost != want {
		t.Errorf("got %d, %v; want %d", cost, ok, want)
	}
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	total := after.TotalAlloc - before.TotalAlloc
	t.Logf("HeapAlloc growth %d bytes, TotalAlloc growth %d bytes", heap, total)
	if heap >= 1<<20 {
		t.Errorf("HeapAlloc grew by %d bytes scanning 50 MB", heap)
	}
	if total >= 1<<20 {
		t.Errorf("%d bytes allocated scanning 50 MB", total)
	}
}

func TestMemoryJSON50MB(t *testing.T) {
	streamBig(t, JSON, `{"id":"x","text":"`, `","usage":{"total_tokens":12}}`, 12)
}

func TestMemorySSE50MB(t *testing.T) {
	streamBig(t, SSE, "event: x\ndata: {\"id\":\"x\",\"text\":\"",
		"\",\"usage\":{\"total_tokens\":12}}\n\ndata: [DONE]\n\n", 12)
}

// TestMemoryLongNumber: a 50 MB number is read without buffering, and
// rounded up.
func TestMemoryLongNumber(t *testing.T) {
	p := mustPaths(t, "n")
	zeros := bytes.Repeat([]byte("0"), 32<<10)
	var before, after runtime.MemStats
	var e Extractor
	for _, tc := range []struct {
		pre, post string
		want      int64
	}{
		{`{"n":0.`, `1}`, 1},
		{`{"n":1`, `}`, MaxCost},
		{`{"n":1`, `e-52428799}`, 10}, // 1 followed by 1600*32Ki zeros, scaled down
	} {
		runtime.GC()
		runtime.ReadMemStats(&before)
		e.Reset(p, JSON)
		e.Write([]byte(tc.pre))
		for range 1600 {
			e.Write(zeros)
		}
		e.Write([]byte(tc.post))
		runtime.ReadMemStats(&after)
		if c, ok := e.Cost(); !ok || c != tc.want {
			t.Errorf("%s<50 MB of zeros>%s: got %d, %v; want %d", tc.pre, tc.post, c, ok, tc.want)
		}
		if total := after.TotalAlloc - before.TotalAlloc; total >= 1<<20 {
			t.Errorf("%d bytes allocated", total)
		}
	}
}

// splitEvents splits an event stream after each blank line, as a proxy
// flushing every event would write it.
func splitEvents(body []byte) [][]byte {
	var chunks [][]byte
	for len(body) > 0 {
		i := bytes.Index(body, []byte("\n\n"))
		if i < 0 {
			return append(chunks, body)
		}
		chunks = append(chunks, body[:i+2])
		body = body[i+2:]
	}
	return chunks
}

// splitSize splits body into chunks of size bytes.
func splitSize(body []byte, size int) [][]byte {
	var chunks [][]byte
	for len(body) > size {
		chunks = append(chunks, body[:size])
		body = body[size:]
	}
	return append(chunks, body)
}

func TestExtractorAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("slow under -race")
	}
	for _, tc := range []struct {
		name   string
		f      Format
		paths  string
		chunks [][]byte
	}{
		{"json", JSON, "usage.prompt_tokens+usage.completion_tokens", splitSize([]byte(openAICompletion), 7)},
		{"json escaped key", JSON, "café.😀", splitSize([]byte(`{"caf\u00e9":{"\ud83d\ude00":12.5e1}}`), 3)},
		{"sse", SSE, "usage.total_tokens", splitSize([]byte(openAIStream), 5)},
		{"anthropic", SSE, "message.usage.input_tokens+usage.output_tokens", splitEvents([]byte(anthropicStream))},
		{"chat 64k", JSON, "usage.total_tokens", splitSize(chatBody(64<<10), 4<<10)},
		{"stream 64k", SSE, "usage.total_tokens", splitEvents(streamBody(64 << 10))},
	} {
		p := mustPaths(t, tc.paths)
		var e Extractor
		allocs := testing.AllocsPerRun(50, func() {
			e.Reset(p, tc.f)
			for _, c := range tc.chunks {
				e.Write(c)
			}
			if _, ok := e.Cost(); !ok {
				panic("not found")
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per body", tc.name, allocs)
		}
	}
}

// chatBody returns a chat completion of about size bytes, most of it the
// answer's text.
func chatBody(size int) []byte {
	text := `Sure! Here is the function you asked for:\n\n` + "```go" + `\nfunc add(a, b int) int {\n\treturn a + b\n}\n` + "```" +
		`\n\nIt \"adds\" two integers \u2014 caf\u00e9 style. Let me know if you need anything else; the next paragraph goes on with more prose about it. `
	var b bytes.Buffer
	b.WriteString(`{"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion","created":1741570283,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":"`)
	for b.Len() < size-600 {
		b.WriteString(text)
	}
	b.WriteString(`","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":1117,"completion_tokens":4600,"total_tokens":5717,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default","system_fingerprint":"fp_fc9f1d7035"}`)
	return b.Bytes()
}

// embeddingsBody returns an embeddings response of about size bytes: mostly
// numbers.
func embeddingsBody(size int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"object":"list","data":[{"object":"embedding","index":0,"embedding":[`)
	for i := 0; b.Len() < size-200; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%.10f", float64((i*7919)%20000-10000)/1e6)
	}
	b.WriteString(`]}],"model":"text-embedding-3-small","usage":{"prompt_tokens":8,"total_tokens":8}}`)
	return b.Bytes()
}

// streamBody returns an OpenAI-style event stream of about size bytes: one
// event per few tokens, then the usage event and [DONE].
func streamBody(size int) []byte {
	words := []string{"Hello", " world", ",", " this", " is", " a", " \\\"streamed\\\"", " answer", ".\\n", " caf\\u00e9"}
	var b bytes.Buffer
	for i := 0; b.Len() < size-400; i++ {
		fmt.Fprintf(&b, `data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"content":"%s"},"logprobs":null,"finish_reason":null}],"usage":null}`+"\n\n", words[i%len(words)])
	}
	b.WriteString(`data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":120,"total_tokens":129}}` + "\n\n")
	b.WriteString("data: [DONE]\n\n")
	return b.Bytes()
}

// anthropicBody returns an Anthropic-style event stream of about size bytes.
func anthropicBody(size int) []byte {
	var b bytes.Buffer
	b.WriteString(anthropicStream[:strings.Index(anthropicStream, "event: content_block_delta")])
	for b.Len() < size-400 {
		b.WriteString("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" some \\\"streamed\\\" words\\n\"}}\n\n")
	}
	b.WriteString(anthropicStream[strings.Index(anthropicStream, "event: content_block_stop"):])
	return b.Bytes()
}

func benchmarkExtractor(b *testing.B, f Format, paths string, body []byte, chunks [][]byte, want int64) {
	p := mustPaths(b, paths)
	var e Extractor
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		e.Reset(p, f)
		for _, c := range chunks {
			e.Write(c)
		}
	}
	if c, ok := e.Cost(); !ok || c != want {
		b.Fatalf("got %d, %v; want %d", c, ok, want)
	}
}

// BenchmarkExtractorJSON scans 64 KB JSON bodies written in 4 KB chunks.
func BenchmarkExtractorJSON(b *testing.B) {
	b.Run("chat", func(b *testing.B) {
		body := chatBody(64 << 10)
		benchmarkExtractor(b, JSON, "usage.prompt_tokens+usage.completion_tokens", body, splitSize(body, 4<<10), 5717)
	})
	b.Run("embeddings", func(b *testing.B) {
		body := embeddingsBody(64 << 10)
		benchmarkExtractor(b, JSON, "usage.total_tokens", body, splitSize(body, 4<<10), 8)
	})
}

// BenchmarkExtractorSSE scans 64 KB event streams written one event at a
// time, as a proxy flushing each event does.
func BenchmarkExtractorSSE(b *testing.B) {
	b.Run("openai", func(b *testing.B) {
		body := streamBody(64 << 10)
		benchmarkExtractor(b, SSE, "usage.total_tokens", body, splitEvents(body), 129)
	})
	b.Run("anthropic", func(b *testing.B) {
		body := anthropicBody(64 << 10)
		benchmarkExtractor(b, SSE, "message.usage.input_tokens+usage.output_tokens", body, splitEvents(body), 40)
	})
}
