package config

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

// parseTest runs input through UnmarshalCaddyfile.
func parseTest(input string) (*Handler, error) {
	h := new(Handler)
	err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
	return h, err
}

// onePolicy is the smallest policy; handler-level tests append it.
const onePolicy = "\tpolicy p {\n\t\tlimit 1\n\t\twindow 1s\n\t}\n"

// withPolicy wraps handler-level lines (starting on line 2) in a rate_limit
// block that also defines policy p.
func withPolicy(lines string) string {
	return "rate_limit {\n" + lines + "\n" + onePolicy + "}\n"
}

// baseHandler is what withPolicy("") parses to, changed by mod.
func baseHandler(mod func(h *Handler)) *Handler {
	h := &Handler{RateLimits: map[string]*PolicyConfig{
		"p": {MaxEvents: 1, Window: caddy.Duration(time.Second)},
	}}
	if mod != nil {
		mod(h)
	}
	return asPolicyBlocks(h, "p")
}

// policyOnly is the handler holding only policy p = pc, read from a
// `policy` block.
func policyOnly(pc *PolicyConfig) *Handler {
	return asPolicyBlocks(&Handler{RateLimits: map[string]*PolicyConfig{"p": pc}}, "p")
}

// asPolicyBlocks adds to the named policies of h what a `policy` block
// writes that a `zone` block does not: sliding_window unless an algorithm
// is set, the client IP as key unless a key or a handler tenant is set,
// and all-or-nothing charging.
func asPolicyBlocks(h *Handler, names ...string) *Handler {
	for _, n := range names {
		pc := h.RateLimits[n]
		if pc.Algorithm == "" {
			pc.Algorithm = "sliding_window"
		}
		if pc.Key == "" && h.Tenant == "" {
			pc.Key = "{http.vars.client_ip}"
		}
		pc.AllOrNothing = true
	}
	return h
}

func dur(s string) caddy.Duration {
	d, err := caddy.ParseDuration(s)
	if err != nil {
		panic(err)
	}
	return caddy.Duration(d)
}

