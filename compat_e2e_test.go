package tollgate

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// caddy-ratelimit's documented behaviours (README, handler.go's doc
// comments), ported black-box to the built binary.

// A zone counts with caddy-ratelimit's exact trailing window: `events` in
// any trailing `window`, Retry-After until the oldest event leaves it.
func TestCompatZoneCountsExactly(t *testing.T) {
	p := startCaddyConfig(t, "caddyfile", `
	{
		admin 127.0.0.1:{ADMIN}
	}
	http://127.0.0.1:{PORT} {
		rate_limit {
			zone z {
				key static
				events 10
				window 4s
			}
		}
		respond 200
	}`)
	start := time.Now()
	admitted := 0
	var first time.Time
	for time.Since(start) < 2*time.Second {
		r := p.request(http.MethodGet, "/")
		if r.status == 200 {
			if admitted == 0 {
				first = time.Now()
			}
			admitted++
			continue
		}
		ra, _ := strconv.Atoi(r.header.Get("Retry-After"))
		want := int((4*time.Second - time.Since(first) + time.Second - 1) / time.Second)
		if ra < want || ra > want+1 || ra > 4 {
			t.Fatalf("Retry-After %d, want %d: until the oldest event leaves the 4s window", ra, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if admitted != 10 {
		t.Errorf("%d requests admitted in 2s by a 10/4s zone, want 10", admitted)
	}
}

// A zone without `key` is one bucket for every client (caddy-ratelimit's
// "static" zone); a zone keyed on a header whose value is the literal
// "_anonymous" does not share the bucket of requests without the header.
func TestCompatZoneKeys(t *testing.T) {
	p := startCaddyConfig(t, "caddyfile", `
	{
		admin 127.0.0.1:{ADMIN}
		servers {
			trusted_proxies static 127.0.0.1/32
		}
	}
	http://127.0.0.1:{PORT} {
		route /shared {
			rate_limit {
				zone shared {
					events 2
					window 1h
				}
			}
		}
		route /header {
			rate_limit {
				zone by_header {
					key {http.request.header.X-Key}
					events 1
					window 1h
				}
			}
		}
		respond 200
	}`)
	p.expect(p.request(http.MethodGet, "/shared", "X-Forwarded-For", "192.0.2.1"), 200, 0, "client 1")
	p.expect(p.request(http.MethodGet, "/shared", "X-Forwarded-For", "192.0.2.2"), 200, 0, "client 2")
	p.expect(p.request(http.MethodGet, "/shared", "X-Forwarded-For", "192.0.2.3"), 429, -1, "client 3 (one bucket for all)")

	p.expect(p.request(http.MethodGet, "/header"), 200, 0, "no key")
	p.expect(p.request(http.MethodGet, "/header", "X-Key", "_anonymous"), 200, 0, "literal _anonymous")
	p.expect(p.request(http.MethodGet, "/header"), 429, -1, "no key again")
	p.expect(p.request(http.MethodGet, "/header", "X-Key", "_anonymous"), 429, -1, "literal _anonymous again")
}

// Several zones: caddy-ratelimit takes them from the most permissive to
// the least and charges each one that admits a request until one denies
// it; so zone a (5/10s, matching everything) is used up by requests zone
// b (3/1m, /b only) denies. (Checked against caddy-ratelimit itself.)
// Tollgate's `policy` blocks keep all or nothing.
func TestCompatSeveralZonesCharging(t *testing.T) {
	for _, tc := range []struct {
		block string
		lastA int
	}{{"zone", 429}, {"policy", 200}} {
		t.Run(tc.block, func(t *testing.T) {
			key := ""
			if tc.block == "policy" {
				key = "key static"
			}
			p := startCaddyConfig(t, "caddyfile", fmt.Sprintf(`
			{
				admin 127.0.0.1:{ADMIN}
			}
			http://127.0.0.1:{PORT} {
				rate_limit {
					%[1]s a {
						%[2]s
						algorithm sliding_log
						events 5
						window 10s
					}
					%[1]s b {
						match {
							path /b
						}
						%[2]s
						algorithm sliding_log
						events 3
						window 1m
					}
				}
				respond 200
			}`, tc.block, key))
			for i := range 3 {
				p.expect(p.request(http.MethodGet, "/b"), 200, 0, fmt.Sprintf("/b %d", i+1))
			}
			for i := range 2 {
				p.expect(p.request(http.MethodGet, "/b"), 429, -1, fmt.Sprintf("/b %d", i+4))
			}
			p.expect(p.request(http.MethodGet, "/a"), tc.lastA, -1, "/a after two denials by b")
		})
	}
}

// Signals of a denial: {http.rate_limit.exceeded.name} for handle_errors,
// the INFO line "rate limit exceeded" with zone, wait and remote_ip (the
// key only with log_key), and the rate_limit_exceeded event with
// caddy-ratelimit's fields. Without log_key the key is in no log line and
// no event, at any level.
func TestCompatDenialSignals(t *testing.T) {
	const secret = "sk-live-0123456789secret"
	for _, logKey := range []bool{false, true} {
		t.Run(fmt.Sprintf("log_key=%v", logKey), func(t *testing.T) {
			handler := map[string]any{
				"handler": "rate_limit",
				"rate_limits": map[string]any{
					"api:v1 keys": map[string]any{"key": "{http.request.header.X-Api-Key}", "window": "1m", "max_events": 1},
				},
				"log_key": logKey,
			}
			cfg := map[string]any{
				"admin":   map[string]any{"listen": "127.0.0.1:{ADMIN}"},
				"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "DEBUG"}}},
				"apps": map[string]any{
					"events": map[string]any{},
					"http": map[string]any{"servers": map[string]any{"s": map[string]any{
						"listen": []any{"127.0.0.1:{PORT}"},
						"routes": []any{map[string]any{"handle": []any{handler, map[string]any{"handler": "static_response", "body": "ok"}}}},
						"errors": map[string]any{"routes": []any{map[string]any{"handle": []any{map[string]any{
							"handler": "static_response", "status_code": "{http.error.status_code}",
							"body": "zone={http.rate_limit.exceeded.name}",
						}}}}},
					}}},
				},
			}
			b, _ := json.Marshal(cfg)
			p := startCaddyConfig(t, "json", string(b))
			p.expect(p.request(http.MethodGet, "/", "X-Api-Key", secret), 200, 0, "first")
			r := p.request(http.MethodGet, "/", "X-Api-Key", secret)
			p.expect(r, 429, -1, "second")
			if r.body != "zone=api:v1 keys" {
				t.Errorf("handle_errors body %q, want the zone name in {http.rate_limit.exceeded.name}", r.body)
			}
			line := p.waitLogLines("rate limit exceeded", 1)[0]
			if line["level"] != "info" || line["logger"] != "http.handlers.rate_limit" {
				t.Errorf("log line level %v logger %v, want info from http.handlers.rate_limit", line["level"], line["logger"])
			}
			if line["zone"] != "api:v1 keys" || line["remote_ip"] != "127.0.0.1" || line["wait"] == nil {
				t.Errorf("log line %v: want zone, wait, remote_ip", line)
			}
			if key, ok := line["key"]; ok != logKey || (logKey && key != secret) {
				t.Errorf("log line key = %v (present %v), want present %v", key, ok, logKey)
			}
			var data map[string]any
			waitFor(t, func() bool {
				for _, e := range p.logLines("event") {
					if e["name"] == "rate_limit_exceeded" {
						data, _ = e["data"].(map[string]any)
					}
				}
				return data != nil
			})
			if data["zone"] != "api:v1 keys" || data["remote_ip"] != "127.0.0.1" || data["wait"] == nil {
				t.Errorf("event data %v: want zone, wait, remote_ip", data)
			}
			if k, ok := data["key"]; ok != logKey || (logKey && k != secret) {
				t.Errorf("event key = %v (present %v), want present %v", k, ok, logKey)
			}
			// No line of the module (any level) and no event holds the key
			// without log_key. (Caddy's own http.log.error line, at DEBUG,
			// prints request headers, as it does with caddy-ratelimit.)
			time.Sleep(100 * time.Millisecond) // let every line reach the buffer
			n := 0
			for _, l := range strings.Split(p.logs.String(), "\n") {
				if strings.Contains(l, `"logger":"http.handlers.rate_limit"`) || strings.Contains(l, `"logger":"events"`) {
					n += strings.Count(l, secret)
				}
			}
			if logKey != (n > 0) {
				t.Errorf("the key appears %d times in the module's log lines and events with log_key=%v", n, logKey)
			}
		})
	}
}

// Everything caddy-ratelimit accepts starts: a rate_limit without zones,
// zone names with ':', '/', spaces or longer than 64 characters, jitter
// above 100, a JSON handler without rate_limits. Odd names count in their
// own buckets and show as written.
func TestCompatConfigAcceptance(t *testing.T) {
	long := strings.Repeat("z", 70)
	p := startCaddyConfig(t, "caddyfile", `
	{
		admin 127.0.0.1:{ADMIN}
	}
	http://127.0.0.1:{PORT} {
		route /none {
			rate_limit {
			}
			respond 200
		}
		route /named/* {
			rate_limit {
				jitter 150
				zone api:v1 {
					match {
						path /named/colon
					}
					key static
					events 1
					window 1m
				}
				zone a/b {
					match {
						path /named/slash
					}
					key static
					events 1
					window 1m
				}
				zone "with spaces" {
					match {
						path /named/space
					}
					key static
					events 1
					window 1m
				}
				zone `+long+` {
					match {
						path /named/long
					}
					key static
					events 1
					window 1m
				}
			}
			respond 200
		}
		handle_errors {
			respond "{http.rate_limit.exceeded.name}" 429
		}
	}`)
	for range 3 {
		p.expect(p.request(http.MethodGet, "/none"), 200, 0, "rate_limit without zones")
	}
	for path, name := range map[string]string{"colon": "api:v1", "slash": "a/b", "space": "with spaces", "long": long} {
		p.expect(p.request(http.MethodGet, "/named/"+path), 200, 0, name)
		r := p.request(http.MethodGet, "/named/"+path)
		p.expect(r, 429, -1, name+" again")
		if r.body != name {
			t.Errorf("zone %q: exceeded.name %q", name, r.body)
		}
		if ra, _ := strconv.Atoi(r.header.Get("Retry-After")); ra < 59 || ra > 60*151 {
			t.Errorf("zone %q: Retry-After %d, want about 60 plus up to 150 x that of jitter", name, ra)
		}
		if pol := r.header.Get("RateLimit-Policy"); !strings.HasPrefix(pol, `"`+name+`";`) {
			t.Errorf("zone %q: RateLimit-Policy %q", name, pol)
		}
	}
	// A JSON handler without rate_limits.
	j := startCaddyConfig(t, "json", `{"admin":{"listen":"127.0.0.1:{ADMIN}"},"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:{PORT}"],
		"routes":[{"handle":[{"handler":"rate_limit","jitter":0.5},{"handler":"static_response","body":"ok"}]}]}}}}}`)
	j.expect(j.request(http.MethodGet, "/"), 200, 0, "JSON handler without rate_limits")
}

// `caddy adapt` writes distributed durations as caddy-ratelimit's adapter
// does (nanoseconds), and a bare `distributed` as {}.
func TestCompatAdaptDistributed(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "Caddyfile")
	for src, want := range map[string]string{
		"distributed {\n\t\tread_interval 5s\n\t\twrite_interval 10s\n\t\tpurge_age 1m\n\t}": `"distributed":{"purge_age":60000000000,"read_interval":5000000000,"write_interval":10000000000}`,
		"distributed": `"distributed":{}`,
	} {
		caddyfile := ":8080\n\nrate_limit {\n\t" + src + "\n\tzone z {\n\t\tevents 1\n\t\twindow 1s\n\t}\n}\n"
		if err := os.WriteFile(file, []byte(caddyfile), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := execCaddy(t, "adapt", "--config", file, "--adapter", "caddyfile")
		if err != nil {
			t.Fatalf("caddy adapt: %v\n%s", err, out)
		}
		if !strings.Contains(out, want) {
			t.Errorf("adapted:\n%s\nwant it to contain %s", out, want)
		}
	}
}
