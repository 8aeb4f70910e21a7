package usage

import (
	"bytes"
	"math/bits"
	"unicode/utf8"
)

// MaxCost is the largest cost an Extractor reports (2^53-1, the largest
// integer a float64 holds exactly): larger values, and sums beyond it, are
// clamped to it.
const MaxCost = 1<<53 - 1

// Format of a body.
type Format uint8

// The body formats an Extractor understands.
const (
	// JSON is one JSON document (application/json, application/*+json).
	JSON Format = iota + 1
	// SSE is text/event-stream: each event's data is a JSON document.
	SSE
)

// maxDepth is the deepest nesting of objects and arrays whose structure is
// scanned. No path reaches that deep (a path has at most maxSegs keys), so
// a value nested deeper is skipped with a counter of open brackets
// (stDeep): the document goes on being read after it.
const maxDepth = 64

// States of the JSON scanner (Extractor.st).
const (
	stDone     uint8 = iota // the document is complete or malformed: ignore the rest
	stRoot                  // expecting the root value
	stObjFirst              // after '{': a key or '}'
	stObjKey                // after ',' in an object: a key
	stColon                 // after a key: ':'
	stValue                 // expecting a value
	stArrFirst              // after '[': a value or ']'
	stAfter                 // after a value: ',' or the closing bracket
	stStr                   // in a string whose content does not matter
	stStrEsc                // after '\' in such a string
	stKey                   // in a key compared with the paths' segments
	stKeyEsc                // after '\' in a compared key
	stKeyHex                // in the hex digits of \uXXXX in a compared key
	stKeySurBS              // after a high surrogate escape: expecting '\'
	stKeySurU               // after a high surrogate escape and '\': expecting 'u'
	stLit                   // in true, false or null
	stNumMinus              // after '-'
	stNumZero               // after a leading '0'
	stNumInt                // in integer digits
	stNumDot                // after '.'
	stNumFrac               // in fraction digits
	stNumE                  // after 'e' or 'E'
	stNumESign              // after the exponent's sign
	stNumExp                // in exponent digits
	stDeep                  // in a value nested deeper than maxDepth: counting brackets
	stDeepStr               // in a string inside such a value
	stDeepEsc               // after '\' in such a string
)

// States of the event-stream line parser (Extractor.ln).
const (
	lnStart uint8 = iota // at the start of a line
	lnField              // matching the field name "data" (Extractor.field bytes so far)
	lnColon              // after "data": expecting ':' or the end of the line
	lnSpace              // after "data:": an optional space
	lnData               // in the value of a data line: fed to the JSON scanner
	lnSkip               // in a line that is ignored
)

// bom is the UTF-8 byte order mark, skipped at the start of a body.
const bom = "\xEF\xBB\xBF"

// bomDone is Extractor.bomN once past the start of the body.
const bomDone = uint8(len(bom) + 1)

// lf is fed to the JSON scanner at the end of each data line.
var lf = []byte{'\n'}

// noPaths stands for a nil *Paths.
var noPaths Paths

// Extractor scans one response body. The zero value is not usable; use
// Reset. An Extractor is reused across responses (pooled): Reset makes it
// like new without allocating. It keeps a fixed amount of state whatever the
// body: it never buffers the body, a line, a string or a number. An
// Extractor is not safe for concurrent use.
type Extractor struct {
	paths  *Paths
	format Format

	// Results: vals[k] is the last valid value of path k, if seen has bit k.
	seen uint8
	vals [maxPaths]int64

	// JSON scanner.
	st      uint8 // stXxx
	strNext uint8 // the state after the end of a skipped string
	depth   int   // open objects and arrays; 0 before the root
	arrays  uint64
	alive   [maxDepth + 1]uint8 // alive[d]: paths still matching at depth d (objects only)
	memT    uint8               // paths whose last segment is the current key
	memC    uint8               // paths that continue below the current key
	lit     string              // the rest of the literal being read
	litI    int
	deepN   int // open brackets of the value being skipped (stDeep)

	// Key comparison (stKey...).
	keyMatch uint8 // paths whose segment at this depth starts with the key so far
	keyLen   int   // bytes of the unescaped key so far
	hexN     uint8 // hex digits read in \uXXXX
	hex      rune
	hiSur    rune // pending high surrogate, or 0

	// Number being read; accumulated only when numCap != 0. Its value is
	// (numM + f) * 10^(numE ± numExp), with 0 < f < 1 when numSticky.
	numCap    uint8 // paths this number is the value of
	numNeg    bool
	numSticky bool // nonzero digits were dropped beyond numM
	numD      int  // significant digits in numM (at most 19)
	numM      uint64
	numE      int64
	numExp    int64 // exponent digits, saturated
	numExpNeg bool

	// Event-stream parser.
	ln      uint8 // lnXxx
	field   uint8
	afterCR bool  // the last byte was a CR: a LF next is part of the same line end
	bomN    uint8 // bytes of the byte order mark seen; bomDone once past it
}

