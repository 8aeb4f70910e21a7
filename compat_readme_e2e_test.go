package tollgate

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// readmeExample reads one of caddy-ratelimit's README examples, kept byte
// for byte in testdata/caddy-ratelimit-readme.
func readmeExample(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "caddy-ratelimit-readme", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCaddyRatelimitReadmeExamples runs caddy-ratelimit's README examples
// verbatim on the built binary (the listener moved to a free port, and
// fragments put in a minimal config) and checks what the README says they
// do.
func TestCaddyRatelimitReadmeExamples(t *testing.T) {
	caddyBinary(t)

	// "Only 100 GET requests will be allowed through every minute, across
	// all clients [static_example]. We allow only 2 requests per client
	// IP in the last 5 seconds [dynamic_example]. We also enable
	// distributed rate limiting [...] Caddy's global storage config will
	// be used."
	checkExample := func(t *testing.T, p *caddyProcess) {
		start := time.Now()
		for i := range 2 {
			r := p.request(http.MethodGet, "/")
			p.expect(r, 200, 0, fmt.Sprintf("GET %d", i+1))
			if r.body != "I'm behind the rate limiter!" {
				t.Errorf("body %q", r.body)
			}
		}
		end := time.Now()
		p.expect(p.request(http.MethodGet, "/"), 429, 5, "GET 3: dynamic_example, 2 per 5s per client")
		line := p.waitLogLines("rate limit exceeded", 1)[0]
		if line["zone"] != "dynamic_example" || line["key"] != "127.0.0.1" {
			t.Errorf("denial log %v: want zone dynamic_example and (log_key) key 127.0.0.1", line)
		}
		// The global storage is the default file system one, under the
		// process's XDG_DATA_HOME; the state is written every 5s.
		var states map[string]peerState
		waitForWithin(t, 15*time.Second, func() bool {
			states = readPeerStates(t, filepath.Join(p.dir, "caddy"))
			return len(states) == 1
		})
		for _, st := range states {
			// A state written 5s or more after the requests (a loaded
			// machine) no longer holds them in the 5s window: 0 is then
			// the right count. The requests were decided between start
			// and end, so from 5s after start to 5s after end, some may
			// have left it.
			n, want := st.Zones["dynamic_example"]["127.0.0.1"].Count, 2
			switch {
			case st.Timestamp.Sub(end) >= 5*time.Second:
				want = 0
			case st.Timestamp.Sub(start) >= 5*time.Second:
				want = n
			}
			if n != want {
				t.Errorf("distributed state at +%s counts %d events of 127.0.0.1 in dynamic_example, want %d", st.Timestamp.Sub(start), n, want)
			}
			if n := st.Zones["static_example"]["static"].Count; n != 3 {
				t.Errorf("distributed state counts %d events in static_example, want 3 (charged before dynamic_example denied)", n)
			}
		}
	}
	t.Run("JSON example", func(t *testing.T) {
		t.Parallel()
		cfg := strings.Replace(readmeExample(t, "example.json"), `":80"`, `"127.0.0.1:{PORT}"`, 1)
		checkExample(t, startCaddyConfig(t, "json", cfg))
	})
	t.Run("Caddyfile example", func(t *testing.T) {
		t.Parallel()
		cfg := strings.Replace(readmeExample(t, "example.Caddyfile"), ":80\n", "http://127.0.0.1:{PORT}\n", 1)
		checkExample(t, startCaddyConfig(t, "caddyfile", cfg))
	})

	// "all IPv6 clients within the same /64 network share one rate limit
	// bucket, while each IPv4 client is rate limited individually": 100
	// per minute for 127.0.0.1.
	checkPrefix := func(t *testing.T, p *caddyProcess) {
		for i := range 100 {
			p.expect(p.request(http.MethodGet, "/"), 200, 0, fmt.Sprintf("request %d", i+1))
		}
		p.expect(p.request(http.MethodGet, "/"), 429, 60, "request 101")
	}
	t.Run("network prefix JSON", func(t *testing.T) {
		t.Parallel()
		handler := readmeExample(t, "network-prefix.json")
		checkPrefix(t, startCaddyConfig(t, "json", `{"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:{PORT}"],
			"routes":[{"handle":[`+handler+`,{"handler":"static_response","body":"ok"}]}]}}}}}`))
	})
	t.Run("network prefix Caddyfile", func(t *testing.T) {
		t.Parallel()
		directive := readmeExample(t, "network-prefix.Caddyfile")
		checkPrefix(t, startCaddyConfig(t, "caddyfile", "http://127.0.0.1:{PORT} {\n"+directive+"\nrespond 200\n}\n"))
	})

	// "order rate_limit after basic_auth": unauthenticated requests are
	// answered by basic_auth and never counted.
	t.Run("order after basic_auth", func(t *testing.T) {
		t.Parallel()
		hash, err := bcrypt.GenerateFromPassword([]byte("hunter2"), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		p := startCaddyConfig(t, "caddyfile", readmeExample(t, "order.Caddyfile")+`
http://127.0.0.1:{PORT} {
	basic_auth {
		alice `+string(hash)+`
	}
	rate_limit {
		zone login {
			key static
			events 1
			window 1m
		}
	}
	respond 200
}
`)
		for i := range 3 {
			p.expect(p.request(http.MethodGet, "/"), 401, 0, fmt.Sprintf("anonymous %d", i+1))
		}
		auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:hunter2"))
		p.expect(p.request(http.MethodGet, "/", "Authorization", auth), 200, 0, "alice 1")
		p.expect(p.request(http.MethodGet, "/", "Authorization", auth), 429, -1, "alice 2")
	})
}

// waitForWithin polls cond until it holds or d passed.
func waitForWithin(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
