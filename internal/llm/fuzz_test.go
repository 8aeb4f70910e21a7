package llm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/tollgate/caddy-tollgate/internal/usage"
)

// Request bodies a client may send (and a few it should not).
var requestSeeds = []string{
	`{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Say hi"}]}`,
	`{"model":"gpt-4o","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"2+2?"}],"stream":true,"stream_options":null,"temperature":0.2}`,
	`{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":false},"max_tokens":1e3}`,
	`{"model":"gpt-4o","stream":true,"stream_options":{ },"n":2}`,
	`{"model":"gpt-4o","stream":"true","stream_options":"yes"}`,
	`{"model":"gpt-4o","stream":1,"stream_options":[{"include_usage":true}]}`,
	`{"model":"claude-3-5-haiku-latest","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"Hello, \"world\" \u00e9\\"}]}]}`,
	`{"model":"claude-3-7-sonnet","system":[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}],"messages":[],"metadata":{"user_id":"u1"}}`,
	`{"prompt":"Once upon","model":"gpt-3.5-turbo-instruct","stream":true,"stream_options":{"include_usage":true}}`,
	" \r\n\t{\"model\" : \"m\" ,\n \"stream\" : true }\n",
	`{"mod\u0065l":"escaped","stream_opt\u0069ons":{"a":"}"},"stream":true}`,
	`{"model":"a","model":"b","stream_options":{"x":1},"stream_options":null,"stream":true}`,
	`{"Model":"cheap","model":"gpt-4o","STREAM":false,"stream":true}`,
	`{"x":{"stream_options":1,"model":"inner"},"stream":true}`,
	`{}`,
	`{ }`,
	`{"stream":true,"stream_options":{}}`,
	"\u00a0{\"stream\":true}",
	`{"model":"gpt-4o","stream":true`,
	`{"model":"\ud800","stream":true}`,
	`[{"model":"m"}]`,
	`"model"`,
	``,
	`{"a":[1,{"b":"\\\""}],"stream":true,"stream_options":{"z":[]} }`,
}

// FuzzParseRequest checks that ParseRequest accepts exactly the bodies that
// are JSON objects once trimmed, and reads the model, stream and
// include_usage of the last members so named as a reference built on
// json.Decoder does; and that findMember, which WithUsage and the stripper
// use, finds the very members ParseRequest read, so that what Tollgate
// reads of a request and what it rewrites can never differ.
func FuzzParseRequest(f *testing.F) {
	for _, s := range requestSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, ok := ParseRequest(body)
		trimmed := bytes.TrimSpace(body)
		want := len(trimmed) > 0 && trimmed[0] == '{' && json.Valid(trimmed)
		if ok != want {
			t.Fatalf("ParseRequest(%q): ok %v, want %v", body, ok, want)
		}
		if !ok {
			if req != (Request{}) {
				t.Fatalf("ParseRequest(%q) = %+v without ok", body, req)
			}
			return
		}
		ms, _ := members(trimmed)
		var ref Request
		if raw, has := last(ms, "model"); has && raw[0] == '"' {
			if err := json.Unmarshal(raw, &ref.Model); err != nil {
				t.Fatal(err)
			}
		}
		raw, _ := last(ms, "stream")
		ref.Stream = refTruthy(raw)
		if raw, has := last(ms, "stream_options"); has {
			if so, isObj := members(raw); isObj {
				iu, _ := last(so, "include_usage")
				ref.IncludeUsage = refTruthy(iu)
			}
		}
		if req != ref {
			t.Fatalf("ParseRequest(%q) = %+v, reference %+v", body, req, ref)
		}

		// findMember reads the same members (on the body as sent, which
		// must be JSON for it; ParseRequest's TrimSpace trims more).
		if !json.Valid(body) {
			return
		}
		for _, name := range []string{"model", "stream", "stream_options", "messages"} {
			m, found := findMember(body, name)
			raw, has := last(ms, name)
			if found != has || found && !bytes.Equal(body[m.val:m.end], raw) {
				t.Fatalf("%q in %q: findMember %v %q, decoder %v %q", name, body, found, body[m.val:m.end], has, raw)
			}
		}
	})
}