// Reset prepares e to scan a new body of format f for the cost expression p,
// forgetting everything about the previous body. p is used, not copied: it
// must stay unchanged while e is in use (a Paths cannot be modified once
// parsed). A nil p, or an unknown format, yields an Extractor that finds
// nothing.
func (e *Extractor) Reset(p *Paths, f Format) {
	if p == nil {
		p = &noPaths
	}
	*e = Extractor{paths: p, format: f, st: stRoot}
}

// Write scans the next chunk of the body. It never fails and never retains p.
func (e *Extractor) Write(p []byte) {
	if e.bomN != bomDone {
		p = e.skipBOM(p)
	}
	switch e.format {
	case JSON:
		e.scan(p)
	case SSE:
		e.writeSSE(p)
	}
}

// Cost returns the sum of the values seen, and ok=false when no path yielded a
// valid value (then the caller charges its fallback cost). The sum is clamped
// to MaxCost. Cost does not change e: it may be called at any time, and a
// value is counted once its end has been seen (a number cut short by the end
// of the body is not).
func (e *Extractor) Cost() (cost int64, ok bool) {
	if e.seen == 0 {
		return 0, false
	}
	for m := e.seen; m != 0; m &= m - 1 {
		cost += e.vals[bits.TrailingZeros8(m)]
	}
	return min(cost, MaxCost), true
}

// Value returns the last valid value of path k (the k-th of the
// expression, from 0), and whether one was seen.
func (e *Extractor) Value(k int) (int64, bool) {
	if k < 0 || k >= maxPaths || e.seen&(1<<k) == 0 {
		return 0, false
	}
	return e.vals[k], true
}

// skipBOM skips a byte order mark at the start of the body. A body that
// starts with part of one only is malformed JSON, or an ignored first line
// in an event stream.
func (e *Extractor) skipBOM(p []byte) []byte {
	for len(p) > 0 {
		if p[0] == bom[e.bomN] {
			p = p[1:]
			e.bomN++
			if e.bomN == uint8(len(bom)) {
				e.bomN = bomDone
				return p
			}
			continue
		}
		if e.bomN > 0 {
			if e.format == SSE {
				e.ln = lnSkip
			} else {
				e.st = stDone
			}
		}
		e.bomN = bomDone
		return p
	}
	return p
}

// writeSSE splits an event stream into lines, feeds the values of data lines
// to the JSON scanner, and resets it at the end of each event.
func (e *Extractor) writeSSE(p []byte) {
	n := len(p)
	lfPos, crPos := -1, -1 // next '\n' and '\r' at or after i (n: none), when >= i
	for i := 0; i < n; {
		if e.afterCR {
			e.afterCR = false
			if p[i] == '\n' {
				i++
				continue
			}
		}
		c := p[i]
		switch e.ln {
		case lnStart:
			switch c {
			case '\n', '\r':
				// An empty line ends the event.
				e.st, e.depth, e.memT, e.memC = stRoot, 0, 0, 0
				e.afterCR = c == '\r'
			case 'd':
				e.ln, e.field = lnField, 1
			default: // a comment (':') or another field
				e.ln = lnSkip
			}
			i++
		case lnField:
			if c == "data"[e.field] {
				i++
				if e.field++; e.field == 4 {
					e.ln = lnColon
				}
				continue
			}
			e.ln = lnSkip // c is looked at again
		case lnColon:
			switch c {
			case ':':
				e.ln = lnSpace
				i++
			case '\n', '\r':
				e.ln = lnData // "data" alone: an empty value
			default:
				e.ln = lnSkip
			}
		case lnSpace:
			if c == ' ' {
				i++
			}
			e.ln = lnData
		default: // lnData, lnSkip
			if lfPos < i {
				lfPos = indexFrom(p, i, '\n')
			}
			if crPos < i {
				crPos = indexFrom(p, i, '\r')
			}
			end := min(lfPos, crPos)
			data := e.ln == lnData
			if data && end > i {
				e.scan(p[i:end])
			}
			if end == n {
				return
			}
			if data {
				e.scan(lf)
			}
			e.afterCR = p[end] == '\r'
			e.ln = lnStart
			i = end + 1
		}
	}
}

