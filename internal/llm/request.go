package llm

import (
	"bytes"
	"encoding/json"
	"strings"
)

// Request is what a preset reads of a JSON request body.
type Request struct {
	// Model is the "model" member, if it is a string.
	Model string
	// Stream: "stream" is true; IncludeUsage: and
	// "stream_options.include_usage" too.
	Stream, IncludeUsage bool
}

// ParseRequest reads a request body; ok is false when it is not a JSON
// object.
func ParseRequest(body []byte) (req Request, ok bool) {
	var v struct {
		Model         any `json:"model"`
		Stream        any `json:"stream"`
		StreamOptions any `json:"stream_options"`
	}
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' || json.Unmarshal(body, &v) != nil {
		return Request{}, false
	}
	req.Model, _ = v.Model.(string)
	req.Stream, _ = v.Stream.(bool)
	if so, isObj := v.StreamOptions.(map[string]any); isObj {
		req.IncludeUsage, _ = so["include_usage"].(bool)
	}
	return req, true
}

// AsksUsage reports whether a request to path is one whose streamed
// answer reports usage only when asked: OpenAI-style chat completions and
// completions (the Responses API always reports it, and refuses
// stream_options).
func AsksUsage(path string) bool {
	return strings.HasSuffix(path, "/chat/completions") || strings.HasSuffix(path, "/completions")
}

// includeUsage is the member set, or added, for stream_options.
const includeUsage = `"include_usage":true`

// WithUsage returns body (a valid JSON object, see ParseRequest) with
// stream_options.include_usage set to true, byte for byte the same
// otherwise, and whether it could: a stream_options that is not an object
// or null is left alone. An existing include_usage is overridden by one
// added after it (JSON decoders keep the last of duplicate names).
func WithUsage(body []byte) ([]byte, bool) {
	m, ok := findMember(body, "stream_options")
	if !ok {
		open := bytes.IndexByte(body, '{') + 1
		return splice(body, open, open, `"stream_options":{`+includeUsage+`},`), true
	}
	switch v := body[m.val:m.end]; {
	case string(v) == "null":
		return splice(body, m.val, m.end, `{`+includeUsage+`}`), true
	case len(v) >= 2 && v[0] == '{':
		inner := bytes.TrimSpace(v[1 : len(v)-1])
		closing := m.end - 1
		if len(inner) == 0 {
			return splice(body, closing, closing, includeUsage), true
		}
		return splice(body, closing, closing, ","+includeUsage), true
	}
	return body, false
}

// splice returns b with b[i:j] replaced by s, in a new slice.
func splice(b []byte, i, j int, s string) []byte {
	out := make([]byte, 0, len(b)-(j-i)+len(s))
	out = append(out, b[:i]...)
	out = append(out, s...)
	return append(out, b[j:]...)
}
