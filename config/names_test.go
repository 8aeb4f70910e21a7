package config

import (
	"strings"
	"testing"

	"github.com/tollgate/caddy-tollgate/limiter"
)

func TestInternalName(t *testing.T) {
	long := strings.Repeat("n", 65)
	names := []string{"api", "a b", "a:b", "a/b", "", long, long + "x", "zone-a_b", "ÿ", "a\x00b", "a_b"}
	seen := map[string]string{}
	for _, n := range names {
		in := InternalName(n)
		if !limiter.ValidName(in) {
			t.Errorf("InternalName(%q) = %q, not a valid engine name", n, in)
		}
		if limiter.ValidName(n) && in != n {
			t.Errorf("InternalName(%q) = %q, want the name itself", n, in)
		}
		if prev, dup := seen[in]; dup {
			t.Errorf("InternalName(%q) = InternalName(%q) = %q", n, prev, in)
		}
		seen[in] = n
	}
}

func TestHeaderName(t *testing.T) {
	for in, want := range map[string]string{
		"api":        "api",
		"a b:c/d":    "a b:c/d",
		`say "hi"\`:  `say \"hi\"\\`,
		"100%":       "100%25",
		"ünï\x00":    "%C3%BCn%C3%AF%00",
		"tab\tthere": "tab%09there",
	} {
		if got := HeaderName(in); got != want {
			t.Errorf("HeaderName(%q) = %q, want %q", in, got, want)
		}
	}
}