// indexFrom returns the index of the first c in p at or after i, or len(p).
func indexFrom(p []byte, i int, c byte) int {
	if j := bytes.IndexByte(p[i:], c); j >= 0 {
		return i + j
	}
	return len(p)
}

// scan feeds the next bytes of a JSON document to the scanner.
func (e *Extractor) scan(p []byte) {
	st := e.st
	if st == stDone {
		return
	}
	n := len(p)
	// Next '"' and '\\' at or after i (n: none; bPos == qPos: none before
	// qPos), valid when >= i: they make skipping strings linear however many
	// escapes they hold.
	qPos, bPos := -1, -1
	i := 0
loop:
	for i < n {
		switch st {
		case stStr:
			// Most strings are short: look at a few bytes before
			// calling IndexByte.
			j, lim := i, min(n, i+16)
			for j < lim && p[j] != '"' && p[j] != '\\' {
				j++
			}
			if j < lim {
				i = j + 1
				if p[j] == '"' {
					st = e.strNext
				} else {
					st = stStrEsc
				}
				continue
			}
			if i = j; i == n {
				break loop
			}
			if qPos < i {
				qPos = indexFrom(p, i, '"')
			}
			if bPos < i {
				bPos = bytes.IndexByte(p[i:qPos], '\\')
				if bPos < 0 {
					bPos = qPos
				} else {
					bPos += i
				}
			}
			if bPos < qPos {
				i = bPos + 1
				st = stStrEsc
				continue
			}
			if qPos == n {
				break loop
			}
			i = qPos + 1
			st = e.strNext

		case stStrEsc:
			i++
			st = stStr

		case stAfter:
			c := p[i]
			i++
			switch c {
			case ' ', '\t', '\n', '\r':
			case ',':
				if e.arrays>>(e.depth-1)&1 != 0 {
					st = stValue
				} else {
					st = stObjKey
				}
			case '}', ']':
				if (e.arrays>>(e.depth-1)&1 != 0) != (c == ']') {
					st = stDone
					break loop
				}
				e.depth--
				if e.depth == 0 {
					st = stDone
					break loop
				}
			default:
				st = stDone
				break loop
			}

		case stValue, stArrFirst:
			c := p[i]
			switch c {
			case ' ', '\t', '\n', '\r':
				i++
				continue
			case ']':
				if st == stArrFirst {
					i++
					e.depth--
					st = stAfter
					continue
				}
			}
			t, k := e.memT, e.memC
			e.memT, e.memC = 0, 0
			if t == 0 && (c-'0' <= 9 || c == '-') {
				// A number whose value does not matter, in one piece.
				if j := numberEnd(p, i); j >= 0 {
					i = j
					st = stAfter
					continue
				}
			}
			i++
			switch {
			case c == '"':
				st, e.strNext = stStr, stAfter
			case c >= '1' && c <= '9':
				e.numStart(t, false)
				if t != 0 {
					e.digit(c, false)
				}
				st = stNumInt
			case c == '0':
				e.numStart(t, false)
				st = stNumZero
			case c == '-':
				e.numStart(t, true)
				st = stNumMinus
			case c == '{':
				if e.depth == maxDepth {
					st, e.deepN = stDeep, 1
					continue
				}
				e.depth++
				e.arrays &^= 1 << (e.depth - 1)
				e.alive[e.depth] = k
				st = stObjFirst
			case c == '[':
				if e.depth == maxDepth {
					st, e.deepN = stDeep, 1
					continue
				}
				e.depth++
				e.arrays |= 1 << (e.depth - 1)
				st = stArrFirst
			case c == 't':
				st, e.lit, e.litI = stLit, "true", 1
			case c == 'f':
				st, e.lit, e.litI = stLit, "false", 1
			case c == 'n':
				st, e.lit, e.litI = stLit, "null", 1
			default:
				st = stDone
				break loop
			}

		case stObjFirst, stObjKey:
			c := p[i]
			i++
			switch c {
			case ' ', '\t', '\n', '\r':
			case '"':
				if a := e.alive[e.depth]; a != 0 {
					e.keyMatch, e.keyLen, e.hiSur = a, 0, 0
					st = stKey
				} else {
					e.memT, e.memC = 0, 0
					st, e.strNext = stStr, stColon
				}
			case '}':
				if st != stObjFirst {
					st = stDone
					break loop
				}
				e.depth--
				if e.depth == 0 {
					st = stDone
					break loop
				}
				st = stAfter
			default:
				st = stDone
				break loop
			}

		case stColon:
			c := p[i]
			i++
			switch c {
			case ' ', '\t', '\n', '\r':
			case ':':
				st = stValue
			default:
				st = stDone
				break loop
			}

		case stKey:
			for i < n {
				c := p[i]
				if c == '"' {
					i++
					e.keyEnd()
					st = stColon
					continue loop
				}
				if c == '\\' {
					i++
					st = stKeyEsc
					continue loop
				}
				e.keyByte(c)
				i++
				if e.keyMatch == 0 {
					e.memT, e.memC = 0, 0
					st, e.strNext = stStr, stColon
					continue loop
				}
			}

		case stKeyEsc:
			c := p[i]
			i++
			st = stKey
			switch c {
			case '"', '\\', '/':
				e.keyByte(c)
			case 'b':
				e.keyByte('\b')
			case 'f':
				e.keyByte('\f')
			case 'n':
				e.keyByte('\n')
			case 'r':
				e.keyByte('\r')
			case 't':
				e.keyByte('\t')
			case 'u':
				st, e.hexN, e.hex = stKeyHex, 0, 0
			default: // invalid escape: the key matches nothing
				e.keyMatch = 0
			}

		case stKeyHex:
			c := p[i]
			var h rune
			switch {
			case c >= '0' && c <= '9':
				h = rune(c - '0')
			case c >= 'a' && c <= 'f':
				h = rune(c - 'a' + 10)
			case c >= 'A' && c <= 'F':
				h = rune(c - 'A' + 10)
			default: // invalid escape: the key matches nothing; c is looked at again
				e.keyMatch = 0
				st = stKey
				continue
			}
			i++
			e.hex = e.hex<<4 | h
			if e.hexN++; e.hexN == 4 {
				st = e.keyUnit(e.hex)
			}

		case stKeySurBS:
			if p[i] == '\\' {
				i++
				st = stKeySurU
			} else { // a lone high surrogate; p[i] is looked at again
				e.keyRune(utf8.RuneError)
				e.hiSur = 0
				st = stKey
			}

		case stKeySurU:
			if p[i] == 'u' {
				i++
				st, e.hexN, e.hex = stKeyHex, 0, 0
			} else { // a lone high surrogate, then another escape
				e.keyRune(utf8.RuneError)
				e.hiSur = 0
				st = stKeyEsc
			}

		case stLit:
			if p[i] != e.lit[e.litI] {
				st = stDone
				break loop
			}
			i++
			if e.litI++; e.litI == len(e.lit) {
				st = stAfter
			}

		case stNumMinus:
			c := p[i]
			i++
			switch {
			case c == '0':
				st = stNumZero
			case c >= '1' && c <= '9':
				if e.numCap != 0 {
					e.digit(c, false)
				}
				st = stNumInt
			default:
				st = stDone
				break loop
			}

		case stNumZero:
			switch p[i] {
			case '.':
				i++
				st = stNumDot
			case 'e', 'E':
				i++
				st = stNumE
			default:
				st = stAfter
				if e.numCap != 0 {
					e.numEnd()
				}
			}

		case stNumInt, stNumFrac:
			j := i
			for j < n && p[j]-'0' <= 9 {
				j++
			}
			if e.numCap != 0 {
				for _, c := range p[i:j] {
					e.digit(c, st == stNumFrac)
				}
			}
			i = j
			if i == n {
				break loop
			}
			switch p[i] {
			case '.':
				if st == stNumFrac {
					st = e.numEnd()
					continue
				}
				i++
				st = stNumDot
			case 'e', 'E':
				i++
				st = stNumE
			default:
				st = e.numEnd()
			}

		case stNumDot:
			c := p[i]
			if c-'0' > 9 {
				st = stDone
				break loop
			}
			st = stNumFrac

		case stNumE:
			c := p[i]
			i++
			switch {
			case c == '+':
				st = stNumESign
			case c == '-':
				e.numExpNeg = true
				st = stNumESign
			case c-'0' <= 9:
				e.expDigit(c)
				st = stNumExp
			default:
				st = stDone
				break loop
			}

		case stNumESign, stNumExp:
			c := p[i]
			if c-'0' <= 9 {
				i++
				e.expDigit(c)
				st = stNumExp
				continue
			}
			if st == stNumESign {
				st = stDone
				break loop
			}
			st = e.numEnd()

		case stRoot:
			c := p[i]
			i++
			switch c {
			case ' ', '\t', '\n', '\r':
			case '{':
				e.depth = 1
				e.arrays = 0
				e.alive[1] = uint8(1)<<e.paths.n - 1
				e.memT, e.memC = 0, 0
				st = stObjFirst
			default: // not an object: no path can match
				st = stDone
				break loop
			}

		case stDeep:
			// Only brackets and strings matter until the value ends: no
			// path reaches in, and its structure is not checked.
			j := i
			for j < n && p[j] != '"' && p[j] != '{' && p[j] != '}' && p[j] != '[' && p[j] != ']' {
				j++
			}
			if i = j; i == n {
				break loop
			}
			i++
			switch p[j] {
			case '"':
				st = stDeepStr
			case '{', '[':
				e.deepN++
			default:
				if e.deepN--; e.deepN == 0 {
					st = stAfter
				}
			}

		case stDeepStr:
			j := i
			for j < n && p[j] != '"' && p[j] != '\\' {
				j++
			}
			if i = j; i == n {
				break loop
			}
			i++
			if p[j] == '"' {
				st = stDeep
			} else {
				st = stDeepEsc
			}

		case stDeepEsc:
			i++
			st = stDeepStr

		default: // stDone
			break loop
		}
	}
	e.st = st
}

