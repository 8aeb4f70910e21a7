package tollgate

import (
	"strings"
	"testing"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// TestE2EAnonymousBucketIsItsOwn: a key or tenant that resolves empty
// counts in a bucket no request value shares, "_anonymous" (the name it
// used to have) and every escaping look-alike included.
func TestE2EAnonymousBucketIsItsOwn(t *testing.T) {
	s := startCaddy(t, "", `
	route /zone {
		rate_limit {
			zone z {
				key {http.request.header.X-Key}
				events 1
				window 1h
			}
		}
		respond "ok"
	}
	route /tenant {
		rate_limit {
			tenant {http.request.header.X-Key}
			policy p {
				limit 1
				window 1h
			}
		}
		respond "ok"
	}`, nil)
	lookalikes := []string{"_anonymous", "{}", "%", "%00", "{_anonymous}", ":", "%#", "%-"}
	for _, path := range []string{"/zone", "/tenant"} {
		if r := s.get(path); r.status != 200 {
			t.Fatalf("%s without key: %d, want 200", path, r.status)
		}
		for _, v := range lookalikes {
			if r := s.get(path, "X-Key", v); r.status != 200 {
				t.Errorf("%s with key %q: %d, want 200 (its own bucket, not the empty key's)", path, v, r.status)
			}
		}
		if r := s.get(path); r.status != 429 {
			t.Errorf("%s without key again: %d, want 429", path, r.status)
		}
	}
}

func TestInternalName(t *testing.T) {
	long := strings.Repeat("n", 65)
	names := []string{"api", "a b", "a:b", "a/b", "", long, long + "x", "zone-a_b", "ÿ", "a\x00b", "a_b"}
	seen := map[string]string{}
	for _, n := range names {
		in := internalName(n)
		if !limiter.ValidName(in) {
			t.Errorf("internalName(%q) = %q, not a valid engine name", n, in)
		}
		if limiter.ValidName(n) && in != n {
			t.Errorf("internalName(%q) = %q, want the name itself", n, in)
		}
		if prev, dup := seen[in]; dup {
			t.Errorf("internalName(%q) = internalName(%q) = %q", n, prev, in)
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
		if got := headerName(in); got != want {
			t.Errorf("headerName(%q) = %q, want %q", in, got, want)
		}
	}
}
