package tollgate

import (
	"bytes"
	"encoding/gob"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// caddy-ratelimit's own tests, ported black-box: its configs (limits,
// windows, request counts) run unchanged on the built binary, and the
// assertions are made on what a client, a log reader, a Prometheus or the
// storage sees. Its tests drive a fake clock; these wait for real, in
// parallel. The name of each test says which of its tests it ports.

// peerRateLimitsJSON is caddy-ratelimit's TestRateLimits config.
const peerRateLimitsJSON = `{
	"admin": {"listen": "localhost:2999"},
	"apps": {
		"http": {
			"servers": {
				"demo": {
					"listen": [":8080"],
					"routes": [{
						"handle": [
							{
								"handler": "rate_limit",
								"rate_limits": {
									"zone1": {
										"match": [{"method": ["GET"]}],
										"key": "static",
										"window": "60s",
										"max_events": 10
									}
								}
							},
							{
								"handler": "static_response",
								"status_code": 200
							}
						]
					}]
				}
			}
		}
	}
}`

// slidingWindowSequence is TestRateLimits' sequence: 10 admitted, then
// 429 with Retry-After 60, 30 after half the window, 200 once the window
// has passed. post also checks that a request the zone does not match
// passes (TestCaddyfileRateLimits).
func slidingWindowSequence(t *testing.T, p *caddyProcess, post bool) {
	const window, maxEvents = 60, 10
	var start time.Time
	for i := range maxEvents {
		p.expect(p.request(http.MethodGet, "/"), 200, 0, fmt.Sprintf("GET %d", i+1))
		if i == 0 {
			// After the first answer, so the oldest logged event is
			// before start: half a window from start, Retry-After is 30
			// however long that first request took (taken before it, a
			// slow first request made it 31).
			start = time.Now()
		}
	}
	p.expect(p.request(http.MethodGet, "/"), 429, window, "GET past the limit")
	if post {
		p.expect(p.request(http.MethodPost, "/"), 200, 0, "POST (not matched)")
	}
	sleepUntil(start.Add(window / 2 * time.Second))
	p.expect(p.request(http.MethodGet, "/"), 429, window/2, "GET after half the window")
	sleepUntil(start.Add(window*time.Second + 200*time.Millisecond))
	p.expect(p.request(http.MethodGet, "/"), 200, 0, "GET after the window")
}

// Ports caddy-ratelimit's TestRateLimits (JSON config).
func TestPeerRateLimits(t *testing.T) {
	caddyBinary(t)
	t.Parallel()
	p := startCaddyConfig(t, "json", peerJSON(peerRateLimitsJSON))
	slidingWindowSequence(t, p, false)
}

// Ports caddy-ratelimit's TestCaddyfileRateLimits (Caddyfile config).
func TestPeerCaddyfileRateLimits(t *testing.T) {
	caddyBinary(t)
	t.Parallel()
	p := startCaddyConfig(t, "caddyfile", `
	{
		skip_install_trust
		admin 127.0.0.1:{ADMIN}
		http_port {PORT}
	}

	http://127.0.0.1:{PORT}

	rate_limit {
		zone zone1 {
			match {
				method GET
			}
			key static
			window 60s
			events 10
		}
	}

	respond 200
	`)
	slidingWindowSequence(t, p, true)
}

// Ports caddy-ratelimit's TestDistinctZonesAndKeys.
func TestPeerDistinctZonesAndKeys(t *testing.T) {
	p := startCaddyConfig(t, "json", peerJSON(`{
	"admin": {"listen": "localhost:2999"},
	"apps": {
		"http": {
			"servers": {
				"demo": {
					"listen": [":8080"],
					"routes": [{
						"handle": [
							{
								"handler": "rate_limit",
								"rate_limits": {
									"zone1": {
										"match": [{"method": ["GET"]}],
										"key": "{http.request.orig_uri.path}",
										"window": "60s",
										"max_events": 10
									},
									"zone2": {
										"match": [{"method": ["DELETE"]}],
										"key": "{http.request.orig_uri.path}",
										"window": "60s",
										"max_events": 10
									}
								}
							},
							{
								"handler": "static_response",
								"status_code": 200
							}
						]
					}]
				}
			}
		}
	}
}`))
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		for _, path := range []string{"/path1", "/path2"} {
			for i := range 10 {
				p.expect(p.request(method, path), 200, 0, fmt.Sprintf("%s %s %d", method, path, i+1))
			}
			p.expect(p.request(method, path), 429, -1, method+" "+path+" past the limit")
		}
	}
}