// numberEnd returns the end of the valid JSON number that starts at p[i],
// or -1 when it is not valid or not followed by another byte in p.
func numberEnd(p []byte, i int) int {
	n := len(p)
	if p[i] == '-' {
		if i++; i == n {
			return -1
		}
	}
	switch c := p[i]; {
	case c == '0':
		i++
	case c-'1' <= 8:
		for i++; i < n && p[i]-'0' <= 9; i++ {
		}
	default:
		return -1
	}
	if i == n {
		return -1
	}
	if p[i] == '.' {
		start := i + 1
		for i = start; i < n && p[i]-'0' <= 9; i++ {
		}
		if i == start || i == n {
			return -1
		}
	}
	if p[i]|0x20 == 'e' {
		if i++; i < n && (p[i] == '+' || p[i] == '-') {
			i++
		}
		start := i
		for ; i < n && p[i]-'0' <= 9; i++ {
		}
		if i == start || i == n {
			return -1
		}
	}
	return i
}

// keyByte compares the next byte of the (unescaped) key with the paths
// still matching it.
func (e *Extractor) keyByte(c byte) {
	d := e.depth - 1
	for m := e.keyMatch; m != 0; m &= m - 1 {
		k := bits.TrailingZeros8(m)
		seg := e.paths.seg[k][d]
		if e.keyLen >= len(seg) || seg[e.keyLen] != c {
			e.keyMatch &^= 1 << k
		}
	}
	e.keyLen++
}