func TestCaddyfileHandlerDirectives(t *testing.T) {
	tests := []struct {
		name  string
		input string
		want  *Handler
	}{
		{"minimal", withPolicy(""), baseHandler(nil)},
		{"redis inline address", withPolicy("redis localhost:6379"), baseHandler(func(h *Handler) {
			h.Redis = &RedisConfig{Addresses: []string{"localhost:6379"}}
		})},
		{"redis block", withPolicy(`redis {
		address a:1 b:2
		address [::1]:6380
		username u
		password {env.REDIS_PASSWORD}
		db 3
		pool_size 20
		timeout 250ms
		key_prefix rl.test
		breaker_failures 4
		breaker_cooldown 2s
	}`), baseHandler(func(h *Handler) {
			h.Redis = &RedisConfig{
				Addresses: []string{"a:1", "b:2", "[::1]:6380"}, Username: "u", Password: "{env.REDIS_PASSWORD}",
				DB: 3, PoolSize: 20, Timeout: dur("250ms"), KeyPrefix: "rl.test", BreakerFailures: 4, BreakerCooldown: dur("2s"),
			}
		})},
		{"redis inline plus block", withPolicy("redis a:1 {\n address b:2\n cluster\n}"), baseHandler(func(h *Handler) {
			h.Redis = &RedisConfig{Addresses: []string{"a:1", "b:2"}, Cluster: true}
		})},
		{"redis sentinel", withPolicy("redis {\n address s1:26379 s2:26379\n sentinel mymaster\n db 1\n}"), baseHandler(func(h *Handler) {
			h.Redis = &RedisConfig{Addresses: []string{"s1:26379", "s2:26379"}, SentinelMaster: "mymaster", DB: 1}
		})},
		{"redis functions off", withPolicy("redis {\n address a:1\n functions off\n}"), baseHandler(func(h *Handler) {
			off := false
			h.Redis = &RedisConfig{Addresses: []string{"a:1"}, Functions: &off}
		})},
		{"redis functions bare", withPolicy("redis {\n address a:1\n functions\n}"), baseHandler(func(h *Handler) {
			on := true
			h.Redis = &RedisConfig{Addresses: []string{"a:1"}, Functions: &on}
		})},
		{"redis tls bare", withPolicy("redis {\n address a:1\n tls\n}"), baseHandler(func(h *Handler) {
			h.Redis = &RedisConfig{Addresses: []string{"a:1"}, TLS: &RedisTLSConfig{}}
		})},
		{"redis tls insecure", withPolicy("redis {\n address a:1\n tls insecure_skip_verify\n}"), baseHandler(func(h *Handler) {
			h.Redis = &RedisConfig{Addresses: []string{"a:1"}, TLS: &RedisTLSConfig{InsecureSkipVerify: true}}
		})},
		{"redis tls block", withPolicy("redis {\n address a:1\n tls {\n  ca ca.pem\n  cert c.pem\n  key k.pem\n  server_name r.internal\n  insecure_skip_verify\n }\n}"), baseHandler(func(h *Handler) {
			h.Redis = &RedisConfig{Addresses: []string{"a:1"}, TLS: &RedisTLSConfig{
				CA: "ca.pem", Cert: "c.pem", Key: "k.pem", ServerName: "r.internal", InsecureSkipVerify: true,
			}}
		})},
		{"tenant and tier", withPolicy("tenant {http.auth.user.id}\ntier {http.request.header.X-Plan}"), baseHandler(func(h *Handler) {
			h.Tenant, h.Tier = "{http.auth.user.id}", "{http.request.header.X-Plan}"
		})},
		{"tenant_tier repeats", withPolicy("tenant_tier acme gold\ntenant_tier initech free"), baseHandler(func(h *Handler) {
			h.TenantTiers = map[string]string{"acme": "gold", "initech": "free"}
		})},
		{"missing_tenant shared", withPolicy("missing_tenant shared"), baseHandler(func(h *Handler) { h.MissingTenant = "shared" })},
		{"missing_tenant deny", withPolicy("missing_tenant deny"), baseHandler(func(h *Handler) { h.MissingTenant = "deny" })},
		{"lease max only", withPolicy("lease 10"), baseHandler(func(h *Handler) { h.Lease = &LeaseConfig{MaxTokens: 10} })},
		{"lease with ttl", withPolicy("lease 10 2s"), baseHandler(func(h *Handler) { h.Lease = &LeaseConfig{MaxTokens: 10, TTL: dur("2s")} })},
		{"lease zero", withPolicy("lease 0"), baseHandler(func(h *Handler) { h.Lease = &LeaseConfig{} })},
		{"shadow", withPolicy("shadow"), baseHandler(func(h *Handler) { h.Shadow = true })},
		{"fail open", withPolicy("fail open"), baseHandler(func(h *Handler) { h.FailMode = "open" })},
		{"fail closed", withPolicy("fail closed"), baseHandler(func(h *Handler) { h.FailMode = "closed" })},
		{"fail local", withPolicy("fail local"), baseHandler(func(h *Handler) { h.FailMode = "local" })},
		{"headers both", withPolicy("headers both"), baseHandler(func(h *Handler) { h.Headers = "both" })},
		{"headers ietf", withPolicy("headers ietf"), baseHandler(func(h *Handler) { h.Headers = "ietf" })},
		{"headers legacy", withPolicy("headers legacy"), baseHandler(func(h *Handler) { h.Headers = "legacy" })},
		{"headers off", withPolicy("headers off"), baseHandler(func(h *Handler) { h.Headers = "off" })},
		{"jitter fraction", withPolicy("jitter 0.25"), baseHandler(func(h *Handler) { h.Jitter = 0.25 })},
		{"jitter caddy-ratelimit percent style", withPolicy("jitter 20"), baseHandler(func(h *Handler) { h.Jitter = 20 })},
		{"denials_stream default", withPolicy("redis a:1\ndenials_stream"), baseHandler(func(h *Handler) {
			h.DenialsStream = 10000
			h.Redis = &RedisConfig{Addresses: []string{"a:1"}}
		})},
		{"denials_stream maxlen", withPolicy("denials_stream 500\nredis a:1"), baseHandler(func(h *Handler) {
			h.DenialsStream = 500
			h.Redis = &RedisConfig{Addresses: []string{"a:1"}}
		})},
		{"metrics_tenants", withPolicy("metrics_tenants 25"), baseHandler(func(h *Handler) { h.MetricsTenants = 25 })},
		{"metrics_tenants zero", withPolicy("metrics_tenants 0"), baseHandler(nil)},
		{"log_key", withPolicy("log_key"), baseHandler(func(h *Handler) { h.LogKey = true })},
		{"flags repeat", withPolicy("log_key\nlog_key\nshadow\nshadow"), baseHandler(func(h *Handler) { h.LogKey, h.Shadow = true, true })},
		{"max_memory", withPolicy("max_memory 64MiB"), baseHandler(func(h *Handler) { h.MaxMemory = 64 << 20 })},
		{"sweep_interval", withPolicy("sweep_interval 30s"), baseHandler(func(h *Handler) { h.SweepInterval = dur("30s") })},
		{"disable_metrics", withPolicy("disable_metrics"), baseHandler(func(h *Handler) { h.DisableMetrics = true })},
		{"distributed bare", "rate_limit {\n distributed\n zone z {\n  events 5\n  window 1m\n }\n}", &Handler{
			Distributed: &DistributedConfig{},
			RateLimits:  map[string]*PolicyConfig{"z": {MaxEvents: 5, Window: dur("1m")}},
		}},
		{"distributed block", "rate_limit {\n distributed {\n  read_interval 2s\n  write_interval 3s\n  purge_age 1m\n }\n zone z {\n  events 5\n  window 1m\n }\n}", &Handler{
			Distributed: &DistributedConfig{ReadInterval: dur("2s"), WriteInterval: dur("3s"), PurgeAge: dur("1m")},
			RateLimits:  map[string]*PolicyConfig{"z": {MaxEvents: 5, Window: dur("1m")}},
		}},
		{"drain off", withPolicy("drain off"), baseHandler(func(h *Handler) { h.Drain = &DrainConfig{Off: true} })},
		{"drain block", withPolicy("drain {\n timeout 30s\n max_bytes 1MiB\n max_concurrent 7\n}"), baseHandler(func(h *Handler) {
			h.Drain = &DrainConfig{Timeout: dur("30s"), MaxBytes: 1 << 20, MaxConcurrent: 7}
		})},
		{"storage", withPolicy("storage file_system /var/lib/rl"), baseHandler(func(h *Handler) {
			h.StorageRaw = json.RawMessage(`{"module":"file_system","root":"/var/lib/rl"}`)
		})},
		{"storage block", withPolicy("storage file_system {\n root /srv/rl\n}"), baseHandler(func(h *Handler) {
			h.StorageRaw = json.RawMessage(`{"module":"file_system","root":"/srv/rl"}`)
		})},
		{"zone alias", "rate_limit {\n zone z {\n  events 5\n  window 1m\n }\n}", &Handler{RateLimits: map[string]*PolicyConfig{
			"z": {MaxEvents: 5, Window: dur("1m")},
		}}},
		{"two policies", "rate_limit {\n policy a {\n  limit 1\n  window 1s\n }\n zone b {\n  events 2\n  window 2s\n }\n}", asPolicyBlocks(&Handler{RateLimits: map[string]*PolicyConfig{
			"a": {MaxEvents: 1, Window: dur("1s")},
			"b": {MaxEvents: 2, Window: dur("2s")},
		}}, "a")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseTest(tt.input)
			if err != nil {
				t.Fatalf("parse:\n%s\nerror: %v", tt.input, err)
			}
			assertHandler(t, got, tt.want)
			if _, err := got.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

// assertHandler compares handlers through their JSON form (what Caddy
// stores), after checking the Go values directly.
func assertHandler(t *testing.T, got, want *Handler) {
	t.Helper()
	gj, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	wj, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if normalizeJSON(t, gj) != normalizeJSON(t, wj) {
		t.Errorf("got:\n%s\nwant:\n%s", normalizeJSON(t, gj), normalizeJSON(t, wj))
	}
}

func TestCaddyfilePolicyDirectives(t *testing.T) {
	policy := func(body string) string {
		return "rate_limit {\n\tpolicy p {\n" + body + "\n\t}\n}\n"
	}
	tests := []struct {
		name string
		body string
		want *PolicyConfig
	}{
		{"limit and window", "limit 10\nwindow 1m", &PolicyConfig{MaxEvents: 10, Window: dur("1m")}},
		{"events alias", "events 10\nwindow 1h", &PolicyConfig{MaxEvents: 10, Window: dur("1h")}},
		{"day window", "limit 10\nwindow 1d", &PolicyConfig{MaxEvents: 10, Window: dur("24h")}},
		{"key", "key {http.request.uri.path}\nlimit 1\nwindow 1s", &PolicyConfig{Key: "{http.request.uri.path}", MaxEvents: 1, Window: dur("1s")}},
		{"algorithm token_bucket burst", "algorithm token_bucket\nlimit 10\nwindow 1s\nburst 20", &PolicyConfig{Algorithm: "token_bucket", MaxEvents: 10, Window: dur("1s"), Burst: 20}},
		{"burst before algorithm", "burst 20\nlimit 10\nwindow 1s\nalgorithm gcra", &PolicyConfig{Algorithm: "gcra", MaxEvents: 10, Window: dur("1s"), Burst: 20}},
		{"fixed_window", "algorithm fixed_window\nlimit 10\nwindow 1s", &PolicyConfig{Algorithm: "fixed_window", MaxEvents: 10, Window: dur("1s")}},
		{"sliding_window", "algorithm sliding_window\nlimit 10\nwindow 1s", &PolicyConfig{Algorithm: "sliding_window", MaxEvents: 10, Window: dur("1s")}},
		{"sliding_log min_interval", "algorithm sliding_log\nlimit 10\nwindow 1m\nmin_interval 1s", &PolicyConfig{Algorithm: "sliding_log", MaxEvents: 10, Window: dur("1m"), MinInterval: dur("1s")}},
		{"concurrency without window", "algorithm concurrency\nlimit 4", &PolicyConfig{Algorithm: "concurrency", MaxEvents: 4}},
		{"cost constant", "limit 10\nwindow 1s\ncost 3", &PolicyConfig{MaxEvents: 10, Window: dur("1s"), Cost: "3"}},
		{"cost zero", "limit 10\nwindow 1s\ncost 0", &PolicyConfig{MaxEvents: 10, Window: dur("1s"), Cost: "0"}},
		{"cost placeholder", "limit 10\nwindow 1s\ncost {http.request.header.X-Cost}", &PolicyConfig{MaxEvents: 10, Window: dur("1s"), Cost: "{http.request.header.X-Cost}"}},
		{"tiers", "algorithm token_bucket\nlimit 10\nwindow 1m\ntier free 5\ntier pro 100 1h\ntier max 1000 1h burst 10 shadow\ntier vip unlimited\ntier beta 7 shadow", &PolicyConfig{
			Algorithm: "token_bucket", MaxEvents: 10, Window: dur("1m"),
			Tiers: map[string]*LimitConfig{
				"free": {MaxEvents: 5},
				"pro":  {MaxEvents: 100, Window: dur("1h")},
				"max":  {MaxEvents: 1000, Window: dur("1h"), Burst: 10, Shadow: true},
				"vip":  {Unlimited: true},
				"beta": {MaxEvents: 7, Shadow: true},
			},
		}},
		{"tier options in any order", "algorithm token_bucket\nlimit 10\nwindow 1m\ntier a 5 shadow burst 9 1h", &PolicyConfig{
			Algorithm: "token_bucket", MaxEvents: 10, Window: dur("1m"),
			Tiers: map[string]*LimitConfig{"a": {MaxEvents: 5, Window: dur("1h"), Burst: 9, Shadow: true}},
		}},
		{"overrides", "algorithm gcra\nlimit 10\nwindow 1m\noverride acme 500 1h burst 600\noverride root unlimited\noverride test 1 shadow", &PolicyConfig{
			Algorithm: "gcra", MaxEvents: 10, Window: dur("1m"),
			Overrides: map[string]*LimitConfig{
				"acme": {MaxEvents: 500, Window: dur("1h"), Burst: 600},
				"root": {Unlimited: true},
				"test": {MaxEvents: 1, Shadow: true},
			},
		}},
		{"lease", "limit 10\nwindow 1s\nlease 5 300ms", &PolicyConfig{MaxEvents: 10, Window: dur("1s"), Lease: &LeaseConfig{MaxTokens: 5, TTL: dur("300ms")}}},
		{"lease zero on sliding_log", "algorithm sliding_log\nlimit 10\nwindow 1s\nlease 0", &PolicyConfig{Algorithm: "sliding_log", MaxEvents: 10, Window: dur("1s"), Lease: &LeaseConfig{}}},
		{"shadow", "limit 10\nwindow 1s\nshadow", &PolicyConfig{MaxEvents: 10, Window: dur("1s"), Shadow: true}},
		{"count_status", "limit 10\nwindow 1s\ncount_status 401 403", &PolicyConfig{MaxEvents: 10, Window: dur("1s"), CountStatus: []string{"401", "403"}}},
		{"refund_status", "limit 10\nwindow 1s\nrefund_status 5xx 429", &PolicyConfig{MaxEvents: 10, Window: dur("1s"), RefundStatus: []string{"5xx", "429"}}},
		{"fail", "limit 10\nwindow 1s\nfail closed", &PolicyConfig{MaxEvents: 10, Window: dur("1s"), FailMode: "closed"}},
		{"prefixes", "limit 10\nwindow 1s\nipv4_prefix 24\nipv6_prefix 64", &PolicyConfig{MaxEvents: 10, Window: dur("1s"), IPv4Prefix: 24, IPv6Prefix: 64}},
		{"prefix bounds", "limit 10\nwindow 1s\nipv4_prefix 32\nipv6_prefix 0", &PolicyConfig{MaxEvents: 10, Window: dur("1s"), IPv4Prefix: 32}},
		{"match", "limit 10\nwindow 1s\nmatch {\n method GET\n path /a/*\n}\nmatch {\n host example.com\n}", &PolicyConfig{
			MaxEvents: 10, Window: dur("1s"),
			MatcherSetsRaw: caddyhttp.RawMatcherSets{
				{"method": json.RawMessage(`["GET"]`), "path": json.RawMessage(`["/a/*"]`)},
				{"host": json.RawMessage(`["example.com"]`)},
			},
		}},
		{"empty match block ignored", "limit 10\nwindow 1s\nmatch {\n}", &PolicyConfig{MaxEvents: 10, Window: dur("1s")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			input := policy(tt.body)
			got, err := parseTest(input)
			if err != nil {
				t.Fatalf("parse:\n%s\nerror: %v", input, err)
			}
			assertHandler(t, got, policyOnly(tt.want))
			if _, err := got.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

func TestCaddyfileErrors(t *testing.T) {
	// policy wraps a policy body whose first line is line 3.
	policy := func(body string) string {
		return "rate_limit {\n\tpolicy p {\n" + body + "\n\t}\n}\n"
	}
	tests := []struct {
		name  string
		input string
		line  int      // the error must name Testfile:<line>
		want  []string // and contain each of these
	}{
		// handler level
		{"argument on directive line", "rate_limit foo {\n" + onePolicy + "}", 1, []string{`unexpected argument "foo"`, "matcher"}},
		{"unknown subdirective", withPolicy("bogus 1"), 2, []string{`unknown subdirective "bogus"`, "allowed:", "redis", "tenant_tier", "policy (alias zone)", "storage"}},
		{"duplicate tenant", withPolicy("tenant a\ntenant b"), 3, []string{"tenant already specified at line 2"}},
		{"tenant no arg", withPolicy("tenant"), 2, []string{"tenant: wrong number of arguments (0)", "usage: tenant <placeholder-template>"}},
		{"tenant two args", withPolicy("tenant a b"), 2, []string{"tenant: wrong number of arguments (2)"}},
		{"tenant with block", withPolicy("tenant a {\n x\n}"), 2, []string{"tenant: takes no block"}},
		{"tier handler no arg", withPolicy("tier"), 2, []string{"tier: wrong number of arguments"}},
		{"tenant_tier one arg", withPolicy("tenant_tier acme"), 2, []string{"usage: tenant_tier <tenant> <tier>"}},
		{"tenant_tier duplicate", withPolicy("tenant_tier acme gold\ntenant_tier acme free"), 3, []string{`tenant "acme" is already mapped to tier "gold"`}},
		{"tenant_tier empty", withPolicy(`tenant_tier "" gold`), 2, []string{"must not be empty"}},
		{"missing_tenant bad", withPolicy("missing_tenant allow"), 2, []string{`missing_tenant: "allow": unknown value (allowed: shared, deny)`}},
		{"lease negative", withPolicy("lease -1"), 2, []string{"lease: -1 is out of range (allowed: 0 to 9007199254740991); 0 disables leasing"}},
		{"lease not int", withPolicy("lease many"), 2, []string{`lease: "many" is not a valid integer`}},
		{"lease bad ttl", withPolicy("lease 5 soon"), 2, []string{`lease: "soon" is not a valid duration`}},
		{"lease zero ttl", withPolicy("lease 5 0s"), 2, []string{`"0s" must be a positive duration`}},
		{"lease too many args", withPolicy("lease 5 1s 2"), 2, []string{"usage: lease <max_tokens> [<ttl>]"}},
		{"shadow with arg", withPolicy("shadow yes"), 2, []string{"shadow: wrong number of arguments (1)"}},
		{"fail bad", withPolicy("fail maybe"), 2, []string{`fail: "maybe": unknown value (allowed: open, closed, local)`}},
		{"headers bad", withPolicy("headers draft"), 2, []string{`headers: "draft": unknown value (allowed: both, ietf, legacy, off)`}},
		{"jitter negative", withPolicy("jitter -0.1"), 2, []string{"jitter: -0.1: must not be negative"}},
		{"jitter not number", withPolicy("jitter lots"), 2, []string{`jitter: "lots" is not a number`}},
		{"jitter twice", withPolicy("jitter 0.1\njitter 0.2"), 3, []string{"jitter already specified at line 2"}},
		{"denials_stream zero", withPolicy("denials_stream 0"), 2, []string{"denials_stream: 0 is out of range (want an integer from 1 to 2147483647)"}},
		{"denials_stream two args", withPolicy("denials_stream 1 2"), 2, []string{"usage: denials_stream [<maxlen>]"}},
		{"denials_stream without redis", withPolicy("log_key\ndenials_stream"), 3, []string{"denials_stream: needs a redis block (the stream lives in Redis)"}},
		{"metrics_tenants negative", withPolicy("metrics_tenants -3"), 2, []string{"metrics_tenants: -3 is out of range (allowed: 0 to 10000; 0 disables per-tenant series)"}},
		{"metrics_tenants float", withPolicy("metrics_tenants 2.5"), 2, []string{`metrics_tenants: "2.5" is not a valid integer`}},
		{"max_memory bad", withPolicy("max_memory lots"), 2, []string{`max_memory: "lots" is not a valid size (want e.g. 64MiB, 512MB, 1GiB)`}},
		{"max_memory small", withPolicy("max_memory 64KiB"), 2, []string{"max_memory: 65536 bytes is out of range (allowed: 1048576 (1 MiB) to 1099511627776 (1 TiB); 0 means 256 MiB)"}},
		{"sweep_interval bad", withPolicy("sweep_interval often"), 2, []string{`sweep_interval: "often" is not a valid duration`}},
		{"sweep_interval negative", withPolicy("sweep_interval -1m"), 2, []string{"must be a positive duration"}},
		{"distributed args", withPolicy("distributed yes"), 2, []string{"distributed: wrong number of arguments (1)"}},
		{"drain word", withPolicy("drain on"), 2, []string{`drain: "on": unknown argument (allowed: off, or a block)`}},
		{"drain unknown", withPolicy("drain {\n max_time 1s\n}"), 3, []string{`drain: unknown subdirective "max_time" (allowed: timeout, max_bytes, max_concurrent)`}},
		{"distributed unknown", withPolicy("distributed {\n read 1s\n}"), 3, []string{`distributed: unknown subdirective "read" (allowed: read_interval, write_interval, purge_age)`}},
		{"distributed bad duration", withPolicy("distributed {\n purge_age forever\n}"), 3, []string{`purge_age: "forever" is not a valid duration`}},
		{"storage no module", withPolicy("storage"), 2, []string{"storage: missing storage module name"}},
		{"storage unknown module", withPolicy("storage nowhere"), 2, []string{"storage: getting module named 'caddy.storage.nowhere'"}},

		// redis
		{"redis no address", withPolicy("redis {\n db 1\n}"), 2, []string{"redis: address: at least one host:port is required"}},
		{"redis bad inline address", withPolicy("redis localhost"), 2, []string{`redis: "localhost": want host:port`}},
		{"redis bad address", withPolicy("redis {\n address a:1 nope\n}"), 3, []string{`redis: address: "nope": want host:port`}},
		{"redis bad port", withPolicy("redis {\n address a:99999\n}"), 3, []string{`"a:99999": want host:port`}},
		{"redis address no args", withPolicy("redis {\n address\n}"), 3, []string{"usage: address <host:port>..."}},
		{"redis unknown", withPolicy("redis {\n address a:1\n host a\n}"), 4, []string{`redis: unknown subdirective "host"`, "allowed: address, cluster, sentinel"}},
		{"redis cluster sentinel", withPolicy("redis {\n address a:1\n cluster\n sentinel m\n}"), 2, []string{"redis: cluster mode and a sentinel master are mutually exclusive"}},
		{"redis cluster db", withPolicy("redis {\n address a:1\n cluster\n db 2\n}"), 5, []string{"redis: db: 2: Redis Cluster has only db 0"}},
		{"redis db negative", withPolicy("redis {\n address a:1\n db -1\n}"), 4, []string{"redis: db: -1: must not be negative"}},
		{"redis pool_size negative", withPolicy("redis {\n address a:1\n pool_size -1\n}"), 4, []string{"redis: pool_size: -1: must not be negative (0 is the default)"}},
		{"redis timeout bad", withPolicy("redis {\n address a:1\n timeout fast\n}"), 4, []string{`timeout: "fast" is not a valid duration`}},
		{"redis key_prefix bad", withPolicy("redis {\n address a:1\n key_prefix a:b\n}"), 4, []string{`key_prefix: "a:b": use 1-64 letters`}},
		{"redis breaker_failures negative", withPolicy("redis {\n address a:1\n breaker_failures -2\n}"), 4, []string{"redis: breaker_failures: -2: must not be negative (0 is the default, 3)"}},
		{"redis breaker_cooldown zero", withPolicy("redis {\n address a:1\n breaker_cooldown 0s\n}"), 4, []string{"breaker_cooldown", "must be a positive duration"}},
		{"redis duplicate", withPolicy("redis a:1\nredis b:2"), 3, []string{"redis already specified at line 2"}},
		{"redis tls bad arg", withPolicy("redis {\n address a:1\n tls yes\n}"), 4, []string{`tls: unknown argument "yes" (allowed: insecure_skip_verify)`}},
		{"redis tls cert without key", withPolicy("redis {\n address a:1\n tls {\n  cert c.pem\n }\n}"), 4, []string{"tls: cert and key must be given together"}},
		{"redis tls unknown", withPolicy("redis {\n address a:1\n tls {\n  verify no\n }\n}"), 5, []string{`redis: tls: unknown subdirective "verify" (allowed: ca, cert, key, server_name, insecure_skip_verify)`}},

		// policy
		{"policy no name", "rate_limit {\n policy {\n  limit 1\n }\n}", 2, []string{"policy: wrong number of arguments (0)", "usage: policy <name>"}},
		{"duplicate policy", "rate_limit {\n policy a {\n  limit 1\n  window 1s\n }\n zone a {\n  events 1\n  window 1s\n }\n}", 6, []string{`zone: duplicate policy name "a"`}},
		{"policy unknown subdirective", policy("limit 1\nwindow 1s\nrate 5"), 5, []string{`policy p: unknown subdirective "rate"`, "allowed: match, key, algorithm, limit (alias events), window, calendar, burst, delay, cost, cost_after, cost_before, price, cost_missing, count_status, refund_status, penalty, notify, min_interval, tier, tenant_limit, override, lease, shadow, near_limit, fail, ipv4_prefix, ipv6_prefix"}},
		{"missing limit", policy("window 1s"), 2, []string{"policy p: limit: must be set to an integer from 1 to 9007199254740991"}},
		{"missing window", policy("limit 5"), 2, []string{"policy p: window: required for algorithm sliding_window (only concurrency takes none)"}},
		{"missing window token_bucket", policy("limit 5\nalgorithm token_bucket"), 2, []string{"window: required for algorithm token_bucket"}},
		{"zone missing window", "rate_limit {\n zone z {\n  events 5\n }\n}", 2, []string{"zone z: window: required"}},
		{"empty policy", "rate_limit {\n policy p\n}", 2, []string{"policy p: limit: must be set to"}},
		{"limit zero", policy("limit 0\nwindow 1s"), 3, []string{"policy p: limit: must be set to an integer from 1 to 9007199254740991"}},
		{"limit negative", policy("limit -5\nwindow 1s"), 3, []string{"limit: -5 is out of range"}},
		{"limit not integer", policy("limit 1.5\nwindow 1s"), 3, []string{`limit: "1.5" is not a valid integer (want an integer from 1 to 9007199254740991)`}},
		{"events twice", policy("events 1\nlimit 2\nwindow 1s"), 4, []string{"limit: already specified as events at line 3 (events and limit are the same setting)"}},
		{"limit then events", policy("limit 1\nwindow 1s\nevents 2"), 5, []string{"events: already specified as limit at line 3 (limit and events are the same setting)"}},
		{"window bad", policy("limit 1\nwindow soon"), 4, []string{`window: "soon" is not a valid duration (want e.g. 100ms, 10s, 1m, 1h, 1d)`}},
		{"window zero", policy("limit 1\nwindow 0"), 4, []string{`window: "0" must be a positive duration`}},
		{"window too long", policy("limit 1\nwindow 400d"), 4, []string{"window: 9600h0m0s is out of range (allowed: 1ms to 366d)"}},
		{"algorithm unknown", policy("algorithm leaky_bucket\nlimit 1\nwindow 1s"), 3, []string{`algorithm: "leaky_bucket": unknown (allowed: token_bucket, gcra, sliding_window, fixed_window, sliding_log, concurrency)`}},
		{"algorithm no arg", policy("algorithm"), 3, []string{"usage: algorithm token_bucket|gcra|sliding_window|fixed_window|sliding_log|concurrency"}},
		{"burst negative", policy("algorithm token_bucket\nlimit 1\nwindow 1s\nburst -3"), 6, []string{"policy p: burst: -3 is out of range (allowed: 0 to 9007199254740991)"}},
		{"burst on sliding_window", policy("limit 1\nwindow 1s\nburst 5"), 5, []string{"policy p: burst: applies only to token_bucket and gcra, not sliding_window"}},
		{"burst before algorithm fixed_window", policy("burst 5\nlimit 1\nwindow 1s\nalgorithm fixed_window"), 3, []string{"burst: applies only to token_bucket and gcra, not fixed_window"}},
		{"tier burst on sliding_log", policy("algorithm sliding_log\nlimit 1\nwindow 1s\ntier gold 5 burst 7"), 6, []string{"policy p: tier gold: burst: applies only to token_bucket and gcra, not sliding_log"}},
		{"override burst on concurrency", policy("limit 1\noverride acme 5 burst 7\nalgorithm concurrency"), 4, []string{"policy p: override acme: burst: applies only to token_bucket and gcra, not concurrency"}},
		{"min_interval on token_bucket", policy("algorithm token_bucket\nlimit 1\nwindow 1s\nmin_interval 1s"), 6, []string{"min_interval: applies only to sliding_log, not token_bucket"}},
		{"min_interval default algorithm", policy("min_interval 1s\nlimit 1\nwindow 1s"), 3, []string{"min_interval: applies only to sliding_log, not sliding_window"}},
		{"min_interval bad", policy("min_interval later"), 3, []string{`min_interval: "later" is not a valid duration`}},
		{"count_status word", policy("limit 1\nwindow 1s\ncount_status 401 failed"), 5, []string{`count_status: "failed" is not a status code (100-599, e.g. 401) or a class (1xx-5xx, e.g. 5xx)`}},
		{"refund_status 600", policy("limit 1\nwindow 1s\nrefund_status 600"), 5, []string{`refund_status: "600" is not a status code`}},
		{"count_status empty", policy("limit 1\nwindow 1s\ncount_status"), 5, []string{"wrong number of arguments (0); usage: count_status <code|class>..."}},
		{"count_status and refund_status", policy("limit 1\nwindow 1s\ncount_status 401\nrefund_status 5xx"), 6, []string{"refund_status: not with count_status"}},
		{"count_status on concurrency", policy("algorithm concurrency\nlimit 1\ncount_status 401"), 5, []string{"count_status: not for concurrency"}},
		{"lease on sliding_log", policy("algorithm sliding_log\nlimit 1\nwindow 1s\nlease 5"), 6, []string{"lease", "sliding_log cannot lease units"}},
		{"lease on concurrency", policy("lease 5 1s\nalgorithm concurrency\nlimit 1"), 3, []string{"concurrency cannot lease units"}},
		{"cost negative", policy("limit 1\nwindow 1s\ncost -1"), 5, []string{"policy p: cost: -1 is out of range (allowed: 0 to 9007199254740991)"}},
		{"cost word", policy("limit 1\nwindow 1s\ncost heavy"), 5, []string{`cost: "heavy": want an integer from 0 to 9007199254740991 or a placeholder`}},
		{"fail bad policy", policy("limit 1\nwindow 1s\nfail soft"), 5, []string{`policy p: fail: "soft": unknown value (allowed: open, closed, local)`}},
		{"ipv4_prefix too big", policy("limit 1\nwindow 1s\nipv4_prefix 33"), 5, []string{"ipv4_prefix: 33 is out of range (allowed: 0 to 32)"}},
		{"ipv6_prefix too big", policy("limit 1\nwindow 1s\nipv6_prefix 129"), 5, []string{"ipv6_prefix: 129 is out of range (allowed: 0 to 128)"}},
		{"ipv6_prefix negative", policy("limit 1\nwindow 1s\nipv6_prefix -1"), 5, []string{"ipv6_prefix: -1 is out of range"}},
		{"key twice", policy("key a\nkey b"), 4, []string{"key already specified at line 3"}},
		{"key no arg", policy("key"), 3, []string{"key: wrong number of arguments (0)"}},
		{"shadow arg", policy("shadow on"), 3, []string{"policy p: shadow: wrong number of arguments (1)"}},
		{"match bad matcher", policy("limit 1\nwindow 1s\nmatch {\n path /a\n nosuchmatcher x\n}"), 7, []string{`policy p: match: unknown matcher "nosuchmatcher" (no module http.matchers.nosuchmatcher`}},

		// tier / override
		{"cost_after one arg", policy("cost_after header"), 3, []string{"cost_after: wrong number of arguments (1)", "usage: cost_after openai | cost_after anthropic | cost_after header <Name> | cost_after json <path>[+<path>...]"}},
		{"cost_after preset args", policy("cost_after openai extra"), 3, []string{"cost_after: wrong number of arguments (2)"}},
		{"cost_after misspelt", policy("cost_after opneai"), 3, []string{`cost_after: "opneai": unknown source (allowed: openai, anthropic, header, json)`}},
		{"price without output", policy("price gpt-4o input 1 cached 2"), 3, []string{"price: want input and output prices; usage: price <model-glob> input <n> output <n> [cached <n>]"}},
		{"price unknown kind", policy("price gpt-4o input 1 output 2 batch 3"), 3, []string{`price: "batch": unknown price (allowed: input, output, cached)`}},
		{"functions word", withPolicy("redis {\n address a:1\n functions maybe\n}"), 4, []string{`functions: "maybe": want on or off`}},
		{"cost_before source", policy("cost_before header X"), 3, []string{`cost_before: "header": unknown source (allowed: json)`}},
		{"price twice", policy("price gpt-4o input 1 input 2 output 3"), 3, []string{"price: input given twice"}},
		{"price not a number", policy("price gpt-4o input one output 2"), 3, []string{`price: "one" is not a valid integer (want a non-negative integer (units per token))`}},
		{"cost_after bad path", policy("limit 1\nwindow 1s\ncost_after json a+"), 5, []string{`policy p: cost_after: json: "a+": path 2 ("")`, "at Testfile:5"}},
		{"tier one arg", policy("tier gold"), 3, []string{"tier: wrong number of arguments (1)", "usage: tier <tier> <limit> [<window> | calendar <period> [<zone>]] [burst <n>] [delay <max_wait>] [shadow] | tier <tier> unlimited"}},
		{"limit above 2^53-1", policy("limit 100000000000000000\nwindow 1s"), 3, []string{"policy p: limit: 100000000000000000 is out of range (allowed: 1 to 9007199254740991)"}},
		{"burst above 2^53-1", policy("algorithm gcra\nlimit 1\nwindow 1s\nburst 9007199254740992"), 6, []string{"policy p: burst: 9007199254740992 is out of range (allowed: 0 to 9007199254740991)"}},
		{"window 1ns", policy("limit 1\nwindow 1ns"), 4, []string{"policy p: window: 1ns is out of range (allowed: 1ms to 366d)"}},
		{"cost above 2^53-1", policy("limit 1\nwindow 1s\ncost 9007199254740993"), 5, []string{"policy p: cost: 9007199254740993 is out of range (allowed: 0 to 9007199254740991)"}},
		{"min_interval too long", policy("algorithm sliding_log\nlimit 1\nwindow 1s\nmin_interval 400d"), 6, []string{"policy p: min_interval: 9600h0m0s is out of range (allowed: 0 to 366d)"}},
		{"tier limit above 2^53-1", policy("limit 1\nwindow 1s\ntier gold 9007199254740992"), 5, []string{"policy p: tier gold: 9007199254740992 is out of range (allowed: 1 to 9007199254740991)"}},
		{"override window below 1ms", policy("limit 1\nwindow 1s\noverride acme 5 100us"), 5, []string{"policy p: override acme: window: 100µs is out of range (allowed: 1ms to 366d)"}},
		{"lease ttl below 1ms", withPolicy("lease 5 10us"), 2, []string{"lease: ttl: 10µs is out of range (allowed: 1ms to 366d)"}},
		{"tier zero", policy("limit 1\nwindow 1s\ntier gold 0"), 5, []string{"policy p: tier gold: must be set to an integer from 1 to 9007199254740991, or unlimited"}},
		{"tier word", policy("tier gold lots"), 3, []string{`tier: "lots" is not a valid integer (want an integer from 1 to 9007199254740991, or unlimited)`}},
		{"tier bad window", policy("tier gold 5 later"), 3, []string{`tier: "later" is not a valid duration`}},
		{"tier bad option", policy("tier gold 5 shadow later"), 3, []string{`tier: "later" is not a valid duration`}},
		{"tier two windows", policy("tier gold 5 1m 1h"), 3, []string{`tier: unexpected "1h"`}},
		{"tier burst missing value", policy("tier gold 5 1m burst"), 3, []string{"burst must be given once, with a value"}},
		{"tier burst twice", policy("tier gold 5 burst 1 burst 2"), 3, []string{"burst must be given once"}},
		{"tier shadow twice", policy("tier gold 5 shadow shadow"), 3, []string{"shadow given twice"}},
		{"tier burst negative", policy("algorithm gcra\nlimit 1\nwindow 1s\ntier gold 5 burst -1"), 6, []string{"policy p: tier gold: burst: -1 is out of range (allowed: 0 to 9007199254740991)"}},
		{"tier unlimited extra", policy("tier gold unlimited shadow"), 3, []string{"nothing may follow unlimited"}},
		{"tier duplicate", policy("limit 1\nwindow 1s\ntier gold 5\ntier gold 6"), 6, []string{`tier: "gold" already specified at line 5`}},
		{"tier unexpected", policy("tier gold 5 1m burst 6 shadow extra"), 3, []string{`tier: unexpected "extra"`}},
		{"tier too many", policy("tier gold 5 calendar month UTC burst 6 delay 1s shadow extra"), 3, []string{"tier: wrong number of arguments (11)"}},
		{"delay on sliding_window", policy("limit 1\nwindow 1s\ndelay 500ms"), 5, []string{"policy p: delay: applies only to token_bucket, gcra, not sliding_window"}},
		{"delay on fixed_window", policy("delay 500ms\nalgorithm fixed_window\nlimit 1\nwindow 1s"), 3, []string{"policy p: delay: applies only to token_bucket, gcra, not fixed_window"}},
		{"delay on zone", "rate_limit {\n zone z {\n  events 5\n  window 1s\n  delay 1s\n }\n}", 5, []string{"zone z: delay: applies only to token_bucket, gcra, not sliding_log"}},
		{"delay too long", policy("algorithm gcra\nlimit 1\nwindow 1s\ndelay 2h"), 6, []string{"policy p: delay: 2h0m0s is out of range (allowed: 1ms to 1h; 0 never waits)"}},
		{"delay below 1ms", policy("algorithm gcra\nlimit 1\nwindow 1s\ndelay 500us"), 6, []string{"policy p: delay: 500µs is out of range (allowed: 1ms to 1h"}},
		{"delay zero", policy("algorithm gcra\nlimit 1\nwindow 1s\ndelay 0s"), 6, []string{`policy p: delay: "0s" must be a positive duration`}},
		{"delay twice", policy("algorithm gcra\nlimit 1\nwindow 1s\ndelay 1s\ndelay 2s"), 7, []string{"delay already specified at line 6"}},
		{"delay no arg", policy("delay"), 3, []string{"delay: wrong number of arguments (0); usage: delay <max_wait>"}},
		{"tier delay on sliding_log", policy("algorithm sliding_log\nlimit 1\nwindow 1s\ntier gold 5 delay 1s"), 6, []string{"policy p: tier gold: delay: applies only to token_bucket, gcra, not sliding_log"}},
		{"tenant_limit delay too long", policy("algorithm token_bucket\nlimit 1\nwindow 1s\ntenant_limit acme 5 delay 90m"), 6, []string{"policy p: tenant_limit acme: delay: 1h30m0s is out of range (allowed: 1ms to 1h"}},
		{"tier delay missing value", policy("tier gold 5 delay"), 3, []string{"delay must be given once, with a duration"}},
		{"tier delay twice", policy("tier gold 5 delay 1s delay 2s"), 3, []string{"delay must be given once"}},
		{"tier delay bad", policy("tier gold 5 delay soon"), 3, []string{`tier: "soon" is not a valid duration`}},
		{"calendar unknown zone", policy("limit 5\ncalendar month Mars/Olympus_Mons"), 4, []string{`policy p: calendar: zone: "Mars/Olympus_Mons": unknown time zone (want an IANA name such as UTC, America/New_York or Europe/Berlin)`}},
		{"calendar unknown period", policy("limit 5\ncalendar year"), 4, []string{`policy p: calendar: period: "year": unknown calendar period (allowed: day, week, month)`}},
		{"calendar local zone", policy("limit 5\ncalendar day Local"), 4, []string{`policy p: calendar: zone: "Local": name an IANA time zone`}},
		{"calendar with window", policy("limit 5\ncalendar day\nwindow 1d"), 5, []string{"policy p: window: excludes calendar: count per window or per calendar period, not both (remove one)"}},
		{"calendar with sliding_window", policy("algorithm sliding_window\nlimit 5\ncalendar day"), 5, []string{"policy p: calendar: applies only to fixed_window, not sliding_window"}},
		{"calendar with token_bucket", policy("limit 5\ncalendar day\nalgorithm token_bucket"), 4, []string{"policy p: calendar: applies only to fixed_window, not token_bucket"}},
		{"calendar no period", policy("limit 5\ncalendar"), 4, []string{"calendar: wrong number of arguments (0); usage: calendar day|week|month [<IANA zone>]"}},
		{"calendar too many", policy("limit 5\ncalendar day UTC extra"), 4, []string{"calendar: wrong number of arguments (3)"}},
		{"calendar twice", policy("limit 5\ncalendar day\ncalendar month"), 5, []string{"calendar already specified at line 4"}},
		{"tier calendar zone", policy("limit 5\ncalendar day\ntier gold 50 calendar month Nowhere/Land"), 5, []string{`policy p: tier gold: calendar: zone: "Nowhere/Land": unknown time zone`}},
		{"tier calendar and window", policy("limit 5\ncalendar day\ntier gold 50 1h calendar month"), 5, []string{"policy p: tier gold: window: excludes calendar"}},
		{"tier calendar on token_bucket", policy("algorithm token_bucket\nlimit 5\nwindow 1s\ntier gold 50 calendar month"), 6, []string{"policy p: tier gold: calendar: applies only to fixed_window, not token_bucket"}},
		{"tier calendar twice", policy("limit 5\ncalendar day\ntier gold 50 calendar month calendar day"), 5, []string{"calendar must be given once"}},
		{"tier calendar without period", policy("limit 5\ncalendar day\ntier gold 50 calendar"), 5, []string{"calendar must be given once, with a period"}},
		{"tier unlimited calendar", policy("limit 5\ncalendar day\ntier gold unlimited calendar day"), 5, []string{"nothing may follow unlimited"}},
		{"missing window fixed_window", policy("algorithm fixed_window\nlimit 5"), 2, []string{"policy p: window: required for algorithm fixed_window (only concurrency takes none), or a calendar period instead"}},
		{"near_limit zero", policy("limit 5\nwindow 1s\nnear_limit 0"), 5, []string{`policy p: near_limit: "0": want a fraction above 0 and at most 1`}},
		{"near_limit above one", policy("limit 5\nwindow 1s\nnear_limit 1.5"), 5, []string{`near_limit: "1.5": want a fraction above 0 and at most 1`}},
		{"near_limit not a number", withPolicy("near_limit most"), 2, []string{`near_limit: "most": want a fraction`}},
		{"near_limit negative", withPolicy("near_limit -0.2"), 2, []string{`near_limit: "-0.2": want a fraction`}},
		{"tier empty name", policy("limit 1\nwindow 1s\n" + `tier "" 5`), 5, []string{"policy p: tier : the name must not be empty"}},
		{"tier window too long", policy("limit 1\nwindow 1s\ntier gold 5 9000h"), 5, []string{"policy p: tier gold: window: 9000h0m0s is out of range (allowed: 1ms to 366d)"}},
		{"override duplicate", policy("limit 1\nwindow 1s\noverride acme 5\noverride acme unlimited"), 6, []string{`override: "acme" already specified at line 5`}},
		{"override bad", policy("limit 1\nwindow 1s\noverride acme -5"), 5, []string{"policy p: override acme: -5 is out of range (allowed: 1 to 9007199254740991)"}},
		{"tenant_limit bad", policy("limit 1\nwindow 1s\ntenant_limit acme 0"), 5, []string{"policy p: tenant_limit acme: must be set to an integer from 1 to 9007199254740991, or unlimited"}},
		{"tenant_limit and override of one tenant", policy("limit 1\nwindow 1s\ntenant_limit acme 5\noverride acme 6"), 6, []string{`policy p: override acme: tenant "acme" is also in tenant_limits`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseTest(tt.input)
			if err == nil {
				t.Fatalf("parse succeeded; want an error\n%s", tt.input)
			}
			msg := err.Error()
			if strings.HasPrefix(msg, ":") {
				t.Errorf("error %q starts with an empty scope", msg)
			}
			loc := "Testfile:" + strconv.Itoa(tt.line)
			if !strings.HasSuffix(msg, ", at "+loc) {
				t.Errorf("error %q does not end with the location %q", msg, loc)
			}
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
		})
	}
}

// normalizeJSON re-encodes b so that key order and spacing do not matter.
func normalizeJSON(t *testing.T, b []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("invalid JSON: %v\n%s", err, b)
	}
	out, err := json.MarshalIndent(v, "", "\t")
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}
