package tollgate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// orderWarning is the start of the adapt-time warning of a rate_limit
// that caddy-ratelimit ran before authentication and Tollgate runs after.
const orderWarning = "rate_limit now runs after"

// TestBinaryOrderWarning: `caddy adapt` on the built binary warns, with
// the file, line and fix, about a caddy-ratelimit Caddyfile whose
// rate_limit shares a block with basic_auth or forward_auth (a site or a
// handle block, whose handlers Caddy sorts), and about nothing else: not
// a route block (written order), not a global order line that places
// rate_limit (before or after: it meant the same there), not
// authentication in another block, not a Tollgate config (a tenant,
// policies), and none of the examples of our README and docs.
func TestBinaryOrderWarning(t *testing.T) {
	const zone = `	rate_limit {
		zone logins {
			key {remote_host}
			events 5
			window 1m
		}
	}
`
	const auth = `	basic_auth {
		alice $2a$10$1y0ggp3aup/R3N.uGkpAauA2L8aqM8Se1qNdxGvvpxb9ArsE0Lecy
	}
`
	adapt := func(t *testing.T, src string) string {
		t.Helper()
		file := filepath.Join(t.TempDir(), "Caddyfile")
		if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := execCaddy(t, "adapt", "--config", file, "--adapter", "caddyfile")
		if err != nil {
			t.Fatalf("adapt: %v\n%s", err, out)
		}
		return strings.ReplaceAll(out, file, "Caddyfile")
	}
	for _, tc := range []struct {
		name, src string
		warn      string // "" for none; else what the warning says
	}{
		{"site with basic_auth", ":8080 {\n" + zone + auth + "\trespond ok\n}\n", "Caddyfile:2: rate_limit now runs after basic_auth"},
		{"basic_auth first", ":8080 {\n" + auth + zone + "\trespond ok\n}\n", "Caddyfile:5: rate_limit now runs after basic_auth"},
		{"forward_auth", ":8080 {\n" + zone + "\tforward_auth 127.0.0.1:9 {\n\t\turi /auth\n\t}\n\trespond ok\n}\n", "`order rate_limit before forward_auth`"},
		{"handle block", ":8080 {\n\thandle /admin/* {\n" + zone + auth + "\t\trespond ok\n\t}\n}\n", "Caddyfile:3: rate_limit now runs after basic_auth"},
		{"route block", ":8080 {\n\troute {\n" + zone + auth + "\t\trespond ok\n\t}\n}\n", ""},
		{"global order first", "{\n\torder rate_limit before basic_auth\n}\n:8080 {\n" + zone + auth + "\trespond ok\n}\n", ""},
		{"global order after (as in caddy-ratelimit)", "{\n\torder rate_limit after basic_auth\n}\n:8080 {\n" + zone + auth + "\trespond ok\n}\n", ""},
		{"auth in another block", ":8080 {\n" + zone + "\thandle /admin/* {\n" + auth + "\t\trespond ok\n\t}\n}\n", ""},
		{"no auth", ":8080 {\n" + zone + "\trespond ok\n}\n", ""},
		{"Tollgate policies", ":8080 {\n\trate_limit {\n\t\ttenant {http.auth.user.id}\n\t\tpolicy api {\n\t\t\tlimit 5\n\t\t\twindow 1m\n\t\t}\n\t}\n" + auth + "\trespond ok\n}\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := adapt(t, tc.src)
			switch {
			case tc.warn == "" && strings.Contains(out, orderWarning):
				t.Fatalf("warned:\n%s", out)
			case tc.warn != "" && !strings.Contains(out, tc.warn):
				t.Fatalf("no warning with %q:\n%s", tc.warn, out)
			case tc.warn != "" && strings.Count(out, orderWarning) != 1:
				t.Fatalf("want one warning:\n%s", out)
			}
		})
	}
	t.Run("docs", func(t *testing.T) {
		for i, src := range docCaddyfileBlocks(t) {
			if strings.HasPrefix(strings.TrimSpace(src), "rate_limit") {
				src = ":8080 {\n" + src + "\n}\n"
			}
			if out := adapt(t, src); strings.Contains(out, orderWarning) {
				t.Errorf("doc example %d warns:\n%s\n%s", i+1, src, out)
			}
		}
	})
}
