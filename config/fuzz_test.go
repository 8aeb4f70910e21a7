package config

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// FuzzParseCaddyfile feeds arbitrary text inside a `rate_limit { ... }`
// block to UnmarshalCaddyfile. It must never panic; every error must name
// its file and line; and whatever the Caddyfile accepts must also pass the
// JSON validation, before and after a JSON round trip (what Caddy does with
// an adapted config).
func FuzzParseCaddyfile(f *testing.F) {
	seeds := []string{
		// valid
		"policy api {\n limit 100\n window 1m\n}",
		"zone static_example {\n match {\n  method GET\n }\n key static\n events 100\n window 1m\n}\ndistributed\nlog_key",
		"tenant {http.auth.user.id}\ntier {http.request.header.X-Plan}\ntenant_tier acme gold\npolicy p {\n algorithm token_bucket\n limit 10\n window 1s\n burst 20\n tier gold 100 1m burst 200 shadow\n tier vip unlimited\n override acme 5 10s\n}",
		"redis a:1 {\n address b:2\n sentinel m\n tls {\n  cert c\n  key k\n }\n timeout 50ms\n key_prefix rl\n}\npolicy p {\n limit 1\n window 1s\n}",
		"lease 10 1s\nfail local\nheaders ietf\njitter 0.2\ndenials_stream\nmetrics_tenants 3\npolicy c {\n algorithm concurrency\n limit 2\n}\npolicy l {\n algorithm sliding_log\n limit 5\n window 1m\n min_interval 1s\n}",
		"storage file_system /tmp/x\nsweep_interval 1m\ndisable_metrics\nzone z {\n events 1\n window 1d\n ipv4_prefix 24\n ipv6_prefix 64\n cost {http.request.header.X-Cost}\n}",
		// broken
		"policy p {\n burst 5\n limit 1\n window 1s\n}",
		"policy p {\n limit 1\n window 1s\n lease 3\n algorithm sliding_log\n}",
		"policy p {\n limit 99999999999999999999\n window 9999999999h\n}",
		"policy p {\n limit 1\n window 1s\n tier gold 5 burst\n}",
		"redis {\n tls insecure_skip_verify {\n  ca\n }\n}",
		"jitter NaN\njitter -Inf\npolicy",
		// braces and hostile bytes
		"}\n}\n{\n{",
		"policy p {\n match {\n  {\n }\n}\n}\n}",
		"policy \"\" {\n limit \"\"\n}\ntenant_tier \"\" \"\"",
		"policy p\x00 {\n limit 1\xff\n window \x1b[31m\n}",
		"policy " + strings.Repeat("a", 100) + " {\n limit 1\n window 1s\n}",
		"`policy` `p` {\n`limit` 1\n}\n<<EOF\nheredoc\nEOF",
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		input := "rate_limit {\n" + body + "\n}\n"
		// NewTestDispenser would log.Fatal on a lexer error; tokenize first.
		tokens, err := caddyfile.Tokenize([]byte(input), "Fuzzfile")
		if err != nil {
			return
		}
		var h Handler
		if err := h.UnmarshalCaddyfile(caddyfile.NewDispenser(tokens)); err != nil {
			if msg := err.Error(); !strings.Contains(msg, ", at Fuzzfile:") || strings.HasPrefix(msg, ":") {
				t.Errorf("error without a location or scope: %v\ninput:\n%q", err, input)
			}
			return
		}
		if _, err := h.Validate(); err != nil {
			t.Fatalf("Caddyfile accepted what Validate rejects: %v\ninput:\n%q", err, input)
		}
		raw, err := json.Marshal(&h)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		var back Handler
		if err := json.Unmarshal(raw, &back); err != nil {
			t.Fatalf("unmarshal %s: %v", raw, err)
		}
		if _, err := back.Validate(); err != nil {
			t.Fatalf("JSON round trip breaks validation: %v\n%s", err, raw)
		}
	})
}