// Ports caddy-ratelimit's TestCount (its ring buffer's count of events in
// a sliding window), through requests: 10 events spaced 1 s apart fill a
// 10 s window; the next is 1 s away; half a window later exactly the 5
// oldest have left it.
func TestPeerCount(t *testing.T) {
	caddyBinary(t)
	t.Parallel()
	p := startCaddyConfig(t, "caddyfile", `
	{
		admin 127.0.0.1:{ADMIN}
	}
	http://127.0.0.1:{PORT} {
		rate_limit {
			zone count {
				key static
				events 10
				window 10s
			}
		}
		respond 200
	}`)
	// Time 0 is when the first event's answer arrived: the event itself
	// was counted a little earlier, as with the fake clock's events.
	p.expect(p.request(http.MethodGet, "/"), 200, 0, "event at 0s")
	start := time.Now()
	for i := 1; i < 10; i++ {
		sleepUntil(start.Add(time.Duration(i) * time.Second))
		p.expect(p.request(http.MethodGet, "/"), 200, 0, fmt.Sprintf("event at %ds", i))
	}
	p.expect(p.request(http.MethodGet, "/"), 429, 1, "full ring")
	// Half a window on (caddy-ratelimit's fake clock jumps to exactly 15s
	// and counts the event at 5s as inside; here a little before 15s, the
	// same events are inside): the 5 oldest have left.
	sleepUntil(start.Add(14500 * time.Millisecond))
	for i := range 5 {
		p.expect(p.request(http.MethodGet, "/"), 200, 0, fmt.Sprintf("at 15s, event %d of the 5 that left", i+1))
	}
	p.expect(p.request(http.MethodGet, "/"), 429, -1, "at 15s, the 6th")
}

// Ports caddy-ratelimit's TestApplyNetworkPrefix: each row's key (from a
// header here) goes through the row's ipv4_prefix/ipv6_prefix; the key a
// denial logs with log_key is the row's expected key.
func TestPeerApplyNetworkPrefix(t *testing.T) {
	rows := []struct {
		name       string
		key        string
		ipv4, ipv6 int
		want       string
	}{
		{"ipv6 /64 full addr", "2001:db8:1234:5678:9abc:def0:1234:5678", 0, 64, "2001:db8:1234:5678::/64"},
		{"ipv6 /64 all ones host", "2001:db8:1234:5678:ffff:ffff:ffff:ffff", 0, 64, "2001:db8:1234:5678::/64"},
		{"ipv6 /64 short addr", "2001:db8:1234:5678::1", 0, 64, "2001:db8:1234:5678::/64"},
		{"ipv6 /48", "2001:db8:1234:5678::1", 0, 48, "2001:db8:1234::/48"},
		{"ipv6 /128", "2001:db8:1234:5678::1", 0, 128, "2001:db8:1234:5678::1/128"},
		{"ipv4 /24", "192.168.1.100", 24, 0, "192.168.1.0/24"},
		{"ipv4 /8", "10.0.0.50", 8, 0, "10.0.0.0/8"},
		{"ipv4 /32", "172.16.5.4", 32, 0, "172.16.5.4/32"},
		{"ipv6 with both configured", "2001:db8::1", 24, 64, "2001:db8::/64"},
		{"ipv4 with both configured", "192.168.1.100", 24, 64, "192.168.1.0/24"},
		{"ipv4 unchanged when only ipv6 configured", "192.168.1.100", 0, 64, "192.168.1.100"},
		{"ipv6 unchanged when only ipv4 configured", "2001:db8::1", 24, 0, "2001:db8::1"},
		{"ipv6 no prefix", "2001:db8::1", 0, 0, "2001:db8::1"},
		{"ipv4 no prefix", "192.168.1.100", 0, 0, "192.168.1.100"},
		{"static key", "static", 0, 64, "static"},
		{"placeholder key", "{http.request.uri}", 0, 64, "{http.request.uri}"},
		{"empty key", "", 0, 64, ""},
	}
	var zones strings.Builder
	for i, r := range rows {
		fmt.Fprintf(&zones, `
			zone row%d {
				match {
					path /row%d
				}
				key {http.request.header.X-Key}
				events 1
				window 1m
				ipv4_prefix %d
				ipv6_prefix %d
			}`, i, i, r.ipv4, r.ipv6)
	}
	p := startCaddyConfig(t, "caddyfile", `
	{
		admin 127.0.0.1:{ADMIN}
	}
	http://127.0.0.1:{PORT} {
		rate_limit {
			log_key`+zones.String()+`
		}
		respond 200
	}`)
	for i, r := range rows {
		path := fmt.Sprintf("/row%d", i)
		p.expect(p.request(http.MethodGet, path, "X-Key", r.key), 200, 0, r.name)
		p.expect(p.request(http.MethodGet, path, "X-Key", r.key), 429, -1, r.name+", again")
	}
	lines := p.waitLogLines("rate limit exceeded", len(rows))
	for i, r := range rows {
		found := false
		for _, l := range lines {
			if l["zone"] == fmt.Sprintf("row%d", i) {
				found = true
				if l["key"] != r.want {
					t.Errorf("%s: key %q, want %q", r.name, l["key"], r.want)
				}
			}
		}
		if !found {
			t.Errorf("%s: no denial logged for zone row%d", r.name, i)
		}
	}
}

