package limiter

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

// unescapeValue inverts AppendEscaped for values that were not hashed.
func unescapeValue(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(s) {
			return "", errors.New("truncated escape")
		}
		v, err := hex.DecodeString(s[i+1 : i+3])
		if err != nil || strings.ToUpper(s[i+1:i+3]) != s[i+1:i+3] {
			return "", errors.New("bad escape " + s[i:i+3])
		}
		b.WriteByte(v[0])
		i += 2
	}
	return b.String(), nil
}

// checkEscaped reports the first byte of an escaped value that could
// break a key: a brace, a colon, a control byte, or a '%' that does not
// start "%XX" (upper-case hex) or the "%#" digest marker.
func checkEscaped(out []byte) error {
	for i := 0; i < len(out); i++ {
		c := out[i]
		switch {
		case c == '{' || c == '}' || c == ':' || c < 0x20 || c == 0x7f:
			return errors.New("forbidden byte " + strings.TrimSpace(hex.EncodeToString([]byte{c})))
		case c == '%':
			if i == 0 && len(out) == len(hashedMarker)+64 && string(out[:2]) == hashedMarker {
				if _, err := hex.DecodeString(string(out[2:])); err != nil {
					return errors.New("digest is not hex")
				}
				return nil
			}
			if i+2 >= len(out) || !strings.ContainsRune(upperhex, rune(out[i+1])) || !strings.ContainsRune(upperhex, rune(out[i+2])) {
				return errors.New("bare '%'")
			}
		}
	}
	return nil
}

var hostileValues = []string{
	"",
	"a",
	"a:b",
	"a%3Ab",
	"a%3ab",
	"%",
	"%%",
	"%#",
	"{",
	"}",
	"{a}",
	"}{",
	"a}:{b",
	":",
	"::",
	"\n",
	"a\nb",
	"\r\n",
	"\x00",
	"a\x00b",
	"\x7f",
	"\x1b[31m",
	"é",
	"\xff\xfe",
	"tenant with spaces",
	strings.Repeat("x", MaxValueLen),
	strings.Repeat("x", MaxValueLen+1),
	strings.Repeat("x", MaxValueLen-1) + "{",
	strings.Repeat(":", MaxValueLen),
	strings.Repeat("{", 42),
	strings.Repeat("{", 43),
	strings.Repeat("\x00", 43),
	"%23" + strings.Repeat("a", 62),
	strings.Repeat("y", 1<<20),
	strings.Repeat("y", 1<<20) + "z",
}

func TestAppendEscaped(t *testing.T) {
	seen := map[string]string{}
	for _, v := range hostileValues {
		out := AppendEscaped(nil, v)
		if err := checkEscaped(out); err != nil {
			t.Errorf("%.40q -> %.60q: %v", v, out, err)
		}
		if prev, dup := seen[string(out)]; dup {
			t.Errorf("%.40q and %.40q both escape to %.60q", prev, v, out)
		}
		seen[string(out)] = v
		if len(v) > MaxValueLen {
			sum := sha256.Sum256([]byte(v))
			if want := hashedMarker + hex.EncodeToString(sum[:]); string(out) != want {
				t.Errorf("long value -> %q, want %q", out, want)
			}
			continue
		}
		if got, err := unescapeValue(string(out)); err != nil || got != v {
			t.Errorf("unescape(%q) = %q, %v; want %q", out, got, err, v)
		}
	}
	// Exact encodings.
	for v, want := range map[string]string{
		"":       "",
		"a:b":    "a%3Ab",
		"a%3Ab":  "a%253Ab",
		"{a}":    "%7Ba%7D",
		"\n\x00": "%0A%00",
		"\x7f":   "%7F",
		"é":      "é",
	} {
		if got := string(AppendEscaped(nil, v)); got != want {
			t.Errorf("AppendEscaped(%q) = %q, want %q", v, got, want)
		}
	}
	// Appends to dst.
	if got := string(AppendEscaped([]byte("pre:"), "a:")); got != "pre:a%3A" {
		t.Errorf("append: %q", got)
	}
	// The bound applies to the raw value: 128 bytes are kept, escaped
	// (up to 3 x 128 bytes), whatever they escape to; 129 bytes are
	// digested, even when nothing in them needs escaping.
	digest := func(v string) string {
		sum := sha256.Sum256([]byte(v))
		return "%#" + hex.EncodeToString(sum[:])
	}
	for _, tc := range []struct{ v, want string }{
		{strings.Repeat("x", 128), strings.Repeat("x", 128)},
		{strings.Repeat("x", 129), digest(strings.Repeat("x", 129))},
		{strings.Repeat("x", 127) + ":", strings.Repeat("x", 127) + "%3A"},
		{strings.Repeat("x", 128) + ":", digest(strings.Repeat("x", 128) + ":")},
		{strings.Repeat("{", 42) + "abc", strings.Repeat("%7B", 42) + "abc"},
		{strings.Repeat("{", 43), strings.Repeat("%7B", 43)},
		{strings.Repeat("{", 128), strings.Repeat("%7B", 128)},
		{strings.Repeat("{", 129), digest(strings.Repeat("{", 129))},
		{strings.Repeat("\x00", 128), strings.Repeat("%00", 128)},
		{strings.Repeat("%", 127) + "_", strings.Repeat("%25", 127) + "_"},
		{strings.Repeat(":", 129), digest(strings.Repeat(":", 129))},
		{"%#" + strings.Repeat("a", 126), "%25#" + strings.Repeat("a", 126)},
	} {
		if got := string(AppendEscaped(nil, tc.v)); got != tc.want {
			t.Errorf("%.20q... (%d bytes) -> %.30q... (%d bytes), want %.30q... (%d bytes)", tc.v, len(tc.v), got, len(got), tc.want, len(tc.want))
		}
	}
}