// keyRune compares the UTF-8 encoding of r with the key.
func (e *Extractor) keyRune(r rune) {
	var b [utf8.UTFMax]byte
	for _, c := range b[:utf8.EncodeRune(b[:], r)] {
		e.keyByte(c)
	}
}

// keyUnit handles the UTF-16 code unit u of a \uXXXX escape in a key the way
// encoding/json does: a surrogate pair is one rune, a lone surrogate is
// U+FFFD. It returns the next state.
func (e *Extractor) keyUnit(u rune) uint8 {
	if e.hiSur != 0 {
		hi := e.hiSur
		e.hiSur = 0
		if u >= 0xDC00 && u < 0xE000 {
			e.keyRune(0x10000 + (hi-0xD800)<<10 + (u - 0xDC00))
			return stKey
		}
		e.keyRune(utf8.RuneError)
	}
	switch {
	case u >= 0xD800 && u < 0xDC00:
		e.hiSur = u
		return stKeySurBS
	case u >= 0xDC00 && u < 0xE000:
		e.keyRune(utf8.RuneError)
	default:
		e.keyRune(u)
	}
	return stKey
}

// keyEnd ends a compared key: the paths whose segment is exactly the key are
// the member's, those ending here in memT and the others in memC.
func (e *Extractor) keyEnd() {
	d := e.depth - 1
	m := e.keyMatch
	for r := m; r != 0; r &= r - 1 {
		k := bits.TrailingZeros8(r)
		if len(e.paths.seg[k][d]) != e.keyLen {
			m &^= 1 << k
		}
	}
	var term uint8
	if e.depth < len(e.paths.term) {
		term = e.paths.term[e.depth]
	}
	e.memT, e.memC = m&term, m&^term
}