// insertMax is the most WithUsage adds to a body.
const insertMax = len(`"stream_options":{` + includeUsage + `},`)

// FuzzWithUsage checks, for every body ParseRequest accepts, that
// WithUsage either leaves it as it is (a stream_options that is neither
// an object nor null) or returns a body that is JSON whenever the body
// was, that ParseRequest reads with include_usage and the same model and
// stream, whose members are those of the body, in order and byte for byte,
// but for the last stream_options (added, or with include_usage:true
// added), and that differs from the body by one insertion of a few bytes
// (replacing "null" at most).
func FuzzWithUsage(f *testing.F) {
	for _, s := range requestSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, ok := ParseRequest(body)
		if !ok {
			return // not called: the body passes on untouched
		}
		in := append([]byte(nil), body...)
		// Room after the body: an edit in place would show.
		body = append(body[:len(body):len(body)], make([]byte, 64)...)[:len(body)]
		out, changed := WithUsage(body)
		if !bytes.Equal(body, in) {
			t.Fatalf("WithUsage modified its argument: %q became %q", in, body)
		}
		trimmed := bytes.TrimSpace(body)
		ms, _ := members(trimmed)
		so, hasSO := last(ms, "stream_options")
		if !changed {
			if !bytes.Equal(out, body) {
				t.Fatalf("WithUsage(%q) = %q, false: want the body as it was", body, out)
			}
			if !hasSO || string(so) == "null" || so[0] == '{' {
				t.Fatalf("WithUsage(%q) could not add include_usage (stream_options %q)", body, so)
			}
			return
		}

		if json.Valid(body) && !json.Valid(out) {
			t.Fatalf("WithUsage(%q) = %q: not JSON", body, out)
		}
		got, ok := ParseRequest(out)
		if want := (Request{Model: req.Model, Stream: req.Stream, IncludeUsage: true}); !ok || got != want {
			t.Fatalf("WithUsage(%q) = %q: parsed as %+v %v, want %+v", body, out, got, ok, want)
		}

		// The members, in order, byte for byte (ParseRequest found the
		// output trimmed valid).
		outMs, _ := members(bytes.TrimSpace(out))
		var wantMs []kv
		wantSO := []kv{{"include_usage", "true"}}
		switch i := lastIndex(ms, "stream_options"); {
		case i < 0:
			wantMs = append([]kv{{"stream_options", ""}}, ms...)
		case string(so) == "null":
			wantMs = append([]kv(nil), ms...)
			wantMs[i].raw = ""
		default:
			wantMs = append([]kv(nil), ms...)
			wantMs[i].raw = ""
			inner, _ := members([]byte(so))
			wantSO = append(inner, wantSO...)
		}
		if len(outMs) != len(wantMs) {
			t.Fatalf("WithUsage(%q) = %q: %d members, want %d", body, out, len(outMs), len(wantMs))
		}
		for i, m := range wantMs {
			o := outMs[i]
			if m.raw == "" { // the new stream_options
				o.raw = ""
			}
			if o != m {
				t.Fatalf("WithUsage(%q) = %q: member %d is %q, want %q", body, out, i, outMs[i], m)
			}
		}
		newSO, _ := last(outMs, "stream_options")
		gotSO, isObj := members(newSO)
		if !isObj || fmt.Sprint(gotSO) != fmt.Sprint(wantSO) {
			t.Fatalf("WithUsage(%q) = %q: stream_options %q, want members %q", body, out, newSO, wantSO)
		}

		// One edit, of a few bytes.
		removed, inserted := diff(body, out)
		if !strings.Contains("null", string(removed)) || len(inserted) > insertMax {
			t.Fatalf("WithUsage(%q) = %q: replaced %q with %q", body, out, removed, inserted)
		}
	})
}