// peerDistributedJSON is caddy-ratelimit's TestDistributed config: a zone
// of 10 events per 60 s shared through file_system storage at {STORAGE},
// synced every hour (only the read at start counts).
const peerDistributedJSON = `{
	"admin": {"listen": "localhost:2999"},
	"storage": {
		"module": "file_system",
		"root": "{STORAGE}"
	},
	"logging": {
		"logs": {
			"default": {
				"level": "DEBUG"
			}
		}
	},
	"apps": {
		"http": {
			"servers": {
				"one": {
					"listen": [":8080"],
					"routes": [{
						"handle": [
							{
								"handler": "rate_limit",
								"rate_limits": {
									"{ZONE}": {
										"match": [{"method": ["GET"]}],
										"key": "static",
										"window": "60s",
										"max_events": 10
									}
								},
								"distributed": {
									"write_interval": "3600s",
									"read_interval": "3600s",
									"purge_age": "7200s"
								}
							},
							{
								"handler": "static_response",
								"status_code": 200
							}
						]
					}]
				}
			}
		}
	}
}`

// Ports caddy-ratelimit's TestDistributed: a peer's state file (written
// as caddy-ratelimit writes it) and local requests add up.
func TestPeerDistributed(t *testing.T) {
	const window, maxEvents = 60, 10
	cases := []struct {
		name          string
		peerRequests  int
		peerStateAge  time.Duration
		localRequests int
		rateLimited   bool
	}{
		{"peer-usage-in-window", maxEvents, 0, 0, true},
		// As caddy-ratelimit's own case: no peer requests, a state
		// (window+1) nanoseconds old.
		{"peer-usage-before-window", 0, time.Duration(window + 1), 0, false},
		// What that case means to test: a full peer state older than the
		// window is not counted.
		{"peer-usage-before-window-full", maxEvents, (window + 1) * time.Second, 0, false},
		{"local-usage", 0, 0, maxEvents, true},
		{"both-usage", maxEvents / 2, 0, maxEvents / 2, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			storage := t.TempDir()
			zone := fmt.Sprintf("zone-%s-%d", tc.name, time.Now().UnixNano())
			now := time.Now()
			st := peerState{Timestamp: now.Add(-tc.peerStateAge), Zones: map[string]map[string]peerStateValue{zone: {}}}
			if tc.peerRequests > 0 {
				st.Zones[zone]["static"] = peerStateValue{Count: tc.peerRequests, OldestEvent: now.Add(-tc.peerStateAge)}
			} else {
				st.Zones[zone]["static"] = peerStateValue{}
			}
			writePeerState(t, storage, "f92a00f1-050c-4353-83b1-8ccc2337c25b", st)
			p := startCaddyConfig(t, "json", strings.NewReplacer("{STORAGE}", storage, "{ZONE}", zone).Replace(peerJSON(peerDistributedJSON)))
			for i := range tc.localRequests {
				p.expect(p.request(http.MethodGet, "/"), 200, 0, fmt.Sprintf("local request %d", i+1))
			}
			if tc.rateLimited {
				p.expect(p.request(http.MethodGet, "/"), 429, window, "request over the shared limit")
			} else {
				p.expect(p.request(http.MethodGet, "/"), 200, 0, "request")
			}
		})
	}
}

