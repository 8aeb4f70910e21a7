package usage

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/big"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// fuzzDefaultPaths is used when the fuzzed expression does not parse.
const fuzzDefaultPaths = "usage.total_tokens+n+a.b+message.usage.input_tokens+usage.output_tokens"

// FuzzExtractor checks that chunking never changes the result and that
// nothing panics, and compares the result with a reference built on
// encoding/json for JSON documents it accepts, and for event streams whose
// events are all either valid JSON or not objects.
func FuzzExtractor(f *testing.F) {
	for _, tc := range jsonCases() {
		f.Add(tc.paths, []byte(tc.body), false, uint64(len(tc.body)))
	}
	for _, tc := range sseCases() {
		f.Add(tc.paths, []byte(tc.body), true, uint64(len(tc.body)))
	}
	f.Add(fuzzDefaultPaths, []byte(openAICompletion), true, uint64(7))
	f.Add(fuzzDefaultPaths, []byte(anthropicStream), false, uint64(3))

	var e Extractor
	f.Fuzz(func(t *testing.T, expr string, body []byte, sse bool, seed uint64) {
		p, err := ParsePaths(expr)
		if err != nil {
			p = *mustPaths(t, fuzzDefaultPaths)
		}
		if q, err := ParsePaths(p.String()); err != nil || q != p {
			t.Fatalf("%q does not round-trip: %v", p.String(), err)
		}
		format := JSON
		if sse {
			format = SSE
		}
		want := extractChunks(&e, &p, format, body, 0)

		rng := rand.New(rand.NewPCG(seed, seed>>32))
		maxChunk := 1 + rng.IntN(1+len(body))
		e.Reset(&p, format)
		for rest := body; len(rest) > 0; {
			k := min(1+rng.IntN(maxChunk), len(rest))
			e.Write(rest[:k])
			rest = rest[k:]
		}
		c, ok := e.Cost()
		if got := (result{c, ok}); got != want {
			t.Fatalf("random chunks (max %d): got %v, one chunk %v", maxChunk, got, want)
		}
		if len(body) <= 4096 {
			if got := extractChunks(&e, &p, format, body, 1); got != want {
				t.Fatalf("bytewise: got %v, one chunk %v", got, want)
			}
		}
		if want.ok && (want.cost < 0 || want.cost > MaxCost) {
			t.Fatalf("cost %d out of range", want.cost)
		}

		var ref reference
		if sse {
			if !ref.stream(&p, body) {
				return
			}
		} else if !ref.document(&p, body) {
			return
		}
		if got := ref.result(); got != want {
			t.Fatalf("reference %v, extractor %v (paths %q)", got, want, p.String())
		}
	})
}

// reference computes the expected cost with encoding/json.
type reference struct {
	vals [maxPaths]int64
	seen uint8
}

func (r *reference) result() result {
	if r.seen == 0 {
		return none
	}
	var sum int64
	for k := range maxPaths {
		if r.seen&(1<<k) != 0 {
			sum += r.vals[k]
		}
	}
	return found(min(sum, MaxCost))
}

// document applies the JSON document body, and reports false when it cannot
// tell what the Extractor should find (body is not valid JSON, not UTF-8, or
// has a number it cannot compute).
func (r *reference) document(p *Paths, body []byte) bool {
	if !json.Valid(body) || !utf8.Valid(body) {
		return false
	}
	before := *r
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return false
	}
	if tok != json.Delim('{') {
		return true // not an object: nothing
	}
	dups := false
	err = r.walk(p, dec, tok, nil, true, 0, &dups)
	if err != nil {
		return false
	}
	if err == nil && !dups {
		// Without duplicate keys, Unmarshal into a map must agree with
		// the walk.
		r.checkMap(p, body, before)
	}
	return true
}

// walk reads the value that starts with tok, at the key path keys (reach:
// reached from the root through objects only), inside depth containers.
func (r *reference) walk(p *Paths, dec *json.Decoder, tok json.Token, keys []string, reach bool, depth int, dups *bool) error {
	switch v := tok.(type) {
	case json.Delim:
		obj := v == '{'
		seenKeys := map[string]bool{}
		for dec.More() {
			var sub []string
			if obj {
				kt, err := dec.Token()
				if err != nil {
					return err
				}
				k := kt.(string)
				*dups = *dups || seenKeys[k]
				seenKeys[k] = true
				sub = append(keys[:len(keys):len(keys)], k)
			}
			vt, err := dec.Token()
			if err != nil {
				return err
			}
			if err := r.walk(p, dec, vt, sub, reach && obj, depth+1, dups); err != nil {
				return err
			}
		}
		_, err := dec.Token()
		return err
	case json.Number:
		if !reach {
			return nil
		}
		for k := range p.n {
			if !slicesEqual(p.seg[k][:p.nseg[k]], keys) {
				continue
			}
			c, valid, known := refNumber(string(v))
			if !known {
				return errors.New("unknown number")
			}
			if valid {
				r.vals[k] = c
				r.seen |= 1 << k
			}
		}
	}
	return nil
}

