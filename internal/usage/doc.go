// Package usage finds the metered cost of a response in its body as the
// body streams to the client: the numbers at configured JSON paths, such as
// the token counts an LLM API reports in its usage object. It never buffers
// the body: an Extractor is a state machine of a few hundred bytes that is
// fed each chunk written to the client, whatever the size of the body, its
// lines, its strings or its numbers.
//
// # Cost expressions
//
// A cost expression (Paths) is one or more paths joined by '+', each a list
// of JSON object keys joined by '.': "usage.total_tokens", or
// "usage.input_tokens+usage.output_tokens". The cost is the sum of the
// values found at the paths. There are at most 8 paths of at most 8 keys of
// at most 64 bytes each; keys may hold any bytes but '.', '+' and
// whitespace.
//
// A path matches an object member reached from the root object of the
// document through objects only: "usage.total_tokens" matches
// {"usage":{"total_tokens":12}}, but not a member inside an array
// ({"choices":[{"usage":{...}}]}) nor one at another depth
// ({"x":{"usage":{...}}}). Keys are compared after JSON unescaping, so
// "us\u0061ge" is usage (lone UTF-16 surrogates read as U+FFFD, like
// encoding/json); other bytes are compared as they are.
//
// # Values
//
// A valid value is a JSON number that is not negative (-0 is 0). A
// fraction or an exponent is allowed and rounded up to an integer: 12.2
// costs 13, 1e3 costs 1000, 1e-9 costs 1. Values beyond MaxCost (2^53-1)
// count as MaxCost, however many digits or however large an exponent they
// have, and so does a sum beyond it. Numbers are read exactly without
// being buffered: the first 19 significant digits are kept, later ones
// only scale the value or mark it as not whole, so a number of any length
// is rounded up or clamped correctly, never charged less than it says.
// Negative numbers, strings ("12"), booleans, null, objects and arrays at a
// path are invalid: they are ignored, as if the member were absent.
//
// When a path has several values (duplicate keys in one document, or
// several events of a stream), the last valid one wins. The cost is the sum
// over the paths that have a valid value; when none has, Extractor.Cost
// reports ok=false and the caller charges its fallback cost. A value counts
// once the scanner has seen where it ends: a number cut short by the end of
// the body does not count.
//
// # Formats
//
// A JSON body is one document. Scanning stops for good at the end of the
// root object or at the first malformed byte; values seen before stay, so a
// body truncated because the client went away keeps what was seen. A body
// whose root is not an object yields nothing. The scanner checks the
// structure of the document, not the contents of its strings (control
// characters, invalid escapes in strings that are not compared, invalid
// UTF-8 are let through). A value nested deeper than 64 objects and arrays,
// where no path can reach, is skipped by counting its brackets outside its
// strings, and scanning goes on after it: a usage object that follows a
// tool call's arguments or an echoed JSON schema nested 200 levels deep is
// found, in constant memory (the structure inside such a value is not
// checked). A UTF-8 byte order mark at the start is skipped.
//
// A text/event-stream body (SSE) is read per the WHATWG event-stream rules
// that matter here: lines end in LF, CRLF or CR; "data:<value>" or
// "data: <value>" (one leading space removed) adds a line to the event's
// data, and the lines of an event's data are one JSON document (they are
// joined with a newline, which JSON reads as whitespace); an empty line ends
// the event. Comments (lines starting with ':') and other fields (event:,
// id:, retry:) are ignored. Each event is scanned as a JSON body of its
// own: an event whose data is not a JSON object, such as "data: [DONE]",
// yields nothing, and a malformed event stops only its own scanning (the
// values it showed before the malformed byte stay), never later events'.
// An event cut short by the end of the body counts what was seen.
//
// Chunk boundaries may fall anywhere, inside a line, a key, an escape, a
// number or a CRLF, without changing the result. Scanning costs no
// allocation once an Extractor is warm: Extractors are meant to be pooled
// and Reset for each response.
package usage