// Ports caddy-ratelimit's TestPurgeDistributedState: with purge_age 1h, a
// state file written now is read and kept, and one older than an hour is
// deleted when the states are read.
func TestPeerPurgeDistributedState(t *testing.T) {
	storage := t.TempDir()
	fresh := writePeerState(t, storage, "12345678-1234-1234-1234-123456789abc", peerState{
		Timestamp: time.Now(), Zones: map[string]map[string]peerStateValue{"purge": {"static": {Count: 10, OldestEvent: time.Now()}}},
	})
	stale := writePeerState(t, storage, "99999999-9999-9999-9999-999999999998", peerState{
		Timestamp: time.Now().Add(-2 * time.Hour), Zones: map[string]map[string]peerStateValue{},
	})
	p := startCaddyConfig(t, "caddyfile", `
	{
		admin 127.0.0.1:{ADMIN}
		storage file_system `+storage+`
	}
	http://127.0.0.1:{PORT} {
		rate_limit {
			distributed {
				read_interval 1h
				write_interval 1h
				purge_age 1h
			}
			zone purge {
				key static
				events 10
				window 1m
			}
		}
		respond 200
	}`)
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale state file still there after the first read (%v)", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("fresh state file: %v", err)
	}
	// The fresh state was read: its 10 events fill the zone.
	p.expect(p.request(http.MethodGet, "/"), 429, -1, "request over the peer's usage")
}

// Two instances on one storage (caddy-ratelimit's README: "they will act
// approximately as one instance"): what one admitted is counted by the
// other once written and read.
func TestPeerDistributedTwoInstances(t *testing.T) {
	storage := t.TempDir()
	config := `
	{
		admin 127.0.0.1:{ADMIN}
		storage file_system ` + storage + `
	}
	http://127.0.0.1:{PORT} {
		rate_limit {
			distributed {
				read_interval 100ms
				write_interval 100ms
			}
			zone shared {
				key static
				events 10
				window 1m
			}
		}
		respond 200
	}`
	a := startCaddyConfig(t, "caddyfile", config)
	b := startCaddyConfig(t, "caddyfile", config)
	for i := range 6 {
		a.expect(a.request(http.MethodGet, "/"), 200, 0, fmt.Sprintf("A %d", i+1))
	}
	time.Sleep(time.Second) // A writes, B reads
	for i := range 4 {
		b.expect(b.request(http.MethodGet, "/"), 200, 0, fmt.Sprintf("B %d", i+1))
	}
	// Retry-After: until A's first event, a second or so older than B's,
	// leaves the window.
	for _, r := range []struct {
		p    *caddyProcess
		name string
	}{{b, "B"}, {a, "A"}} {
		res := r.p.request(http.MethodGet, "/")
		r.p.expect(res, 429, -1, r.name+" past the shared limit")
		if ra := res.header.Get("Retry-After"); ra != "58" && ra != "59" && ra != "60" {
			t.Errorf("%s: Retry-After %s, want 58-60", r.name, ra)
		}
		time.Sleep(time.Second)
	}
	// Both files are caddy-ratelimit's format.
	states := readPeerStates(t, storage)
	if len(states) != 2 {
		t.Fatalf("%d state files, want 2", len(states))
	}
	total := 0
	for _, st := range states {
		total += st.Zones["shared"]["static"].Count
	}
	if total != 10 {
		t.Errorf("state files count %d events, want 10", total)
	}
}

