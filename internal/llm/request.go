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
//
// Members are matched by their exact names after unescaping, the last of
// duplicates winning, as the APIs' servers read them (encoding/json's
// struct fields would also match "Model" or "STREAM"). A stream is asked
// for by true, and by what a lenient server takes for true (see truthy).
func ParseRequest(body []byte) (req Request, ok bool) {
	var v map[string]json.RawMessage
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' || json.Unmarshal(body, &v) != nil {
		return Request{}, false
	}
	_ = json.Unmarshal(v["model"], &req.Model)
	req.Stream = truthy(v["stream"])
	var so map[string]json.RawMessage
	if json.Unmarshal(v["stream_options"], &so) == nil {
		req.IncludeUsage = truthy(so["include_usage"])
	}
	return req, true
}

// truthy reports a JSON value a lenient server reads as true: the
// OpenAI-compatible servers written in Python (vLLM, SGLang, LiteLLM)
// validate with pydantic, whose bool takes true, a number equal to 1, and
// a string that is, in any case, one of 1, on, t, true, y or yes. Reading
// less than they do would let a client ask for a stream Tollgate does not
// see, and so escape its usage.
func truthy(v json.RawMessage) bool {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return false
	}
	switch v[0] {
	case 't':
		return string(v) == "true"
	case '"':
		var s string
		if json.Unmarshal(v, &s) != nil {
			return false
		}
		switch strings.ToLower(s) {
		case "1", "on", "t", "true", "y", "yes":
			return true
		}
		return false
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		var f float64
		return json.Unmarshal(v, &f) == nil && f == 1
	}
	return false
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
		sep := "," // before the first member
		if k := skipSpace(body, open); k < len(body) && body[k] == '}' {
			sep = "" // an empty object: {} or { }
		}
		return splice(body, open, open, `"stream_options":{`+includeUsage+`}`+sep), true
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