// checkMap computes the values with json.Unmarshal into a map (for a
// document without duplicate keys nor excessive depth) and panics if they
// differ from the walk's.
func (r *reference) checkMap(p *Paths, body []byte, before reference) {
	var root any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&root); err != nil {
		panic(err)
	}
	m := before
	for k := range p.n {
		var v any = root
		for _, seg := range p.seg[k][:p.nseg[k]] {
			obj, _ := v.(map[string]any)
			v = obj[seg]
		}
		if n, isNum := v.(json.Number); isNum {
			if c, valid, _ := refNumber(string(n)); valid {
				m.vals[k] = c
				m.seen |= 1 << k
			}
		}
	}
	if m != *r {
		panic("json.Unmarshal and the token walk disagree on " + strconv.Quote(string(body)))
	}
}

func slicesEqual(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// refNumber rounds the JSON number s up and clamps it, with math/big;
// valid=false when negative; known=false when the exponent is too large to
// compute.
func refNumber(s string) (cost int64, valid, known bool) {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, expStr, _ := strings.Cut(strings.ToLower(s), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return 0, true, true
	}
	if neg {
		return 0, false, true
	}
	exp := int64(0)
	if expStr != "" {
		var err error
		if exp, err = strconv.ParseInt(expStr, 10, 64); err != nil || exp > 1e6 || exp < -1e6 {
			return 0, false, false
		}
	}
	scale := exp - int64(len(frac)) // value = digits * 10^scale
	if int64(len(digits))+scale > 17 {
		return MaxCost, true, true
	}
	if scale < -int64(len(digits))-1 {
		return 1, true, true
	}
	n, _ := new(big.Int).SetString(digits, 10)
	ten := big.NewInt(10)
	if scale >= 0 {
		n.Mul(n, new(big.Int).Exp(ten, big.NewInt(scale), nil))
	} else {
		d := new(big.Int).Exp(ten, big.NewInt(-scale), nil)
		q, m := new(big.Int).QuoRem(n, d, new(big.Int))
		if m.Sign() != 0 {
			q.Add(q, big.NewInt(1))
		}
		n = q
	}
	if n.Cmp(big.NewInt(MaxCost)) > 0 {
		return MaxCost, true, true
	}
	return n.Int64(), true, true
}

// stream applies the events of an event stream, parsed line by line per the
// WHATWG rules, and reports false when it cannot tell what the Extractor
// should find (an event whose data starts like an object but is not valid
// JSON).
func (r *reference) stream(p *Paths, body []byte) bool {
	body = bytes.TrimPrefix(body, []byte(bom))
	var data []byte
	hasData := false
	event := func() bool {
		defer func() { data, hasData = data[:0], false }()
		if !hasData {
			return true
		}
		trimmed := bytes.TrimLeft(data, " \t\r\n")
		if len(trimmed) == 0 || trimmed[0] != '{' {
			return true // the Extractor finds nothing in it
		}
		return r.document(p, data)
	}
	for len(body) > 0 {
		line := body
		body = nil
		if end := bytes.IndexAny(line, "\r\n"); end >= 0 {
			crlf := line[end] == '\r' && end+1 < len(line) && line[end+1] == '\n'
			line, body = line[:end], line[end+1:]
			if crlf {
				body = body[1:]
			}
		}
		if len(line) == 0 {
			if !event() {
				return false
			}
			continue
		}
		field, value, colon := bytes.Cut(line, []byte(":"))
		if colon {
			value = bytes.TrimPrefix(value, []byte(" "))
		}
		if string(field) == "data" {
			data = append(data, value...)
			data = append(data, '\n')
			hasData = true
		}
	}
	return event()
}

// TestReference checks the reference itself on the test cases.
func TestReference(t *testing.T) {
	for _, f := range []Format{JSON, SSE} {
		cases := jsonCases()
		if f == SSE {
			cases = sseCases()
		}
		known := 0
		for _, tc := range cases {
			var r reference
			p := mustPaths(t, tc.paths)
			ok := false
			if f == SSE {
				ok = r.stream(p, []byte(tc.body))
			} else {
				ok = r.document(p, []byte(tc.body))
			}
			if ok {
				known++
				if r.result() != tc.want {
					t.Errorf("%s: reference %v, want %v", tc.name, r.result(), tc.want)
				}
			}
		}
		// The reference must cover most cases, or the fuzz test checks little.
		if known < len(cases)*2/3 {
			t.Errorf("format %d: the reference knows %d cases of %d", f, known, len(cases))
		}
		t.Logf("format %d: the reference knows %d cases of %d", f, known, len(cases))
	}
}