// Ports caddy-ratelimit's TestMetrics: the config metric, declined
// requests and process time by zone. caddy_rate_limit_requests_total
// keeps Tollgate's labels (policy, decision): caddy-ratelimit's had the
// raw key as a label; the docs rebuild its series with recording rules.
func TestPeerMetrics(t *testing.T) {
	p := startCaddyConfig(t, "json", peerJSON(`{
	"admin": {"listen": "localhost:2999"},
	"apps": {
		"http": {
			"servers": {
				"demo": {
					"listen": [":8080"],
					"metrics": {},
					"routes": [{
						"handle": [
							{
								"handler": "rate_limit",
								"rate_limits": {
									"test_zone": {
										"match": [{"method": ["GET"]}],
										"key": "static",
										"window": "10s",
										"max_events": 2
									}
								}
							},
							{
								"handler": "static_response",
								"status_code": 200
							}
						]
					}]
				}
			}
		}
	}
}`))
	fams := p.metrics()
	if v, ok := metricValue(fams, "caddy_rate_limit_config", map[string]string{
		"zone": "test_zone", "max_events": "2", "window": "10s", "ipv4_prefix": "0", "ipv6_prefix": "0",
	}); !ok || v == 0 {
		t.Errorf("config metric: %v %v, want recorded", v, ok)
	}
	for i := range 2 {
		p.expect(p.request(http.MethodGet, "/"), 200, 0, fmt.Sprintf("GET %d", i+1))
	}
	p.expect(p.request(http.MethodGet, "/"), 429, -1, "GET 3")
	fams = p.metrics()
	want := []struct {
		name   string
		labels map[string]string
		value  float64
	}{
		{"caddy_rate_limit_declined_requests_total", map[string]string{"zone": "test_zone"}, 1},
		{"caddy_rate_limit_process_time_seconds", map[string]string{"zone": "test_zone"}, 3},
		{"caddy_rate_limit_keys_total", map[string]string{"zone": "test_zone"}, 1},
		{"caddy_rate_limit_requests_total", map[string]string{"policy": "test_zone", "decision": "allowed"}, 2},
		{"caddy_rate_limit_requests_total", map[string]string{"policy": "test_zone", "decision": "denied"}, 1},
	}
	for _, w := range want {
		if v, ok := metricValue(fams, w.name, w.labels); !ok || v != w.value {
			t.Errorf("%s%v = %v (present %v), want %v", w.name, w.labels, v, ok, w.value)
		}
	}
}

// Ports caddy-ratelimit's TestMetricsReRegisterOnReload: after a reload
// the families are still exported, once, and keep counting.
func TestPeerMetricsReRegisterOnReload(t *testing.T) {
	config := `
	{
		admin 127.0.0.1:{ADMIN}
	}
	http://127.0.0.1:{PORT} {
		rate_limit {
			zone zoneA {
				key k1
				events 1
				window 1h
			}
		}
		respond 200
	}`
	p := startCaddyConfig(t, "caddyfile", config)
	p.expect(p.request(http.MethodGet, "/"), 200, 0, "first")
	p.expect(p.request(http.MethodGet, "/"), 429, -1, "second")
	// Reload (a changed body, so Caddy applies it).
	file := filepath.Join(p.dir, "config.caddyfile")
	src, _ := os.ReadFile(file)
	if err := os.WriteFile(file, []byte(strings.Replace(string(src), "respond 200", "respond 200 {\n\t\t\tbody reloaded\n\t\t}", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := execCaddy(t, "reload", "--config", file, "--adapter", "caddyfile", "--address", fmt.Sprintf("127.0.0.1:%d", p.admin))
	if err != nil {
		t.Fatalf("caddy reload: %v\n%s", err, out)
	}
	p.expect(p.request(http.MethodGet, "/"), 429, -1, "after the reload")
	fams := p.metrics()
	if v, _ := metricValue(fams, "caddy_rate_limit_declined_requests_total", map[string]string{"zone": "zoneA"}); v != 2 {
		t.Errorf("declined after reload = %v, want 2 (kept across the reload)", v)
	}
	if n := len(fams["caddy_rate_limit_declined_requests_total"].GetMetric()); n != 1 {
		t.Errorf("%d declined series, want 1", n)
	}
}

// peerJSON turns one of caddy-ratelimit's test configs (admin on
// localhost:2999, listening on :8080) into one for a test process.
func peerJSON(config string) string {
	return strings.NewReplacer(`"localhost:2999"`, `"127.0.0.1:{ADMIN}"`, `":8080"`, `"127.0.0.1:{PORT}"`).Replace(config)
}

// peerState and peerStateValue are caddy-ratelimit's state file as its
// distributed.go writes it (gob, fields by name); the tests write them as
// a caddy-ratelimit peer would.
type peerState struct {
	Timestamp time.Time
	Zones     map[string]map[string]peerStateValue
}

type peerStateValue struct {
	Count       int
	OldestEvent time.Time
}

// writePeerState writes the state file of instance id into the
// file_system storage at root, as caddy-ratelimit's writeRateLimitState.
func writePeerState(t *testing.T, root, id string, st peerState) string {
	t.Helper()
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(st); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(root, "rate_limit", "instances", id+".rlstate")
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// readPeerStates decodes every state file in the storage at root.
func readPeerStates(t *testing.T, root string) map[string]peerState {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(root, "rate_limit", "instances", "*.rlstate"))
	out := map[string]peerState{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var st peerState
		if err := gob.NewDecoder(bytes.NewReader(b)).Decode(&st); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[filepath.Base(f)] = st
	}
	return out
}