// FuzzMember checks findMember and removeMember, the byte-level JSON edits,
// on every valid JSON document: findMember finds the last top-level member
// of that name that json.Decoder reads, and removeMember leaves a valid
// document with the other members, in order and byte for byte, one span
// of bytes shorter.
func FuzzMember(f *testing.F) {
	for _, s := range requestSeeds {
		f.Add([]byte(s), "stream_options")
		f.Add([]byte(s), "model")
	}
	for _, s := range []string{
		`{"usage":null}`,
		`{"usage":null,"a":1}`,
		`{"a":1 , "usage" : null }`,
		` {"a":1,"usage":null,"b":[],"usage":null}`,
		`{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4}}`,
		`{"us\u0061ge":null,"x":"\"usage\":null"}`,
		"{\"a\":{\"usage\":null}\t,\"usage\":\n{} }",
	} {
		f.Add([]byte(s), "usage")
	}
	f.Fuzz(func(t *testing.T, doc []byte, name string) {
		if !json.Valid(doc) {
			return // findMember's precondition
		}
		m, found := findMember(doc, name)
		ms, _ := members(doc)
		i := lastIndex(ms, name)
		if found != (i >= 0) {
			t.Fatalf("findMember(%q, %q): found %v, decoder %v", doc, name, found, i >= 0)
		}
		if !found {
			return
		}
		if got := doc[m.val:m.end]; string(got) != ms[i].raw {
			t.Fatalf("findMember(%q, %q) = %q, decoder %q", doc, name, got, ms[i].raw)
		}
		var key string
		if err := json.Unmarshal(doc[m.key:stringEnd(doc, m.key)], &key); err != nil || key != ms[i].key {
			t.Fatalf("findMember(%q, %q): key at %d reads %q (%v)", doc, name, m.key, key, err)
		}

		out := removeMember(doc, m)
		if !json.Valid(out) {
			t.Fatalf("removeMember(%q, %q) = %q: not JSON", doc, name, out)
		}
		outMs, _ := members(out)
		want := append(ms[:i:i], ms[i+1:]...)
		if fmt.Sprint(outMs) != fmt.Sprint(want) {
			t.Fatalf("removeMember(%q, %q) = %q: members %q, want %q", doc, name, out, outMs, want)
		}
		if removed, inserted := diff(doc, out); len(inserted) != 0 || !bytes.Contains(removed, doc[m.val:m.end]) {
			t.Fatalf("removeMember(%q, %q) = %q: replaced %q with %q", doc, name, out, removed, inserted)
		}
	})
}

