package usage

import (
	"strings"
	"testing"
)

func TestParsePaths(t *testing.T) {
	seg64 := strings.Repeat("k", 64)
	nine := strings.Repeat("a+", 8) + "a"
	for _, tc := range []struct {
		in, want string
	}{
		{"usage.total_tokens", "usage.total_tokens"},
		{"usage.input_tokens+usage.output_tokens", "usage.input_tokens+usage.output_tokens"},
		{" usage.input_tokens + usage.output_tokens\t", "usage.input_tokens+usage.output_tokens"},
		{"n", "n"},
		{"a.b.c.d.e.f.g.h", "a.b.c.d.e.f.g.h"},
		{"a+b+c+d+e+f+g+h", "a+b+c+d+e+f+g+h"},
		{seg64 + "." + seg64, seg64 + "." + seg64},
		{`us"age.x\y.café.😀.$[0]`, `us"age.x\y.café.😀.$[0]`},
		{"a.b+a", "a.b+a"},
		{"a.b+a.c+b.a", "a.b+a.c+b.a"},
	} {
		p, err := ParsePaths(tc.in)
		if err != nil {
			t.Errorf("ParsePaths(%q): %v", tc.in, err)
			continue
		}
		if got := p.String(); got != tc.want {
			t.Errorf("ParsePaths(%q).String() = %q, want %q", tc.in, got, tc.want)
		}
		again, err := ParsePaths(p.String())
		if err != nil || again != p {
			t.Errorf("ParsePaths(%q) does not round-trip: %v, %v", p.String(), again, err)
		}
	}

	for _, tc := range []struct {
		in, want string
	}{
		{"", "empty cost expression: want paths like usage.total_tokens, joined by '+'"},
		{" \t", "empty cost expression: want paths like usage.total_tokens, joined by '+'"},
		{"a.b+usage..x", `path 2 ("usage..x"): empty segment`},
		{".a", `path 1 (".a"): empty segment`},
		{"a.", `path 1 ("a."): empty segment`},
		{"a+", `path 2 (""): empty path`},
		{"+a", `path 1 (""): empty path`},
		{"a+ +b", `path 2 (""): empty path`},
		{"a.b c", `path 1 ("a.b c"): segment "b c" contains whitespace`},
		{"a.b\u00a0c.\td", `path 1 ("a.b\u00a0c.\td"): segment "\td" contains whitespace`},
		{"a." + seg64 + "k", `path 1 ("a.` + seg64 + `k"): segment "` + seg64 + `k" is 65 bytes, at most 64`},
		{"a.b.c.d.e.f.g.h.i", `path 1 ("a.b.c.d.e.f.g.h.i"): 9 segments, at most 8`},
		{nine, `cost expression "` + nine + `" has 9 paths, at most 8`},
		{"a.b+c+a.b", `path 3 ("a.b"): duplicate of path 1`},
	} {
		_, err := ParsePaths(tc.in)
		if err == nil {
			t.Errorf("ParsePaths(%q): no error, want %s", tc.in, tc.want)
		} else if err.Error() != tc.want {
			t.Errorf("ParsePaths(%q): error %q, want %q", tc.in, err, tc.want)
		}
	}

	if got := (Paths{}).String(); got != "" {
		t.Errorf("zero Paths: String() = %q", got)
	}
}
