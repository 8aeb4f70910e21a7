package llm

import (
	"bytes"
	"encoding/json"
	"io"
)

// UsageStripper passes an OpenAI-style event stream on to the client
// without what asking for usage added to it: the usage-only chunk at the
// end (empty "choices", a "usage" object) is dropped, and the
// "usage":null member of every other chunk removed. Everything else,
// event boundaries and line ends included, passes byte for byte. Events
// are held until their blank line (an incomplete event is of no use to a
// client anyway); an event longer than MaxEvent, or a stream that is not
// made of such events, is passed on as it is from there on.
type UsageStripper struct {
	w    io.Writer
	buf  []byte
	scan int  // bytes of buf scanned without finding the end of an event
	raw  bool // pass everything on from now on
}

// MaxEvent is the longest event held to be edited.
const MaxEvent = 1 << 20

// Reset makes s write to w, forgetting what it held.
func (s *UsageStripper) Reset(w io.Writer) {
	s.w, s.scan, s.raw = w, 0, false
	if cap(s.buf) > 64<<10 {
		s.buf = nil // do not keep a large buffer pooled
	}
	s.buf = s.buf[:0]
}

// Write takes the next bytes of the stream; it writes the events they
// complete. It returns len(p), or 0 and the error of the writer below.
func (s *UsageStripper) Write(p []byte) (int, error) {
	if s.raw {
		return s.w.Write(p)
	}
	s.buf = append(s.buf, p...)
	// Each byte is scanned once, and what is held moved once per Write:
	// an event held while it arrives in small writes, or many small
	// events in one write, must not cost time quadratic in their size.
	done := 0 // the events written
	for {
		end := eventEnd(s.buf[done:], s.scan, false)
		if end < 0 {
			break
		}
		if _, err := s.w.Write(stripEvent(s.buf[done : done+end])); err != nil {
			s.buf, s.scan = s.buf[:0], 0
			return 0, err
		}
		done += end
		s.scan = 0
	}
	if done > 0 {
		s.buf = s.buf[:copy(s.buf, s.buf[done:])]
	}
	s.scan = len(s.buf)
	if s.scan > 0 && s.buf[s.scan-1] == '\r' {
		s.scan-- // perhaps the first half of a CR LF: scanned again
	}
	if len(s.buf) > MaxEvent {
		s.raw = true
		_, err := s.w.Write(s.buf)
		s.buf, s.scan = s.buf[:0], 0
		if err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Close writes what is held (an event the stream did not end).
func (s *UsageStripper) Close() error {
	if len(s.buf) == 0 {
		return nil
	}
	_, err := s.w.Write(s.buf)
	s.buf, s.scan = s.buf[:0], 0
	return err
}

// eventEnd returns the length of the first complete event of b (up to and
// including the empty line that ends it), or -1. Scanning starts at from:
// b[:from] is known to hold no end of an event nor to end halfway through
// a CR LF.
// A CR at the end of b may be the first half of a CR LF: it ends a line
// only when final (nothing follows b).
func eventEnd(b []byte, from int, final bool) int {
	// At the start of a line (an empty line alone ends an event).
	lineStart := from == 0 || b[from-1] == '\n' || b[from-1] == '\r'
	for i := from; i < len(b); i++ {
		c := b[i]
		if c != '\n' && c != '\r' {
			lineStart = false
			continue
		}
		end := i + 1
		if c == '\r' {
			if end == len(b) && !final {
				return -1
			}
			if end < len(b) && b[end] == '\n' {
				end++
			}
		}
		if lineStart {
			return end
		}
		lineStart = true
		i = end - 1
	}
	return -1
}

// twoLineEnds reports whether b is exactly a line end and an empty line:
// what follows the data line of an event of one line.
func twoLineEnds(b []byte) bool {
	for range 2 {
		switch {
		case bytes.HasPrefix(b, []byte("\r\n")):
			b = b[2:]
		case len(b) > 0 && (b[0] == '\n' || b[0] == '\r'):
			b = b[1:]
		default:
			return false
		}
	}
	return len(b) == 0
}

// stripEvent returns the event ev edited: nil for a usage-only chunk,
// without "usage":null for another chunk, else ev itself. Only an event
// of one data line holding a JSON object is edited.
func stripEvent(ev []byte) []byte {
	if !bytes.HasPrefix(ev, []byte("data:")) {
		return ev
	}
	lineEnd := bytes.IndexAny(ev, "\r\n")
	start := len("data:")
	if start < lineEnd && ev[start] == ' ' {
		start++
	}
	doc := ev[start:lineEnd]
	if !twoLineEnds(ev[lineEnd:]) || !bytes.HasPrefix(bytes.TrimLeft(doc, " \t"), []byte("{")) || !json.Valid(doc) {
		return ev // several lines, or not an object
	}
	u, ok := findMember(doc, "usage")
	if !ok {
		return ev
	}
	if v := doc[u.val:u.end]; string(v) == "null" {
		out := make([]byte, 0, len(ev))
		out = append(out, ev[:start]...)
		out = append(out, removeMember(doc, u)...)
		return append(out, ev[lineEnd:]...)
	} else if v[0] != '{' {
		return ev
	}
	if c, ok := findMember(doc, "choices"); ok && string(bytes.Join(bytes.Fields(doc[c.val:c.end]), nil)) == "[]" {
		return nil // the usage chunk: the client did not ask for it
	}
	return ev
}
