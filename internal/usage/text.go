package usage

// TextCounter counts the bytes of generated text in a JSON body or event
// stream: the string values of members named like the text fields of LLM
// APIs (content, text, delta, arguments, partial_json, refusal, reasoning,
// reasoning_content, thinking), at any depth. It estimates what a response
// cost when its usage never arrived: about 4 bytes of English text per
// token. It reads the body lexically (strings, and whether a ':' follows
// one), without checking structure, so it never gives up on a document;
// like Extractor, it holds a fixed amount of state and allocates nothing.
// The zero value is ready to use; Reset makes it like new.
type TextCounter struct {
	n int64 // bytes counted

	inStr    bool
	esc      bool
	counting bool // the string being read is a text value
	// key holds the first bytes of the string being read (to compare it
	// with the text field names once it ends); keyLen may exceed
	// len(key), then it matches none.
	key    [maxTextKey]byte
	keyLen int
	// afterKey: the last token was a string naming a text field;
	// valueNext: ... and a ':' followed it.
	afterKey, valueNext bool
}

// maxTextKey is the length of the longest text field name.
const maxTextKey = len("reasoning_content")

// textKeys are the members whose string values are generated text.
var textKeys = [...]string{"content", "text", "delta", "arguments", "partial_json", "refusal", "reasoning", "reasoning_content", "thinking"}

// Reset forgets everything counted.
func (c *TextCounter) Reset() { *c = TextCounter{} }

// Bytes returns the bytes of text counted so far (as sent: an escape
// sequence counts its bytes).
func (c *TextCounter) Bytes() int64 { return c.n }

// Write reads the next chunk of the body.
func (c *TextCounter) Write(p []byte) {
	for i := 0; i < len(p); {
		if c.inStr {
			// Skip to the next quote, backslash or line end.
			j := i
			if !c.esc {
				for j < len(p) && p[j] != '"' && p[j] != '\\' && p[j] != '\n' && p[j] != '\r' {
					j++
				}
			}
			c.strBytes(p[i:j])
			if j == len(p) {
				return
			}
			b := p[j]
			i = j + 1
			switch {
			case c.esc:
				c.esc = false
				c.strBytes(p[j : j+1])
			case b == '\\':
				c.esc = true
				c.strBytes(p[j : j+1])
			case b == '"':
				c.inStr = false
				c.afterKey = !c.counting && c.isTextKey()
				c.counting = false
			default:
				// A line end inside a string: not JSON (an event
				// stream's next line); start afresh.
				c.inStr, c.counting, c.afterKey, c.valueNext = false, false, false, false
			}
			continue
		}
		b := p[i]
		i++
		switch b {
		case ' ', '\t', '\n', '\r':
		case ':':
			c.valueNext = c.afterKey
			c.afterKey = false
		case '"':
			c.inStr, c.esc, c.keyLen = true, false, 0
			c.counting = c.valueNext
			c.afterKey, c.valueNext = false, false
		default:
			c.afterKey, c.valueNext = false, false
		}
	}
}

// strBytes takes bytes of the string being read.
func (c *TextCounter) strBytes(b []byte) {
	if c.counting {
		c.n += int64(len(b))
		return
	}
	if c.keyLen < len(c.key) {
		copy(c.key[c.keyLen:], b)
	}
	c.keyLen += len(b)
}

// isTextKey reports whether the string just read names a text field.
func (c *TextCounter) isTextKey() bool {
	if c.keyLen > len(c.key) {
		return false
	}
	k := c.key[:c.keyLen]
	for _, name := range textKeys {
		if string(k) == name {
			return true
		}
	}
	return false
}
