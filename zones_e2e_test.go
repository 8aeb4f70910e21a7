package tollgate

import (
	"testing"
)

// TestE2EAnonymousBucketIsItsOwn: a key or tenant that resolves empty
// counts in the "_anonymous" bucket, which no request value shares: not
// the literal "_anonymous" (its name), nor any escaping look-alike.
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
	lookalikes := []string{"_anonymous", "%5Fanonymous", "%5fanonymous", "{}", "%", "%00", "{_anonymous}", ":", "%#", "%-"}
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