func TestAppendKey(t *testing.T) {
	for _, tc := range []struct {
		algo                 Algorithm
		tenant, policy, part string
		want                 string
	}{
		{TokenBucket, "acme", "api", "", "rl:token_bucket:{acme}:api"},
		{SlidingWindow, "acme", "api", "GET /v1", "rl:sliding_window:{acme}:api:GET /v1"},
		{GCRA, "a:b", "api", "x:y", "rl:gcra:{a%3Ab}:api:x%3Ay"},
		{FixedWindow, "}{", "p", "", "rl:fixed_window:{%7D%7B}:p"},
		{SlidingLog, Anonymous, "p", "", "rl:sliding_log:{_anonymous}:p"},
		{SlidingLog, "", "p", "", "rl:sliding_log:{%5Fanonymous}:p"},
		{SlidingLog, "%5Fanonymous", "p", "", "rl:sliding_log:{%255Fanonymous}:p"},
		{SlidingLog, "%", "p", "", "rl:sliding_log:{%25}:p"},
		{Concurrency, "t", "p", "{x}", "rl:concurrency:{t}:p:%7Bx%7D"},
	} {
		if got := string(AppendKey(nil, "rl", tc.algo, tc.tenant, tc.policy, tc.part)); got != tc.want {
			t.Errorf("AppendKey = %q, want %q", got, tc.want)
		}
	}
	// The empty tenant's keys share one Cluster slot, as every tenant's
	// do (an empty hash tag would hash each whole key).
	if a, b := keySlot(AppendKey(nil, "rl", TokenBucket, "", "a", "")), keySlot(AppendKey(nil, "rl", GCRA, "", "b", "x")); a != b {
		t.Errorf("empty tenant's keys in slots %d and %d", a, b)
	}
	// No (tenant, part) pair can produce the key of another pair.
	seen := map[string][2]string{}
	for _, tenant := range hostileValues[:25] {
		for _, part := range hostileValues[:25] {
			k := string(AppendKey(nil, "rl", TokenBucket, tenant, "p", part))
			if prev, dup := seen[k]; dup {
				t.Fatalf("(%q, %q) and (%q, %q) share key %q", prev[0], prev[1], tenant, part, k)
			}
			seen[k] = [2]string{tenant, part}
		}
	}
	// A long value gives a fixed-length key.
	a := AppendKey(nil, "rl", TokenBucket, strings.Repeat("t", 1<<20), "p", strings.Repeat("k", 1000))
	b := AppendKey(nil, "rl", TokenBucket, strings.Repeat("u", 200), "p", strings.Repeat("v", 129))
	if len(a) != len(b) || len(a) > 200 {
		t.Errorf("long keys: %d and %d bytes", len(a), len(b))
	}
}

// TestTenantOf: a request's empty tenant is the anonymous tenant, tagged
// "_anonymous"; a request sending "_anonymous" is another tenant, tagged
// "%5Fanonymous"; no two request values share a tag; TenantOf is its own
// inverse.
func TestTenantOf(t *testing.T) {
	for _, tc := range []struct{ sent, tenant, tag string }{
		{"", Anonymous, "_anonymous"},
		{"_anonymous", "", "%5Fanonymous"},
		{"%5Fanonymous", "%5Fanonymous", "%255Fanonymous"},
		{"%5fanonymous", "%5fanonymous", "%255fanonymous"},
		{"{_anonymous}", "{_anonymous}", "%7B_anonymous%7D"},
		{"_Anonymous", "_Anonymous", "_Anonymous"},
		{"acme", "acme", "acme"},
	} {
		if got := TenantOf(tc.sent); got != tc.tenant {
			t.Errorf("TenantOf(%q) = %q, want %q", tc.sent, got, tc.tenant)
		}
		if got := string(AppendTenantTag(nil, TenantOf(tc.sent))); got != tc.tag {
			t.Errorf("tag of a request sending %q = %q, want %q", tc.sent, got, tc.tag)
		}
	}
	sent := append([]string{Anonymous, literalAnonymousTag, "%5F", "_anonymous "}, hostileValues...)
	seen := map[string]string{}
	for _, v := range sent {
		tenant := TenantOf(v)
		if back := TenantOf(tenant); back != v {
			t.Errorf("TenantOf(TenantOf(%.40q)) = %.40q", v, back)
		}
		tag := string(AppendTenantTag(nil, tenant))
		if tag == "" {
			t.Errorf("request value %.40q: empty hash tag", v)
		}
		if prev, dup := seen[tag]; dup {
			t.Errorf("request values %.40q and %.40q share the tag %.60q", prev, v, tag)
		}
		seen[tag] = v
	}
}

