package config

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// jsonHandler decodes a handler config the way Caddy does.
func jsonHandler(t *testing.T, config string) *Handler {
	t.Helper()
	var h Handler
	if err := json.Unmarshal([]byte(config), &h); err != nil {
		t.Fatalf("decoding %s: %v", config, err)
	}
	return &h
}

func TestValidateConfigAccepts(t *testing.T) {
	tests := []struct{ name, config string }{
		{"minimal", `{"rate_limits":{"api":{"max_events":10,"window":"1m"}}}`},
		{"durations as nanoseconds", `{"rate_limits":{"api":{"max_events":10,"window":60000000000}}}`},
		{"caddy-ratelimit README JSON", `{
			"handler": "rate_limit",
			"rate_limits": {
				"static_example": {"match": [{"method": ["GET"]}], "key": "static", "window": "1m", "max_events": 100},
				"dynamic_example": {"key": "{http.request.remote.host}", "window": "5s", "max_events": 2}
			},
			"distributed": {},
			"log_key": true
		}`},
		{"caddy-ratelimit ipv6 prefix", `{"handler":"rate_limit","rate_limits":{"per_network":{"key":"{http.request.remote.host}","window":"1m","max_events":100,"ipv6_prefix":64}}}`},
		{"caddy-ratelimit all fields", `{"handler":"rate_limit","rate_limits":{"z":{"match":[],"key":"","window":"1s","max_events":1,"ipv4_prefix":0,"ipv6_prefix":0}},
			"jitter":0.0,"sweep_interval":"1m","log_key":false,"disable_metrics":false,"storage":{"module":"file_system","root":"/tmp"},
			"distributed":{"write_interval":"5s","read_interval":"5s","purge_age":"1m"}}`},
		{"everything", `{
			"redis": {"addresses": ["a:6379", "[::1]:6380"], "sentinel_master": "m", "username": "u", "password": "{env.P}",
				"db": 2, "tls": {"insecure_skip_verify": true, "ca": "ca", "cert": "c", "key": "k", "server_name": "s"},
				"pool_size": 10, "timeout": "100ms", "key_prefix": "rl", "breaker_failures": 3, "breaker_cooldown": "5s"},
			"tenant": "{http.auth.user.id}", "tier": "{http.request.header.X-Plan}",
			"tenant_tiers": {"acme": "gold"}, "missing_tenant": "deny", "lease": {"max_tokens": 10, "ttl": "1s"},
			"shadow": true, "fail_mode": "closed", "headers": "legacy", "jitter": 0.5, "denials_stream": 100,
			"metrics_tenants": 5, "log_key": true, "sweep_interval": "30s", "disable_metrics": true,
			"rate_limits": {
				"api": {"key": "{http.request.uri.path}", "algorithm": "token_bucket", "max_events": 100, "window": "1m",
					"burst": 200, "cost": 2, "tiers": {"gold": {"max_events": 1000, "burst": 2000, "shadow": true}, "free": {"unlimited": true}},
					"overrides": {"acme": {"max_events": 5, "window": "1s"}}, "lease": {"max_tokens": 5}, "shadow": true,
					"fail_mode": "open", "ipv4_prefix": 24, "ipv6_prefix": 64},
				"log": {"algorithm": "sliding_log", "max_events": 5, "window": "1m", "min_interval": "1s", "cost": "{http.request.header.X-Cost}"},
				"conc": {"algorithm": "concurrency", "max_events": 3, "lease": {"max_tokens": 0}}
			}
		}`},
		{"handler lease is skipped by policies that cannot lease", `{"lease":{"max_tokens":10},"rate_limits":{"c":{"algorithm":"concurrency","max_events":1},"l":{"algorithm":"sliding_log","max_events":1,"window":"1s"}}}`},
		{"cost zero", `{"rate_limits":{"api":{"max_events":10,"window":"1m","cost":0}}}`},
		{"cost string number", `{"rate_limits":{"api":{"max_events":10,"window":"1m","cost":"4"}}}`},
		{"jitter as caddy-ratelimit takes it (any value >= 0)", `{"jitter":1e9,"rate_limits":{"api":{"max_events":10,"window":"1m"}}}`},
		// caddy-ratelimit starts a handler without zones, and takes any
		// string as a zone name.
		{"no policy", `{}`},
		{"empty rate_limits", `{"rate_limits":{}}`},
		{"zone names of any kind", `{"rate_limits":{"a b":{"max_events":1,"window":"1s"},"api:v1":{"max_events":1,"window":"1s"},"/x/{y}%":{"max_events":1,"window":"1s"},"":{"max_events":1,"window":"1s"},"` + strings.Repeat("n", 100) + `":{"max_events":1,"window":"1s"}}}`},
		{"host-less redis address", `{"redis":{"addresses":[":6379"]},"rate_limits":{"api":{"max_events":10,"window":"1m"}}}`},
		{"window at maximum", `{"rate_limits":{"api":{"max_events":10,"window":"8784h"}}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := jsonHandler(t, tt.config).Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
}

func TestValidateConfigRejects(t *testing.T) {
	// pol is a valid policy to complete handler-level cases.
	const pol = `"rate_limits":{"api":{"max_events":10,"window":"1m"}}`
	tests := []struct {
		name   string
		config string
		want   string
	}{
		{"null policy", `{"rate_limits":{"api":null}}`, "rate_limits.api: policy is null"},
		{"missing_tenant", `{"missing_tenant":"allow",` + pol + `}`, `missing_tenant: "allow": unknown value (allowed: shared, deny)`},
		{"headers", `{"headers":"draft",` + pol + `}`, `headers: "draft": unknown value (allowed: both, ietf, legacy, off)`},
		{"fail_mode", `{"fail_mode":"soft",` + pol + `}`, `fail_mode: "soft": unknown value (allowed: open, closed, local)`},
		{"jitter negative", `{"jitter":-1,` + pol + `}`, "jitter: -1: must not be negative"},
		{"denials_stream negative", `{"denials_stream":-1,` + pol + `}`, "denials_stream: -1: must not be negative"},
		{"metrics_tenants negative", `{"metrics_tenants":-2,` + pol + `}`, "metrics_tenants: -2 is out of range (allowed: 0 to 10000"},
		{"max_memory too large", `{"max_memory":2199023255552,` + pol + `}`, "max_memory: 2199023255552 bytes is out of range (allowed: 1048576 (1 MiB) to 1099511627776 (1 TiB)"},
		{"sweep_interval negative", `{"sweep_interval":"-1s",` + pol + `}`, "sweep_interval: -1s: must not be negative"},
		{"tenant_tiers empty tier", `{"tenant_tiers":{"acme":""},` + pol + `}`, `tenant_tiers.acme: tenant and tier must not be empty (tier "")`},
		{"lease negative", `{"lease":{"max_tokens":-1},` + pol + `}`, "lease.max_tokens: -1 is out of range (allowed: 0 to 9007199254740991)"},
		{"lease ttl negative", `{"lease":{"max_tokens":1,"ttl":"-1s"},` + pol + `}`, "lease.ttl: -1s is out of range (allowed: 1ms to 366d)"},

		{"redis no address", `{"redis":{},` + pol + `}`, "redis.addresses: at least one host:port is required"},
		{"redis bad address", `{"redis":{"addresses":["a:1","redis"]},` + pol + `}`, `redis.addresses[1]: "redis": want host:port`},
		{"redis bad port", `{"redis":{"addresses":["a:port"]},` + pol + `}`, `redis.addresses[0]: "a:port": want host:port`},
		{"redis port zero", `{"redis":{"addresses":["a:0"]},` + pol + `}`, `redis.addresses[0]: "a:0": want host:port`},
		{"redis cluster sentinel", `{"redis":{"addresses":["a:1"],"cluster":true,"sentinel_master":"m"},` + pol + `}`, "redis: cluster mode and a sentinel master are mutually exclusive"},
		{"redis db negative", `{"redis":{"addresses":["a:1"],"db":-1},` + pol + `}`, "redis.db: -1: must not be negative"},
		{"redis cluster db", `{"redis":{"addresses":["a:1"],"cluster":true,"db":1},` + pol + `}`, "redis.db: 1: Redis Cluster has only db 0"},
		{"redis pool_size", `{"redis":{"addresses":["a:1"],"pool_size":-1},` + pol + `}`, "redis.pool_size: -1: must not be negative"},
		{"redis timeout", `{"redis":{"addresses":["a:1"],"timeout":"-1ms"},` + pol + `}`, "redis.timeout: must not be negative"},
		{"redis key_prefix", `{"redis":{"addresses":["a:1"],"key_prefix":"a{b}"},` + pol + `}`, `redis.key_prefix: "a{b}": use 1-64 letters`},
		{"redis breaker_failures", `{"redis":{"addresses":["a:1"],"breaker_failures":-3},` + pol + `}`, "redis.breaker_failures: -3: must not be negative"},
		{"redis breaker_cooldown", `{"redis":{"addresses":["a:1"],"breaker_cooldown":"-5s"},` + pol + `}`, "redis.breaker_cooldown: must not be negative"},
		{"redis tls key only", `{"redis":{"addresses":["a:1"],"tls":{"key":"k"}},` + pol + `}`, "redis.tls: cert and key must be given together"},

		{"algorithm unknown", `{"rate_limits":{"api":{"algorithm":"foo","max_events":1,"window":"1s"}}}`, `rate_limits.api.algorithm: "foo": unknown (allowed: token_bucket, gcra, sliding_window, fixed_window, sliding_log, concurrency)`},
		{"max_events missing", `{"rate_limits":{"api":{"window":"1s"}}}`, "rate_limits.api.max_events: must be set to an integer from 1 to 9007199254740991"},
		{"max_events negative", `{"rate_limits":{"api":{"max_events":-4,"window":"1s"}}}`, "rate_limits.api.max_events: -4 is out of range (allowed: 1 to 9007199254740991)"},
		{"window missing", `{"rate_limits":{"api":{"max_events":1}}}`, "rate_limits.api.window: required for algorithm sliding_log (only concurrency takes none)"},
		{"window negative", `{"rate_limits":{"api":{"max_events":1,"window":"-1s"}}}`, "rate_limits.api.window: -1s is out of range (allowed: 1ms to 366d)"},
		{"window too long", `{"rate_limits":{"api":{"max_events":1,"window":"10000h"}}}`, "rate_limits.api.window: 10000h0m0s is out of range (allowed: 1ms to 366d)"},
		{"burst on sliding_window", `{"rate_limits":{"api":{"algorithm":"sliding_window","max_events":1,"window":"1s","burst":5}}}`, "rate_limits.api.burst: applies only to token_bucket and gcra, not sliding_window"},
		{"burst negative", `{"rate_limits":{"api":{"algorithm":"gcra","max_events":1,"window":"1s","burst":-5}}}`, "rate_limits.api.burst: -5 is out of range (allowed: 0 to 9007199254740991)"},
		{"cost negative", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost":-2}}}`, "rate_limits.api.cost: -2 is out of range (allowed: 0 to 9007199254740991)"},
		{"cost word", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost":"heavy"}}}`, `rate_limits.api.cost: "heavy": want an integer from 0 to 9007199254740991 or a placeholder`},
		{"cost fraction", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost":1.5}}}`, `rate_limits.api.cost: "1.5"`},
		{"min_interval wrong algorithm", `{"rate_limits":{"api":{"algorithm":"sliding_window","max_events":1,"window":"1s","min_interval":"1s"}}}`, "rate_limits.api.min_interval: applies only to sliding_log, not sliding_window"},
		{"min_interval negative", `{"rate_limits":{"api":{"algorithm":"sliding_log","max_events":1,"window":"1s","min_interval":"-1s"}}}`, "rate_limits.api.min_interval: -1s is out of range (allowed: 0 to 366d)"},
		{"cost_after empty", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost_after":{}}}}`, "rate_limits.api.cost_after: set preset, header or json (cost_after openai | cost_after anthropic | cost_after header <Name> | cost_after json <path>[+<path>...])"},
		{"cost_after both", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost_after":{"header":"X-T","json":"a"}}}}`, "rate_limits.api.cost_after: preset, header and json exclude each other"},
		{"cost_after concurrency", `{"rate_limits":{"api":{"algorithm":"concurrency","max_events":1,"cost_after":{"header":"X-T"}}}}`, "rate_limits.api.cost_after: not with algorithm concurrency, which counts requests in flight, not units (allowed: token_bucket, gcra, sliding_window, fixed_window, sliding_log)"},
		{"cost_after cost 0", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost":0,"cost_after":{"header":"X-T"}}}}`, "rate_limits.api.cost: 0 with cost_after"},
		{"cost_after bad header", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost_after":{"header":"X Tokens"}}}}`, `rate_limits.api.cost_after.header: "X Tokens": not a header name`},
		{"cost_after bad path", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost_after":{"json":"usage..total"}}}}`, `rate_limits.api.cost_after.json: "usage..total": path 1 ("usage..total"): empty segment`},
		{"cost_after unknown preset", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost_after":{"preset":"gemini"}}}}`, `rate_limits.api.cost_after.preset: "gemini": unknown preset (allowed: openai, anthropic)`},
		{"cost_after preset and json", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost_after":{"preset":"openai","json":"a"}}}}`, "rate_limits.api.cost_after: preset, header and json exclude each other"},
		{"prices without preset", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost_after":{"json":"a"},"prices":[{"model":"*","input":1,"output":1}]}}}`, "rate_limits.api.prices: needs cost_after openai or cost_after anthropic"},
		{"prices twice", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost_after":{"preset":"openai"},"prices":[{"model":"*","input":1,"output":1},{"model":"*","input":2,"output":2}]}}}`, `rate_limits.api.prices[1].model: "*": priced twice`},
		{"prices negative", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost_after":{"preset":"openai"},"prices":[{"model":"m","input":-1,"output":1}]}}}`, "rate_limits.api.prices[0].input: -1 is out of range"},
		{"prices empty model", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost_after":{"preset":"anthropic"},"prices":[{"input":1,"output":1}]}}}`, "rate_limits.api.prices[0].model: empty"},
		{"cost_before without cost_after", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost_before":{"json":"max_tokens"}}}}`, "rate_limits.api.cost_before: needs cost_after"},
		{"cost_before bad path", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost_after":{"preset":"openai"},"cost_before":{"json":"max_tokens+"}}}}`, `rate_limits.api.cost_before.json: "max_tokens+": path 2 ("")`},
		{"cost_before prompt twice", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost_after":{"preset":"openai"},"cost_before":{"json":"prompt_estimate+prompt_estimate"}}}}`, "prompt_estimate given twice"},
		{"count_status bad", `{"rate_limits":{"api":{"max_events":1,"window":"1s","count_status":["401","6xx"]}}}`, `rate_limits.api.count_status.1: "6xx" is not a status code (100-599, e.g. 401) or a class (1xx-5xx, e.g. 5xx)`},
		{"penalty without duration", `{"rate_limits":{"api":{"max_events":1,"window":"1s","penalty":{"after":3}}}}`, "rate_limits.api.penalty.duration: 0s: want 1ms to 366d"},
		{"penalty after negative", `{"rate_limits":{"api":{"max_events":1,"window":"1s","penalty":{"duration":"1m","after":-2}}}}`, "rate_limits.api.penalty.after: -2: want an integer from 1 to"},
		{"penalty too long", `{"rate_limits":{"api":{"max_events":1,"window":"1s","penalty":{"duration":"400d"}}}}`, "rate_limits.api.penalty.duration: 9600h0m0s: want 1ms to 366d"},
		{"penalty on concurrency", `{"rate_limits":{"api":{"algorithm":"concurrency","max_events":1,"penalty":{"duration":"1m"}}}}`, "rate_limits.api.penalty: not for concurrency"},
		{"refund_status with count_status", `{"rate_limits":{"api":{"max_events":1,"window":"1s","count_status":["401"],"refund_status":["5xx"]}}}`, "rate_limits.api.refund_status: not with count_status"},
		{"refund_status on concurrency", `{"rate_limits":{"api":{"algorithm":"concurrency","max_events":1,"refund_status":["5xx"]}}}`, "rate_limits.api.refund_status: not for concurrency"},
		{"cost_missing without cost_after", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost_missing":"estimate"}}}`, "rate_limits.api.cost_missing: needs cost_after"},
		{"cost_missing word", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost_after":{"header":"X-T"},"cost_missing":"guess"}}}`, `rate_limits.api.cost_missing: "guess": want estimate or an integer from 0 to 9007199254740991`},
		{"cost_missing negative", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost_after":{"header":"X-T"},"cost_missing":-4}}}`, `rate_limits.api.cost_missing: "-4": want estimate`},
		{"drain negative timeout", `{"drain":{"timeout":"-1s"},"rate_limits":{"api":{"max_events":1,"window":"1s"}}}`, "drain.timeout: -1s: must not be negative (0 means 5m0s)"},
		{"drain max_concurrent", `{"drain":{"max_concurrent":-3},"rate_limits":{"api":{"max_events":1,"window":"1s"}}}`, "drain.max_concurrent: -3: out of range (allowed: 0 to 1048576; 0 means 100)"},
		{"cost_after distributed", `{"distributed":{},"rate_limits":{"api":{"max_events":1,"window":"1s","cost_after":{"header":"X-T"}}}}`, "rate_limits.api.cost_after: not with distributed"},
		{"delay wrong algorithm", `{"rate_limits":{"api":{"algorithm":"sliding_window","max_events":1,"window":"1s","delay":"500ms"}}}`, "rate_limits.api.delay: applies only to token_bucket, gcra, not sliding_window"},
		{"delay default algorithm", `{"rate_limits":{"api":{"max_events":1,"window":"1s","delay":"500ms"}}}`, "rate_limits.api.delay: applies only to token_bucket, gcra, not sliding_log"},
		{"delay negative", `{"rate_limits":{"api":{"algorithm":"gcra","max_events":1,"window":"1s","delay":"-1s"}}}`, "rate_limits.api.delay: -1s is out of range (allowed: 1ms to 1h; 0 never waits)"},
		{"delay too long", `{"rate_limits":{"api":{"algorithm":"token_bucket","max_events":1,"window":"1s","delay":"61m"}}}`, "rate_limits.api.delay: 1h1m0s is out of range (allowed: 1ms to 1h; 0 never waits)"},
		{"tier delay wrong algorithm", `{"rate_limits":{"api":{"algorithm":"fixed_window","max_events":1,"window":"1s","tiers":{"gold":{"max_events":5,"delay":"1s"}}}}}`, "rate_limits.api.tiers.gold.delay: applies only to token_bucket, gcra, not fixed_window"},
		{"tenant limit delay too short", `{"rate_limits":{"api":{"algorithm":"gcra","max_events":1,"window":"1s","tenant_limits":{"acme":{"max_events":5,"delay":"10us"}}}}}`, "rate_limits.api.tenant_limits.acme.delay: 10µs is out of range (allowed: 1ms to 1h"},
		{"tier unlimited with delay", `{"rate_limits":{"api":{"algorithm":"gcra","max_events":1,"window":"1s","tiers":{"gold":{"unlimited":true,"delay":"1s"}}}}}`, "rate_limits.api.tiers.gold: unlimited excludes max_events, window, calendar, burst and delay"},
		{"tier null", `{"rate_limits":{"api":{"max_events":1,"window":"1s","tiers":{"gold":null}}}}`, "rate_limits.api.tiers.gold: is null"},
		{"tier empty name", `{"rate_limits":{"api":{"max_events":1,"window":"1s","tiers":{"":{"max_events":1}}}}}`, "rate_limits.api.tiers.: the name must not be empty"},
		{"tier no max_events", `{"rate_limits":{"api":{"max_events":1,"window":"1s","tiers":{"gold":{"window":"1m"}}}}}`, "rate_limits.api.tiers.gold.max_events: must be set to an integer from 1 to 9007199254740991, or unlimited"},
		{"tier burst wrong algorithm", `{"rate_limits":{"api":{"algorithm":"fixed_window","max_events":1,"window":"1s","tiers":{"gold":{"max_events":5,"burst":9}}}}}`, "rate_limits.api.tiers.gold.burst: applies only to token_bucket and gcra, not fixed_window"},
		{"tier unlimited with limit", `{"rate_limits":{"api":{"max_events":1,"window":"1s","tiers":{"gold":{"unlimited":true,"max_events":5}}}}}`, "rate_limits.api.tiers.gold: unlimited excludes max_events, window, calendar, burst and delay"},
		{"tier window negative", `{"rate_limits":{"api":{"max_events":1,"window":"1s","tiers":{"gold":{"max_events":5,"window":"-1s"}}}}}`, "rate_limits.api.tiers.gold.window: -1s is out of range (allowed: 1ms to 366d)"},
		{"override window too long", `{"rate_limits":{"api":{"max_events":1,"window":"1s","overrides":{"acme":{"max_events":5,"window":"9000h"}}}}}`, "rate_limits.api.overrides.acme.window: 9000h0m0s is out of range (allowed: 1ms to 366d)"},
		{"override burst negative", `{"rate_limits":{"api":{"algorithm":"token_bucket","max_events":1,"window":"1s","overrides":{"acme":{"max_events":5,"burst":-1}}}}}`, "rate_limits.api.overrides.acme.burst: -1 is out of range (allowed: 0 to 9007199254740991)"},
		{"lease on sliding_log", `{"rate_limits":{"api":{"algorithm":"sliding_log","max_events":1,"window":"1s","lease":{"max_tokens":5}}}}`, "rate_limits.api.lease: sliding_log cannot lease units"},
		{"lease on concurrency", `{"rate_limits":{"api":{"algorithm":"concurrency","max_events":1,"lease":{"max_tokens":5}}}}`, "rate_limits.api.lease: concurrency cannot lease units"},
		{"policy lease negative", `{"rate_limits":{"api":{"max_events":1,"window":"1s","lease":{"max_tokens":-5}}}}`, "rate_limits.api.lease.max_tokens: -5 is out of range (allowed: 0 to 9007199254740991)"},
		{"policy fail_mode", `{"rate_limits":{"api":{"max_events":1,"window":"1s","fail_mode":"sometimes"}}}`, `rate_limits.api.fail_mode: "sometimes": unknown value (allowed: open, closed, local)`},
		{"ipv4_prefix", `{"rate_limits":{"api":{"max_events":1,"window":"1s","ipv4_prefix":33}}}`, "rate_limits.api.ipv4_prefix: 33 is out of range (allowed: 0 to 32)"},
		{"ipv6_prefix", `{"rate_limits":{"api":{"max_events":1,"window":"1s","ipv6_prefix":-1}}}`, "rate_limits.api.ipv6_prefix: -1 is out of range (allowed: 0 to 128)"},
		{"max_events above 2^53-1", `{"rate_limits":{"api":{"max_events":100000000000000000,"window":"1s"}}}`, "rate_limits.api.max_events: 100000000000000000 is out of range (allowed: 1 to 9007199254740991)"},
		{"window below 1ms", `{"rate_limits":{"api":{"max_events":1,"window":1}}}`, "rate_limits.api.window: 1ns is out of range (allowed: 1ms to 366d)"},
		{"burst above 2^53-1", `{"rate_limits":{"api":{"algorithm":"gcra","max_events":1,"window":"1s","burst":9007199254740992}}}`, "rate_limits.api.burst: 9007199254740992 is out of range (allowed: 0 to 9007199254740991)"},
		{"cost above 2^53-1", `{"rate_limits":{"api":{"max_events":1,"window":"1s","cost":9007199254740993}}}`, "rate_limits.api.cost: 9007199254740993 is out of range (allowed: 0 to 9007199254740991)"},
		{"tier limit above 2^53-1", `{"rate_limits":{"api":{"max_events":1,"window":"1s","tiers":{"gold":{"max_events":9007199254740992}}}}}`, "rate_limits.api.tiers.gold.max_events: 9007199254740992 is out of range (allowed: 1 to 9007199254740991)"},
		{"override window below 1ms", `{"rate_limits":{"api":{"max_events":1,"window":"1s","overrides":{"acme":{"max_events":5,"window":"500us"}}}}}`, "rate_limits.api.overrides.acme.window: 500µs is out of range (allowed: 1ms to 366d)"},
		{"lease above 2^53-1", `{"lease":{"max_tokens":9007199254740992},` + pol + `}`, "lease.max_tokens: 9007199254740992 is out of range (allowed: 0 to 9007199254740991)"},
		{"metrics_tenants too many", `{"metrics_tenants":2147483647,` + pol + `}`, "metrics_tenants: 2147483647 is out of range (allowed: 0 to 10000"},
		{"min_interval too long", `{"rate_limits":{"api":{"algorithm":"sliding_log","max_events":1,"window":"1s","min_interval":"9000h"}}}`, "rate_limits.api.min_interval: 9000h0m0s is out of range (allowed: 0 to 366d)"},
		{"tenant_limits and overrides of one tenant", `{"rate_limits":{"api":{"max_events":1,"window":"1s","tenant_limits":{"acme":{"max_events":2}},"overrides":{"acme":{"max_events":3}}}}}`, `rate_limits.api.overrides.acme: tenant "acme" is also in tenant_limits (overrides is the older name of tenant_limits: use one)`},
		{"tenant_limits window", `{"rate_limits":{"api":{"max_events":1,"window":"1s","tenant_limits":{"acme":{"max_events":2,"window":"1ns"}}}}}`, "rate_limits.api.tenant_limits.acme.window: 1ns is out of range"},
		{"first bad policy in name order", `{"rate_limits":{"b":{"max_events":1},"a":{"window":"1s"}}}`, "rate_limits.a.max_events"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := jsonHandler(t, tt.config).Validate()
			if err == nil {
				t.Fatalf("Validate accepted %s", tt.config)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

func TestBuildPolicy(t *testing.T) {
	sec := func(n int) time.Duration { return time.Duration(n) * time.Second }
	tests := []struct {
		name    string
		handler string // handler JSON; the policy under test is rate_limits.p
		want    *limiter.Policy
	}{
		{
			name:    "defaults",
			handler: `{"rate_limits":{"p":{"max_events":10,"window":"1m"}}}`,
			want: &limiter.Policy{Name: "p", Algorithm: limiter.SlidingLog,
				Limit: limiter.Limit{Rate: limiter.Rate{Limit: 10, Window: time.Minute}}},
		},
		{
			name: "tiers and overrides default window, keep own burst",
			handler: `{"rate_limits":{"p":{"algorithm":"token_bucket","max_events":10,"window":"1m","burst":30,
				"tiers":{"pro":{"max_events":100},"max":{"max_events":1000,"window":"1h","burst":5000},"vip":{"unlimited":true}},
				"overrides":{"acme":{"max_events":7,"window":"10s"},"root":{"unlimited":true}}}}}`,
			want: &limiter.Policy{Name: "p", Algorithm: limiter.TokenBucket,
				Limit: limiter.Limit{Rate: limiter.Rate{Limit: 10, Window: time.Minute, Burst: 30}},
				Tiers: map[string]limiter.Limit{
					"pro": {Rate: limiter.Rate{Limit: 100, Window: time.Minute}},
					"max": {Rate: limiter.Rate{Limit: 1000, Window: time.Hour, Burst: 5000}},
					"vip": {Unlimited: true},
				},
				TenantLimits: map[string]limiter.Limit{
					"acme": {Rate: limiter.Rate{Limit: 7, Window: sec(10)}},
					"root": {Unlimited: true},
				},
			},
		},
		{
			name:    "own shadow flags only",
			handler: `{"rate_limits":{"p":{"max_events":10,"window":"1m","tiers":{"t":{"max_events":5,"shadow":true},"u":{"max_events":6}}}}}`,
			want: &limiter.Policy{Name: "p", Algorithm: limiter.SlidingLog,
				Limit: limiter.Limit{Rate: limiter.Rate{Limit: 10, Window: time.Minute}},
				Tiers: map[string]limiter.Limit{
					"t": {Rate: limiter.Rate{Limit: 5, Window: time.Minute}, Shadow: true},
					"u": {Rate: limiter.Rate{Limit: 6, Window: time.Minute}},
				},
			},
		},
		{
			name:    "policy shadow reaches tiers and overrides",
			handler: `{"rate_limits":{"p":{"shadow":true,"max_events":10,"window":"1m","tiers":{"t":{"max_events":5}},"overrides":{"o":{"unlimited":true}}}}}`,
			want: &limiter.Policy{Name: "p", Algorithm: limiter.SlidingLog,
				Limit:        limiter.Limit{Rate: limiter.Rate{Limit: 10, Window: time.Minute}, Shadow: true},
				Tiers:        map[string]limiter.Limit{"t": {Rate: limiter.Rate{Limit: 5, Window: time.Minute}, Shadow: true}},
				TenantLimits: map[string]limiter.Limit{"o": {Unlimited: true, Shadow: true}},
			},
		},
		{
			name:    "handler shadow reaches everything",
			handler: `{"shadow":true,"rate_limits":{"p":{"max_events":10,"window":"1m","overrides":{"o":{"max_events":3}}}}}`,
			want: &limiter.Policy{Name: "p", Algorithm: limiter.SlidingLog,
				Limit:        limiter.Limit{Rate: limiter.Rate{Limit: 10, Window: time.Minute}, Shadow: true},
				TenantLimits: map[string]limiter.Limit{"o": {Rate: limiter.Rate{Limit: 3, Window: time.Minute}, Shadow: true}},
			},
		},
		{
			name:    "sliding_log min_interval is inherited by tiers",
			handler: `{"rate_limits":{"p":{"algorithm":"sliding_log","max_events":10,"window":"1m","min_interval":"2s","tiers":{"t":{"max_events":20}}}}}`,
			want: &limiter.Policy{Name: "p", Algorithm: limiter.SlidingLog,
				Limit: limiter.Limit{Rate: limiter.Rate{Limit: 10, Window: time.Minute, MinInterval: sec(2)}},
				Tiers: map[string]limiter.Limit{"t": {Rate: limiter.Rate{Limit: 20, Window: time.Minute, MinInterval: sec(2)}}},
			},
		},
		{
			name:    "concurrency has no window",
			handler: `{"rate_limits":{"p":{"algorithm":"concurrency","max_events":4,"tiers":{"pro":{"max_events":16}}}}}`,
			want: &limiter.Policy{Name: "p", Algorithm: limiter.Concurrency,
				Limit: limiter.Limit{Rate: limiter.Rate{Limit: 4}},
				Tiers: map[string]limiter.Limit{"pro": {Rate: limiter.Rate{Limit: 16}}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := policyNamed(t, jsonHandler(t, tt.handler), "p")
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// policyNamed validates h and returns its policy name.
func policyNamed(t *testing.T, h *Handler, name string) *limiter.Policy {
	t.Helper()
	policies, err := h.Validate()
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	for _, p := range policies {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no policy %s", name)
	return nil
}

// TestPolicyLease: the handler's lease is every policy's default, a
// policy's own lease (0 included) wins, and algorithms that cannot lease
// never get one.
func TestPolicyLease(t *testing.T) {
	var h Handler
	if err := json.Unmarshal([]byte(`{"lease":{"max_tokens":10,"ttl":"2s"},"rate_limits":{
		"inherits":{"algorithm":"sliding_window","max_events":5,"window":"1s"},
		"own":{"algorithm":"gcra","max_events":5,"window":"1s","lease":{"max_tokens":3}},
		"off":{"algorithm":"fixed_window","max_events":5,"window":"1s","lease":{"max_tokens":0}},
		"log":{"algorithm":"sliding_log","max_events":5,"window":"1s"},
		"conc":{"algorithm":"concurrency","max_events":5}}}`), &h); err != nil {
		t.Fatal(err)
	}
	want := map[string]limiter.Lease{
		"inherits": {Max: 10, TTL: 2 * time.Second},
		"own":      {Max: 3},
		"off":      {},
		"log":      {},
		"conc":     {},
	}
	for name, lease := range want {
		if p := policyNamed(t, &h, name); p.Lease != lease {
			t.Errorf("%s: lease %+v, want %+v", name, p.Lease, lease)
		}
	}
}
