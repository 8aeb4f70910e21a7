package usage

import (
	"errors"
	"fmt"
	"strings"
)

// Limits of a cost expression.
const (
	maxPaths  = 8  // paths per expression
	maxSegs   = 8  // segments per path
	maxSegLen = 64 // bytes per segment
)

// Paths is a parsed cost expression: one or more dot-separated paths of
// JSON object keys whose numbers are summed, e.g. "usage.total_tokens" or
// "usage.input_tokens+usage.output_tokens". The zero value has no path: an
// Extractor using it never finds a value. A Paths is immutable, so one value
// may be shared by any number of Extractors and goroutines.
type Paths struct {
	n    int                       // number of paths
	nseg [maxPaths]int             // segments of each path
	seg  [maxPaths][maxSegs]string // the segments (object keys), unescaped
	term [maxSegs + 1]uint8        // term[d]: mask of the paths with exactly d segments
}

// ParsePaths parses "a.b[+c.d...]": paths joined by '+', each a list of
// object keys joined by '.'. Rules: segments are non-empty object keys made
// of any bytes except '.', '+' and whitespace; at most 8 paths, at most 8
// segments per path, each segment at most 64 bytes. ASCII whitespace around
// a path (around a '+', or at either end) is ignored, so
// "usage.input_tokens + usage.output_tokens" is accepted; a path may not be
// given twice (it would be counted twice). Errors say which rule failed and
// quote the offending part, e.g. `path 2 ("usage..x"): empty segment`.
func ParsePaths(s string) (Paths, error) {
	var p Paths
	if trimSpace(s) == "" {
		return p, errors.New("empty cost expression: want paths like usage.total_tokens, joined by '+'")
	}
	if n := strings.Count(s, "+") + 1; n > maxPaths {
		return p, fmt.Errorf("cost expression %q has %d paths, at most %d", s, n, maxPaths)
	}
	rest := s
	for k := 0; ; k++ {
		part, tail, more := strings.Cut(rest, "+")
		rest = tail
		part = trimSpace(part)
		if part == "" {
			return Paths{}, fmt.Errorf("path %d (%q): empty path", k+1, part)
		}
		if n := strings.Count(part, ".") + 1; n > maxSegs {
			return Paths{}, fmt.Errorf("path %d (%q): %d segments, at most %d", k+1, part, n, maxSegs)
		}
		segs := part
		for j := 0; ; j++ {
			seg, tail, more := strings.Cut(segs, ".")
			segs = tail
			switch {
			case seg == "":
				return Paths{}, fmt.Errorf("path %d (%q): empty segment", k+1, part)
			case len(seg) > maxSegLen:
				return Paths{}, fmt.Errorf("path %d (%q): segment %q is %d bytes, at most %d", k+1, part, seg, len(seg), maxSegLen)
			case strings.ContainsAny(seg, " \t\n\v\f\r"):
				return Paths{}, fmt.Errorf("path %d (%q): segment %q contains whitespace", k+1, part, seg)
			}
			p.seg[k][j] = seg
			if !more {
				p.nseg[k] = j + 1
				break
			}
		}
		for prev := 0; prev < k; prev++ {
			if p.nseg[prev] == p.nseg[k] && p.seg[prev] == p.seg[k] {
				return Paths{}, fmt.Errorf("path %d (%q): duplicate of path %d", k+1, part, prev+1)
			}
		}
		p.term[p.nseg[k]] |= 1 << k
		p.n = k + 1
		if !more {
			return p, nil
		}
	}
}

// String returns the canonical form of the expression: the paths joined by
// '+' and their segments by '.', without whitespace. It round-trips through
// ParsePaths.
func (p Paths) String() string {
	var b strings.Builder
	for k := 0; k < p.n; k++ {
		if k > 0 {
			b.WriteByte('+')
		}
		for j := 0; j < p.nseg[k]; j++ {
			if j > 0 {
				b.WriteByte('.')
			}
			b.WriteString(p.seg[k][j])
		}
	}
	return b.String()
}

// trimSpace removes ASCII whitespace at both ends of s.
func trimSpace(s string) string {
	return strings.Trim(s, " \t\n\v\f\r")
}