// FuzzTenantTag: two different request values never share a hash tag.
func FuzzTenantTag(f *testing.F) {
	f.Add("", "_anonymous")
	f.Add("_anonymous", "%5Fanonymous")
	f.Add("", "%")
	f.Add(strings.Repeat("{", 43), "%#")
	f.Fuzz(func(t *testing.T, a, b string) {
		if a == b {
			return
		}
		ta, tb := AppendTenantTag(nil, TenantOf(a)), AppendTenantTag(nil, TenantOf(b))
		if bytes.Equal(ta, tb) {
			t.Fatalf("request values %q and %q share the tag %q", a, b, ta)
		}
	})
}

func TestValidName(t *testing.T) {
	for s, want := range map[string]bool{
		"api": true, "a.b-c_D9": true, "": false, "a:b": false, "a{": false,
		"a b": false, strings.Repeat("x", 64): true, strings.Repeat("x", 65): false,
	} {
		if ValidName(s) != want {
			t.Errorf("ValidName(%q) = %v", s, !want)
		}
	}
}

func FuzzAppendEscaped(f *testing.F) {
	for _, v := range hostileValues {
		if len(v) < 4096 {
			f.Add(v)
		}
	}
	f.Fuzz(func(t *testing.T, v string) {
		out := AppendEscaped([]byte("x"), v)
		if out[0] != 'x' {
			t.Fatal("dst overwritten")
		}
		out = out[1:]
		if err := checkEscaped(out); err != nil {
			t.Fatalf("%q -> %q: %v", v, out, err)
		}
		if len(out) > 3*MaxValueLen {
			t.Fatalf("%q -> %d bytes, more than 3 x MaxValueLen", v, len(out))
		}
		if len(v) > MaxValueLen {
			sum := sha256.Sum256([]byte(v))
			if string(out) != hashedMarker+hex.EncodeToString(sum[:]) {
				t.Fatalf("long value -> %q", out)
			}
			return
		}
		// Escaping is invertible, hence injective on short values, and a
		// short value never looks like a digest.
		if got, err := unescapeValue(string(out)); err != nil || got != v {
			t.Fatalf("unescape(%q) = %q, %v; want %q", out, got, err, v)
		}
		if bytes.HasPrefix(out, []byte(hashedMarker)) {
			t.Fatalf("short value %q looks like a digest: %q", v, out)
		}
		// '_' is never escaped, so no value's escaped form is the tag
		// of the literal "_anonymous" (literalAnonymousTag).
		if bytes.Contains(out, []byte("%5F")) {
			t.Fatalf("%q -> %q contains %%5F", v, out)
		}
		if len(out) > 3*len(v) {
			t.Fatalf("%q grew to %d bytes", v, len(out))
		}
	})
}

func FuzzAppendKey(f *testing.F) {
	f.Add("acme", "api", "")
	f.Add("a}:{b", "p", "x:{y}")
	f.Add("{", "p", "}")
	f.Add("", "p", "")
	f.Add(strings.Repeat("{", 200), "p.v2", strings.Repeat("}", 200))
	f.Add("\x00\n", "bad:policy", "\xff")
	f.Fuzz(func(t *testing.T, tenant, policy, part string) {
		if !ValidName(policy) {
			policy = "p"
		}
		key := AppendKey(nil, "rl", SlidingWindow, tenant, policy, part)
		// The hash tag Redis Cluster uses is the text between the first
		// '{' and the next '}': it must be exactly the escaped tenant.
		open := bytes.IndexByte(key, '{')
		if open < 0 {
			t.Fatalf("no '{' in %q", key)
		}
		end := bytes.IndexByte(key[open+1:], '}')
		if end < 0 {
			t.Fatalf("no '}' in %q", key)
		}
		if tag := key[open+1 : open+1+end]; !bytes.Equal(tag, AppendTenantTag(nil, tenant)) || len(tag) == 0 {
			t.Fatalf("hash tag %q of %q, tenant %q", tag, key, tenant)
		}
		if bytes.Count(key, []byte("{")) != 1 || bytes.Count(key, []byte("}")) != 1 {
			t.Fatalf("extra braces in %q", key)
		}
		wantParts := 4
		if part != "" {
			wantParts = 5
		}
		if n := len(bytes.Split(key, []byte(":"))); n != wantParts {
			t.Fatalf("%q has %d ':'-separated fields, want %d", key, n, wantParts)
		}
		if !memKeyMatches(string(key), "rl", string(AppendTenantTag(nil, tenant)), policy) {
			t.Fatalf("Reset would not match %q", key)
		}
	})
}