// numStart starts a number that is the value of the paths in capture.
func (e *Extractor) numStart(capture uint8, neg bool) {
	e.numCap = capture
	if capture != 0 {
		e.numNeg, e.numSticky = neg, false
		e.numD, e.numM, e.numE = 0, 0, 0
		e.numExp, e.numExpNeg = 0, false
	}
}

// digit adds a mantissa digit to the number: the first 19 significant
// digits are kept exactly, later ones only scale it (integer part) and mark
// it as not exact (numSticky) when nonzero.
func (e *Extractor) digit(c byte, frac bool) {
	dg := uint64(c - '0')
	if e.numD < 19 {
		if e.numM != 0 || dg != 0 {
			e.numM = e.numM*10 + dg
			e.numD++
		}
		if frac {
			e.numE--
		}
		return
	}
	if !frac {
		e.numE++
	}
	if dg != 0 {
		e.numSticky = true
	}
}

// expDigit adds an exponent digit, saturating far beyond any exponent that
// matters.
func (e *Extractor) expDigit(c byte) {
	if e.numCap != 0 && e.numExp < 1e12 {
		e.numExp = e.numExp*10 + int64(c-'0')
	}
}

// numEnd ends a number: when it is the value of some paths and valid, it
// becomes their value. It returns the next state.
func (e *Extractor) numEnd() uint8 {
	if m := e.numCap; m != 0 {
		e.numCap = 0
		if v, ok := e.numValue(); ok {
			e.seen |= m
			for ; m != 0; m &= m - 1 {
				e.vals[bits.TrailingZeros8(m)] = v
			}
		}
	}
	return stAfter
}

// pow10 holds the powers of ten that fit a uint64.
var pow10 = [20]uint64{
	1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9,
	1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19,
}

// numValue returns the number read, rounded up to an integer and clamped to
// MaxCost, and ok=false when it is negative.
func (e *Extractor) numValue() (int64, bool) {
	if e.numM == 0 { // all digits zero (then nothing was dropped): 0 or -0
		return 0, true
	}
	if e.numNeg {
		return 0, false
	}
	exp := e.numE
	if e.numExpNeg {
		exp -= e.numExp
	} else {
		exp += e.numExp
	}
	// The value is in [10^(numD-1+exp), 10^(numD+exp)).
	if int64(e.numD)+exp > 16 { // >= 10^16 > MaxCost
		return MaxCost, true
	}
	var v uint64
	if exp >= 0 {
		v = e.numM * pow10[exp] // < 10^16; numSticky implies numD == 19, so not here
	} else if -exp >= int64(len(pow10)) {
		v = 1 // 0 < value < 1
	} else {
		p := pow10[-exp]
		v = e.numM / p
		if e.numM%p != 0 || e.numSticky {
			v++
		}
	}
	return int64(min(v, MaxCost)), true
}
