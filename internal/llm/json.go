package llm

import (
	"bytes"
	"encoding/json"
)

// Byte-level edits of JSON documents: the request body gets
// stream_options.include_usage and a stream chunk loses its "usage":null,
// and everything else stays byte for byte as it was (key order, spacing,
// number spelling), which decoding and encoding again would not keep.

// member locates a member of the top-level object of a document: key is
// the offset of its name's opening quote, val and end delimit its value.
type member struct{ key, val, end int }

// findMember returns the last member of the top-level object of doc named
// name (compared after unescaping, so "stream_opt\u0069ons" is
// stream_options).
// doc must be valid JSON (json.Valid); ok is false when its root is not
// an object or has no such member. The last one, because JSON decoders
// keep the last of duplicate names.
func findMember(doc []byte, name string) (m member, ok bool) {
	i := skipSpace(doc, 0)
	if i >= len(doc) || doc[i] != '{' {
		return member{}, false
	}
	i++
	for {
		i = skipSpace(doc, i)
		if i >= len(doc) || doc[i] != '"' {
			return m, ok // '}': the end of the object
		}
		key := i
		i = stringEnd(doc, i)
		keyName := doc[key+1 : i-1]
		i = skipSpace(doc, i) + 1 // ':'
		val := skipSpace(doc, i)
		end := valueEnd(doc, val)
		if keyIs(keyName, name) {
			m, ok = member{key: key, val: val, end: end}, true
		}
		i = skipSpace(doc, end)
		if i < len(doc) && doc[i] == ',' {
			i++
		}
	}
}

// removeMember returns doc without member m and one comma next to it.
func removeMember(doc []byte, m member) []byte {
	// A comma before the member goes with it; for the first member, the
	// comma after it.
	start, end := m.key, m.end
	j := start - 1
	for j >= 0 && isSpace(doc[j]) {
		j--
	}
	if j >= 0 && doc[j] == ',' {
		start = j
	} else {
		k := skipSpace(doc, end)
		if k < len(doc) && doc[k] == ',' {
			end = skipSpace(doc, k+1)
		}
	}
	out := make([]byte, 0, len(doc)-(end-start))
	out = append(out, doc[:start]...)
	return append(out, doc[end:]...)
}

// keyIs reports whether the raw (still escaped) key k reads as name.
func keyIs(k []byte, name string) bool {
	if bytes.IndexByte(k, '\\') < 0 {
		return string(k) == name
	}
	var s string
	q := make([]byte, 0, len(k)+2)
	q = append(append(append(q, '"'), k...), '"')
	return json.Unmarshal(q, &s) == nil && s == name
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(doc []byte, i int) int {
	for i < len(doc) && isSpace(doc[i]) {
		i++
	}
	return i
}

// stringEnd returns the offset after the string that starts at doc[i].
func stringEnd(doc []byte, i int) int {
	for i++; i < len(doc); i++ {
		switch doc[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(doc)
}

// valueEnd returns the offset after the value that starts at doc[i].
func valueEnd(doc []byte, i int) int {
	if i >= len(doc) {
		return i
	}
	switch doc[i] {
	case '"':
		return stringEnd(doc, i)
	case '{', '[':
		depth := 0
		for ; i < len(doc); i++ {
			switch doc[i] {
			case '"':
				i = stringEnd(doc, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return len(doc)
	}
	for i < len(doc) && doc[i] != ',' && doc[i] != '}' && doc[i] != ']' && !isSpace(doc[i]) {
		i++
	}
	return i
}