// usageChunk is the chunk that include_usage adds at the end of a stream.
const usageChunk = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}` + "\n\n"

// sseSeeds are upstream event streams: OpenAI's with include_usage (the
// usage:null members and the usage chunk), Anthropic's, and malformed or
// cut ones. They are short: the fuzzer's minimizer is quadratic in the
// length of what it finds.
func sseSeeds() []string {
	var seeds []string
	for _, eol := range []string{"\n", "\r\n", "\r"} {
		seeds = append(seeds,
			strings.ReplaceAll("data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n"+
				"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n", "\n", eol),
			strings.ReplaceAll(": keep-alive\n\ndata: {\"choices\":[{\"delta\":{}}]}\n\ndata: [DONE]\n\n", "\n", eol))
	}
	return append(seeds,
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n"+
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n",
		"data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":7,\"output_tokens\":3}}}\n\n",
		"data: {\"a\":1,\"usage\":null}\n\n\ndata: {\"b\":2,\"usage\":null}\n\n\n\ndata: {\"choices\":[],\"usage\":{\"total_tokens\":3}}\n\n",
		"data:{\"usage\":null,\"choices\":[ ]}\r\n\r\ndata: \t{\"choices\" : [ ] , \"usage\" : { } }\r\r",
		"data: {\"usage\":null,\"choices\":[],\"usage\":{}}\n\n",
		"data:  {\"a\":1, \"usage\" : null }\n\n",
		"data: {\"usage\":{},\"usage\":null,\"choices\":[]}\n\n",
		"data: {\"us\\u0061ge\":null}\n\ndata: {\"choices\":[],\"usage\":{\"total_tokens\":3}}\n\ndata: [DONE]\n\n",
		"data: {\"usage\":null}\ndata: {\"usage\":null}\n\n",
		"data: {\"usage\":null\n\n",
		"data: {\"usage\":null,\"choices\":[]}",
		"data: {\"usage\":null,\"choices\":[]}\n\r",
		": ping\r\n\r\nid: 1\nretry: 10\n\n\n\n\r\r\n",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9}}\nid: 7\n\n",
		"\xef\xbb\xbfdata: {\"usage\":null}\n\n",
		"",
	)
}

// FuzzUsageStripper checks that the stripper's output does not depend on
// how the stream is cut into writes (one write, random ones, byte by
// byte), that it is never longer than the stream, that a stream with no
// usage member passes byte for byte, and compares it with a reference:
// every complete event passes as it is but for a data line of one JSON
// object whose last usage is null (that member removed, the rest byte for
// byte) or is an object beside empty choices (the event dropped); an
// unfinished end passes as it is. The stripper is reused, as from a pool,
// after a previous response left it holding an unfinished event (or
// passing everything on): nothing of that response reaches this one, nor
// anything of this one that response's writer. Then it checks that a
// stream built from body with include_usage, stripped, is the stream
// without it.
func FuzzUsageStripper(f *testing.F) {
	for i, s := range sseSeeds() {
		f.Add([]byte(s), uint64(i))
	}
	var s UsageStripper
	f.Fuzz(func(t *testing.T, body []byte, seed uint64) {
		var prev bytes.Buffer
		s.Reset(&prev)
		leftover := "data: {\"tenant\":\"A\",\"x\":\""
		if seed&2 != 0 {
			leftover += strings.Repeat("x", 64<<10) // a buffer too large to keep
		}
		s.Write([]byte(leftover))
		s.raw = seed&1 != 0

		want := stripChunks(t, &s, body, nil)
		if prev.Len() != 0 {
			t.Fatalf("the previous response's writer got %q", prev.Bytes())
		}
		rng := rand.New(rand.NewPCG(seed, seed>>32))
		maxChunk := 1 + rng.IntN(1+len(body))
		if got := stripChunks(t, &s, body, func() int { return 1 + rng.IntN(maxChunk) }); !bytes.Equal(got, want) {
			t.Fatalf("%q in chunks of up to %d: %q, in one write %q", body, maxChunk, got, want)
		}
		if len(body) <= 2048 {
			if got := stripChunks(t, &s, body, func() int { return 1 }); !bytes.Equal(got, want) {
				t.Fatalf("%q byte by byte: %q, in one write %q", body, got, want)
			}
		}
		if len(want) > len(body) {
			t.Fatalf("%q grew to %q", body, want)
		}
		if !bytes.Contains(body, []byte("usage")) && !bytes.Contains(body, []byte(`\`)) && !bytes.Equal(want, body) {
			t.Fatalf("%q has no usage, but became %q", body, want)
		}
		if err := checkStripped(body, want); err != nil {
			t.Fatalf("%q became %q: %v", body, want, err)
		}

		// What Tollgate adds to a stream is taken out again, whatever
		// the content around it.
		eol := []string{"\n", "\r\n", "\r"}[seed%3]
		c := string(body)
		in := chunk(c, true) + chunk("", true) + usageChunk + "data: [DONE]\n\n"
		wantOut := chunk(c, false) + chunk("", false) + "data: [DONE]\n\n"
		in, wantOut = strings.ReplaceAll(in, "\n", eol), strings.ReplaceAll(wantOut, "\n", eol)
		if got := stripChunks(t, &s, []byte(in), func() int { return 1 + rng.IntN(maxChunk) }); string(got) != wantOut {
			t.Fatalf("content %q (eol %q): %q, want %q", c, eol, got, wantOut)
		}
	})
}

// stripChunks passes body through s in writes of next() bytes (nil: one
// write), then closes it, and returns what s wrote.
func stripChunks(t *testing.T, s *UsageStripper, body []byte, next func() int) []byte {
	t.Helper()
	var out bytes.Buffer
	s.Reset(&out)
	for rest := body; len(rest) > 0; {
		k := len(rest)
		if next != nil {
			k = min(next(), k)
		}
		if n, err := s.Write(rest[:k]); n != k || err != nil {
			t.Fatalf("Write: %d, %v; want %d", n, err, k)
		}
		rest = rest[k:]
		// What is held is the unfinished end of the stream so far: an
		// event goes on as soon as its empty line arrives.
		if sent := body[:len(body)-len(rest)]; !bytes.HasSuffix(sent, s.buf) || refEventLen(s.buf) >= 0 {
			t.Fatalf("after %q, %q held", sent, s.buf)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if len(s.buf) != 0 {
		t.Fatalf("%d bytes still held after Close", len(s.buf))
	}
	return out.Bytes()
}

// checkStripped checks out, the stripped in, against a reference.
func checkStripped(in, out []byte) error {
	for {
		n := refEventLen(in)
		if n < 0 {
			break
		}
		ev := in[:n]
		in = in[n:]
		kind, pre, doc, ends := refClassify(ev)
		switch kind {
		case evKeep:
			if !bytes.HasPrefix(out, ev) {
				return fmt.Errorf("event %q was not passed as it is", ev)
			}
			out = out[n:]
		case evDrop:
		case evUnnull:
			if !bytes.HasPrefix(out, pre) {
				return fmt.Errorf("event %q lost its %q", ev, pre)
			}
			rest := out[len(pre):]
			k := bytes.IndexAny(rest, "\r\n")
			if k < 0 || !bytes.HasPrefix(rest[k:], ends) {
				return fmt.Errorf("event %q lost its line ends %q", ev, ends)
			}
			got := rest[:k]
			out = rest[k+len(ends):]
			if !json.Valid(got) {
				return fmt.Errorf("event %q: %q is not JSON", ev, got)
			}
			ms, _ := members(doc)
			i := lastIndex(ms, "usage")
			want := append(ms[:i:i], ms[i+1:]...)
			if gotMs, _ := members(got); fmt.Sprint(gotMs) != fmt.Sprint(want) {
				return fmt.Errorf("event %q became %q: members %q, want %q", ev, got, gotMs, want)
			}
			if removed, inserted := diff(doc, got); len(inserted) != 0 || !bytes.Contains(removed, []byte("null")) {
				return fmt.Errorf("event %q: %q replaced with %q", ev, removed, inserted)
			}
		}
	}
	if !bytes.Equal(out, in) {
		return fmt.Errorf("the unfinished end %q was passed as %q", in, out)
	}
	return nil
}

// What the stripper does to an event.
const (
	evKeep   = iota // passes as it is
	evDrop          // the usage chunk
	evUnnull        // "usage":null removed
)

// refEventLen returns the length of the first complete event of b, up to
// and including the empty line that ends it, or -1. A CR at the very end
// of b ends no line: the stream might have gone on with a LF.
func refEventLen(b []byte) int {
	for pos := 0; ; {
		k := bytes.IndexAny(b[pos:], "\r\n")
		if k < 0 {
			return -1
		}
		end := pos + k + 1
		if b[pos+k] == '\r' {
			if end == len(b) {
				return -1
			}
			if b[end] == '\n' {
				end++
			}
		}
		if k == 0 {
			return end
		}
		pos = end
	}
}

// refClassify tells what the stripper does to the complete event ev; for
// evUnnull, it returns the data line's prefix ("data:" or "data: "), its
// JSON document and the line ends after it.
func refClassify(ev []byte) (kind int, pre, doc, ends []byte) {
	k := bytes.IndexAny(ev, "\r\n")
	line, ends := ev[:k], ev[k:]
	t1 := termLen(ends)
	if t2 := termLen(ends[t1:]); t1+t2 != len(ends) || t2 == 0 || !bytes.HasPrefix(line, []byte("data:")) {
		return evKeep, nil, nil, nil // not an event of one data line
	}
	pre, doc = line[:5], line[5:]
	if bytes.HasPrefix(doc, []byte(" ")) {
		pre, doc = line[:6], line[6:]
	}
	if !json.Valid(doc) {
		return evKeep, nil, nil, nil
	}
	ms, isObj := members(doc)
	if !isObj {
		return evKeep, nil, nil, nil
	}
	u, has := last(ms, "usage")
	switch {
	case !has:
		return evKeep, nil, nil, nil
	case string(u) == "null":
		return evUnnull, pre, doc, ends
	case u[0] == '{':
		var c bytes.Buffer
		if choices, has := last(ms, "choices"); has && json.Compact(&c, choices) == nil && c.String() == "[]" {
			return evDrop, nil, nil, nil
		}
	}
	return evKeep, nil, nil, nil
}

// termLen returns the length of the line end b starts with, or 0.
func termLen(b []byte) int {
	switch {
	case bytes.HasPrefix(b, []byte("\r\n")):
		return 2
	case len(b) > 0 && (b[0] == '\r' || b[0] == '\n'):
		return 1
	}
	return 0
}

// kv is a member of an object: its name, unescaped, and its value as
// written.
type kv struct{ key, raw string }

// members returns the members of doc, a valid JSON document, in order,
// duplicates included; isObj is false when doc is not an object.
func members(doc []byte) (ms []kv, isObj bool) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			panic(err)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			panic(err)
		}
		ms = append(ms, kv{tok.(string), string(raw)})
	}
	return ms, true
}

func lastIndex(ms []kv, key string) int {
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].key == key {
			return i
		}
	}
	return -1
}

// last returns the value of the last member of ms named key.
func last(ms []kv, key string) (json.RawMessage, bool) {
	if i := lastIndex(ms, key); i >= 0 {
		return json.RawMessage(ms[i].raw), true
	}
	return nil, false
}

// refTruthy: what a lenient server (pydantic's bool) takes for true.
func refTruthy(raw json.RawMessage) bool {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return false
	}
	switch v := v.(type) {
	case bool:
		return v
	case float64:
		return v == 1
	case string:
		return slices.Contains([]string{"1", "on", "t", "true", "y", "yes"}, strings.ToLower(v))
	}
	return false
}

// diff returns what of a was replaced by what to make b, around their
// longest common prefix and suffix.
func diff(a, b []byte) (removed, inserted []byte) {
	p := 0
	for p < len(a) && p < len(b) && a[p] == b[p] {
		p++
	}
	s := 0
	for s < len(a)-p && s < len(b)-p && a[len(a)-1-s] == b[len(b)-1-s] {
		s++
	}
	return a[p : len(a)-s], b[p : len(b)-s]
}

// FuzzTokens checks the token counts read from an upstream's answer: never
// negative nor above usage.MaxCost, cached within input, none without ok;
// for a JSON answer without duplicate keys whose counts are plain
// integers, the counts a reference reads with encoding/json.
func FuzzTokens(f *testing.F) {
	for _, s := range sseSeeds() {
		f.Add([]byte(s), true, false)
		f.Add([]byte(s), true, true)
	}
	for _, s := range []string{
		`{"usage":{"prompt_tokens":100,"completion_tokens":20,"total_tokens":120,"prompt_tokens_details":{"cached_tokens":60}}}`,
		`{"usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":60}}}`,
		`{"usage":{"input_tokens":50,"output_tokens":5,"input_tokens_details":{"cached_tokens":10}}}`,
		`{"usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":100,"cache_creation_input_tokens":20}}`,
		`{"usage":{"input_tokens":9007199254740991,"output_tokens":1,"cache_read_input_tokens":9007199254740991}}`,
		`{"message":{"usage":{"input_tokens":25,"output_tokens":1}},"usage":{"output_tokens":15}}`,
		`{"usage":{"prompt_tokens":-5,"completion_tokens":"7","output_tokens":3.5}}`,
		`{"usage":{"prompt_tokens":1e400,"completion_tokens":1}}`,
	} {
		f.Add([]byte(s), false, false)
		f.Add([]byte(s), false, true)
	}
	var e usage.Extractor
	f.Fuzz(func(t *testing.T, body []byte, sse, anthropic bool) {
		p, format := OpenAI, usage.JSON
		if anthropic {
			p = Anthropic
		}
		if sse {
			format = usage.SSE
		}
		e.Reset(p.Paths(), format)
		e.Write(body)
		tok, ok := p.Tokens(&e)
		if !ok && tok != (Tokens{}) {
			t.Fatalf("%s %q: %+v without ok", p, body, tok)
		}
		for _, n := range []int64{tok.Input, tok.Output, tok.Cached, tok.Total()} {
			if n < 0 || n > usage.MaxCost {
				t.Fatalf("%s %q: %+v out of range", p, body, tok)
			}
		}
		if tok.Cached > tok.Input {
			t.Fatalf("%s %q: %+v: more cached than input", p, body, tok)
		}
		if sse {
			return
		}
		want, wantOK, known := refTokens(p, body)
		if known && (tok != want || ok != wantOK) {
			t.Fatalf("%s %q: %+v %v, reference %+v %v", p, body, tok, ok, want, wantOK)
		}
	})
}

// refTokens reads the usage of a JSON answer with encoding/json; known is
// false for a body it cannot tell (not JSON, duplicate keys, a count that
// is not a plain integer of 15 digits at most).
func refTokens(p Provider, body []byte) (t Tokens, ok, known bool) {
	if !json.Valid(body) || hasDuplicates(body) {
		return Tokens{}, false, false
	}
	var root any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if dec.Decode(&root) != nil {
		return Tokens{}, false, false
	}
	known = true
	// get returns the first count of paths that is there.
	get := func(paths ...string) int64 {
		for _, path := range paths {
			v := root
			for _, key := range strings.Split(path, ".") {
				obj, _ := v.(map[string]any)
				v = obj[key]
			}
			n, isNum := v.(json.Number)
			if !isNum {
				continue
			}
			if strings.HasPrefix(string(n), "-") {
				if strings.Trim(string(n[1:]), "0") == "" {
					ok = true
					return 0 // -0 is 0
				}
				if strings.Trim(string(n[1:]), "0123456789") == "" {
					continue // invalid, as if absent
				}
				known = false
				return 0
			}
			if strings.Trim(string(n), "0123456789") != "" || len(n) > 15 {
				known = false
				return 0
			}
			ok = true
			i, _ := n.Int64()
			return i
		}
		return 0
	}
	switch p {
	case OpenAI:
		t.Input = get("usage.prompt_tokens", "usage.input_tokens", "response.usage.input_tokens")
		t.Output = get("usage.completion_tokens", "usage.output_tokens", "response.usage.output_tokens")
		t.Cached = min(get("usage.prompt_tokens_details.cached_tokens", "usage.input_tokens_details.cached_tokens"), t.Input)
	case Anthropic:
		t.Output = get("usage.output_tokens")
		if !ok {
			return Tokens{}, false, known
		}
		t.Output = get("usage.output_tokens", "message.usage.output_tokens")
		t.Cached = get("usage.cache_read_input_tokens", "message.usage.cache_read_input_tokens")
		t.Input = min(get("usage.input_tokens", "message.usage.input_tokens")+t.Cached+
			get("usage.cache_creation_input_tokens", "message.usage.cache_creation_input_tokens"), usage.MaxCost)
		t.Cached = min(t.Cached, t.Input)
	}
	return t, ok, known
}

// hasDuplicates reports whether an object of the valid JSON document doc
// has two members of the same name.
func hasDuplicates(doc []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(doc))
	var walk func() bool
	walk = func() bool {
		tok, _ := dec.Token()
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				k, _ := dec.Token()
				if seen[k.(string)] {
					return true
				}
				seen[k.(string)] = true
				if walk() {
					return true
				}
			}
			dec.Token()
		case json.Delim('['):
			for dec.More() {
				if walk() {
					return true
				}
			}
			dec.Token()
		}
		return false
	}
	return walk()
}

// FuzzPrices checks model lookup in a price table (the model is the
// client's) against a reference glob, and Cost: never negative nor above
// usage.MaxCost, whatever the numbers; for counts and prices in their
// ranges, the exact price clamped, so that more tokens never cost less.
func FuzzPrices(f *testing.F) {
	f.Add("gpt-4o*", "gpt-4o-mini", int64(1000), int64(200), int64(600), int64(2500), int64(10000), int64(1250))
	f.Add("gpt-4o*", "gpt-4o*-mini", int64(10), int64(10), int64(0), int64(2500), int64(10000), int64(1250)) // was unmatched: the default's price
	f.Add("claude-?-haiku", "claude-3-haiku", int64(0), int64(0), int64(0), int64(1), int64(1), int64(1))
	f.Add("openai/*/y", "openai/gpt-x/y", int64(1<<62), int64(1), int64(0), int64(3), int64(3), int64(3))
	f.Add("a*b*c*d*e*f", "aXbXcXdXeXfX", int64(usage.MaxCost), int64(usage.MaxCost), int64(usage.MaxCost), int64(1<<52), int64(1<<52), int64(1<<52))
	f.Add("gpt-*", "gpt-x", int64(usage.MaxCost), int64(usage.MaxCost), int64(0), int64(1), int64(1), int64(1)) // each term fits, not their sum
	f.Add("*?*", "", int64(-1), int64(math.MinInt64), int64(math.MaxInt64), int64(-5), int64(2), int64(math.MaxInt64))
	f.Add("\xff*\x00", "\xff\xfe\x00", int64(5), int64(5), int64(7), int64(1), int64(1), int64(1))
	f.Fuzz(func(t *testing.T, pattern, model string, in, out, cached, pIn, pOut, pCached int64) {
		if len(pattern) > 256 || len(model) > 4096 {
			return // the reference is quadratic
		}
		match := refGlob(pattern, model)
		if got := glob(pattern, model); got != match {
			t.Fatalf("glob(%q, %q) = %v, want %v", pattern, model, got, match)
		}
		// The default first: the table's order does not matter to it.
		// (A table names a model once: config refuses "*" twice.)
		price, other := Price{pIn, pOut, pCached}, Price{1, 2, 3}
		want := other
		if model != "*" && (model == pattern || match) { // "*" is the default's exact name
			want = price
		}
		short := len(model) <= MaxModel // a longer name is not looked up
		if got, ok := NewPrices([]PriceEntry{{"*", other}, {pattern, price}}).Lookup(model); pattern != "*" && (ok != short || ok && got != want) {
			t.Fatalf("Lookup(%q) with %q: %+v %v, want %+v", model, pattern, got, ok, want)
		}
		if _, ok := NewPrices([]PriceEntry{{pattern, price}}).Lookup(model); ok != (short && (model == pattern || match)) {
			t.Fatalf("Lookup(%q) with %q only: ok %v", model, pattern, ok)
		}

		tok := Tokens{Input: in, Output: out, Cached: cached}
		cost := price.Cost(tok)
		if cost < 0 || cost > usage.MaxCost {
			t.Fatalf("%+v.Cost(%+v) = %d", price, tok, cost)
		}
		// The ranges of a running gateway: counts from an Extractor
		// (clamped, cached within input by Tokens), prices that config
		// checks are not negative.
		for _, n := range []int64{in, out, cached} {
			if n < 0 || n > usage.MaxCost {
				return
			}
		}
		if cached > in || pIn < 0 || pOut < 0 || pCached < 0 {
			return
		}
		exact := new(big.Int).Mul(big.NewInt(in-cached), big.NewInt(pIn))
		exact.Add(exact, new(big.Int).Mul(big.NewInt(cached), big.NewInt(pCached)))
		exact.Add(exact, new(big.Int).Mul(big.NewInt(out), big.NewInt(pOut)))
		if exact.Cmp(big.NewInt(usage.MaxCost)) > 0 {
			exact.SetInt64(usage.MaxCost)
		}
		if cost != exact.Int64() {
			t.Fatalf("%+v.Cost(%+v) = %d, want %d", price, tok, cost, exact)
		}
	})
}

// refGlob matches s against pattern by recursion over the bytes ('*' any
// run of bytes, '?' one byte), memoized.
func refGlob(pattern, s string) bool {
	memo := map[[2]int]bool{}
	var match func(p, i int) bool
	match = func(p, i int) bool {
		key := [2]int{p, i}
		if r, done := memo[key]; done {
			return r
		}
		var r bool
		switch {
		case p == len(pattern):
			r = i == len(s)
		case pattern[p] == '*':
			r = match(p+1, i) || i < len(s) && match(p, i+1)
		default:
			r = i < len(s) && (pattern[p] == '?' || pattern[p] == s[i]) && match(p+1, i+1)
		}
		memo[key] = r
		return r
	}
	return match(0, 0)
}
