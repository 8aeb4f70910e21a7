package config

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// UnmarshalCaddyfile implements caddyfile.Unmarshaler. Syntax (every
// mholt/caddy-ratelimit config is valid and means the same):
//
//	rate_limit [<matcher>] {
//		redis [<host:port>...] {
//			address <host:port>...
//			cluster
//			sentinel <master_name>
//			username <user>
//			password <password>
//			db <n>
//			tls [insecure_skip_verify] [{
//				ca <file>
//				cert <file>
//				key <file>
//				server_name <name>
//				insecure_skip_verify
//			}]
//			pool_size <n>
//			timeout <duration>
//			key_prefix <string>
//			breaker_failures <n>
//			breaker_cooldown <duration>
//			functions on|off        # default on: FCALL of a function library where the server allows it, else EVALSHA
//		}
//		tenant <placeholder-template>
//		tier <placeholder-template>
//		tenant_tier <tenant> <tier>
//		missing_tenant shared|deny
//		lease <max_tokens> [<ttl>]
//		shadow
//		fail open|closed|local
//		headers both|ietf|legacy|off
//		jitter <fraction>
//		denials_stream [<maxlen>]
//		metrics_tenants <n>
//		near_limit <fraction>
//		log_key
//		sweep_interval <duration>
//		max_memory <size>
//		disable_metrics
//		distributed [{ read_interval <d>  write_interval <d>  purge_age <d> }]
//		storage <module...>
//		history off | history <minute_retention> <hour_retention>
//		notify { url <url>; secret <value>; events ...; allow_private; allow_private_tenants; timeout <d> }
//		protect { min <n>; max <n>; target_wait <d>; weight <tier> <n>; priority <placeholder>; ... }
//
//		policy <name> {            # alias: zone
//			match { <matchers> }
//			key <placeholder-template>
//			algorithm token_bucket|gcra|sliding_window|fixed_window|sliding_log|concurrency
//			limit <n>              # alias: events
//			window <duration>
//			calendar day|week|month [<IANA zone>]   # fixed_window, instead of window
//			burst <n>
//			delay <max_wait>       # token_bucket, gcra: wait for a turn instead of a 429
//			cost <n|placeholder>
//			cost_after header <Name> | cost_after json <path>[+<path>...]
//			min_interval <duration>
//			count_status <code|class>...   # keep the units only for these statuses
//			refund_status <code|class>...  # give the units back for these statuses
//			penalty <duration> [after <n>] # n denials in a window: refused for <duration>
//			tier <tier> <limit> [<window> | calendar <period> [<zone>]] [burst <n>] [delay <max_wait>] [shadow] | tier <tier> unlimited
//			tenant_limit <tenant> <limit> [<window> | calendar <period> [<zone>]] [burst <n>] [delay <max_wait>] [shadow] | tenant_limit <tenant> unlimited
//			                       # older spelling: override
//			lease <max_tokens> [<ttl>]
//			shadow
//			near_limit <fraction>
//			fail open|closed|local
//			ipv4_prefix <bits>
//			ipv6_prefix <bits>
//		}
//	}
//
// Valued subdirectives may be given once per block; flags, `match`,
// `tenant_tier`, `tier`, `tenant_limit`, `address` and `policy` repeat. The
// parser checks syntax; the configuration rules are validate.go's, run on
// what was read, and every error names the file and line at fault. A
// `zone` block is written as caddy-ratelimit writes it, so it means what it
// meant there; a `policy` block also gets Tollgate's defaults written out
// (writePolicyDefaults).
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive name
	rec := &cfRecord{directive: d.Token()}
	if d.NextArg() {
		return d.Errf("unexpected argument %q: rate_limit takes only a request matcher on its line, and its configuration in a block", d.Val())
	}
	p := cfParser{d: d, rec: rec} // Caddy prefixes errors with the directive name
	if err := parseBlock(p, handlerBlock, h); err != nil {
		return err
	}
	h.writePolicyDefaults(rec.policyBlocks)
	if _, err := h.Validate(); err != nil {
		var fe *fieldError
		if errors.As(err, &fe) {
			return rec.fieldErr(fe)
		}
		return err
	}
	return nil
}

// writePolicyDefaults writes Tollgate's defaults into the policies read
// from `policy` blocks (names): a policy block means what it always meant,
// while a JSON policy that leaves them out means what a caddy-ratelimit
// zone means (see PolicyConfig). Only fields the block left out are
// written: the sliding_window algorithm (fixed_window for a calendar
// quota, the only one that counts per period), one bucket per client IP
// when the handler has no tenant, and all-or-nothing charging.
func (h *Handler) writePolicyDefaults(names []string) {
	for _, name := range names {
		pc := h.RateLimits[name]
		switch {
		case pc.Algorithm != "":
		case pc.Calendar != nil:
			pc.Algorithm = limiter.FixedWindow.String()
		default:
			pc.Algorithm = limiter.SlidingWindow.String()
		}
		if pc.Key == "" && h.Tenant == "" {
			pc.Key = DefaultKey
		}
		pc.AllOrNothing = true
	}
}

// handlerBlock lists the subdirectives of `rate_limit`, in the order the
// docs show them.
var handlerBlock = block[*Handler]{
	{name: "redis", usage: "redis [<host:port>...] { ... }", parse: parseRedis},
	{name: "tenant", usage: "tenant <placeholder-template>", field: "tenant", parse: func(p cfParser, h *Handler) (err error) {
		h.Tenant, err = p.word()
		return err
	}},
	{name: "tier", usage: "tier <placeholder-template>", field: "tier", parse: func(p cfParser, h *Handler) (err error) {
		h.Tier, err = p.word()
		return err
	}},
	{name: "tenant_tier", usage: "tenant_tier <tenant> <tier>", repeatable: true, parse: parseTenantTier},
	{name: "missing_tenant", usage: "missing_tenant " + strings.Join(missingTenantValues, "|"), field: "missing_tenant", parse: func(p cfParser, h *Handler) (err error) {
		h.MissingTenant, err = p.word()
		return err
	}},
	{name: "lease", usage: "lease <max_tokens> [<ttl>]", parse: func(p cfParser, h *Handler) (err error) {
		h.Lease, err = p.lease()
		return err
	}},
	{name: "shadow", usage: "shadow", repeatable: true, field: "shadow", parse: func(p cfParser, h *Handler) error {
		h.Shadow = true
		return p.flag()
	}},
	{name: "fail", usage: "fail " + strings.Join(failModeValues, "|"), field: "fail_mode", parse: func(p cfParser, h *Handler) (err error) {
		h.FailMode, err = p.word()
		return err
	}},
	{name: "headers", usage: "headers " + strings.Join(headersValues, "|"), field: "headers", parse: func(p cfParser, h *Handler) (err error) {
		h.Headers, err = p.word()
		return err
	}},
	{name: "jitter", usage: "jitter <fraction>", field: "jitter", parse: parseJitter},
	{name: "denials_stream", usage: "denials_stream [<maxlen>]", field: "denials_stream", parse: parseDenialsStream},
	{name: "metrics_tenants", usage: "metrics_tenants <n>", field: "metrics_tenants", parse: func(p cfParser, h *Handler) (err error) {
		h.MetricsTenants, err = p.intArg(fmt.Sprintf("an integer from 0 to %d", maxMetricsTenants))
		return err
	}},
	{name: "near_limit", usage: "near_limit <fraction>", field: "near_limit", parse: func(p cfParser, h *Handler) (err error) {
		h.NearLimit, err = p.nearLimit()
		return err
	}},
	{name: "drain", usage: "drain off | drain { timeout <duration> max_bytes <size> max_concurrent <n> }", field: "drain", parse: parseDrain},
	{name: "history", usage: historyForm, field: "history", parse: parseHistory},
	{name: "notify", usage: notifyForm, parse: func(p cfParser, h *Handler) (err error) {
		h.Notify, err = p.notify()
		return err
	}},
	{name: "protect", usage: protectForm, parse: parseProtect},
	{name: "log_key", usage: "log_key", repeatable: true, field: "log_key", parse: func(p cfParser, h *Handler) error {
		h.LogKey = true
		return p.flag()
	}},
	{name: "policy", aliases: []string{"zone"}, usage: "policy <name> { ... }", repeatable: true, parse: parsePolicy},
	{name: "sweep_interval", usage: "sweep_interval <duration>", field: "sweep_interval", parse: func(p cfParser, h *Handler) (err error) {
		h.SweepInterval, err = p.durationArg()
		return err
	}},
	{name: "max_memory", usage: "max_memory <size>", field: "max_memory", parse: func(p cfParser, h *Handler) (err error) {
		h.MaxMemory, err = p.sizeArg()
		return err
	}},
	{name: "disable_metrics", usage: "disable_metrics", repeatable: true, field: "disable_metrics", parse: func(p cfParser, h *Handler) error {
		h.DisableMetrics = true
		return p.flag()
	}},
	{name: "distributed", usage: "distributed [{ read_interval <duration> write_interval <duration> purge_age <duration> }]", field: "distributed", parse: parseDistributed},
	{name: "storage", usage: "storage <module...>", field: "storage", parse: parseStorage},
}

// policyBlock lists the subdirectives of `policy <name> { ... }`.
var policyBlock = block[*policyState]{
	{name: "match", usage: "match { <matchers> }", repeatable: true, field: "match", parse: parseMatch},
	{name: "key", usage: "key <placeholder-template>", field: "key", parse: func(p cfParser, ps *policyState) (err error) {
		ps.pc.Key, err = p.word()
		return err
	}},
	{name: "algorithm", usage: "algorithm " + strings.ReplaceAll(limiter.AlgorithmNames, ", ", "|"), field: "algorithm", parse: func(p cfParser, ps *policyState) (err error) {
		ps.pc.Algorithm, err = p.word()
		return err
	}},
	{name: "limit", aliases: []string{"events"}, usage: "limit <n>", field: "max_events", parse: func(p cfParser, ps *policyState) (err error) {
		ps.pc.MaxEvents, err = p.int64Arg(countRange(1))
		return err
	}},
	{name: "window", usage: "window <duration>", field: "window", parse: func(p cfParser, ps *policyState) (err error) {
		ps.pc.Window, err = p.durationArg()
		return err
	}},
	{name: "calendar", usage: "calendar day|week|month [<IANA zone>]", field: "calendar", parse: func(p cfParser, ps *policyState) (err error) {
		ps.pc.Calendar, err = p.calendar()
		return err
	}},
	{name: "burst", usage: "burst <n>", field: "burst", parse: func(p cfParser, ps *policyState) (err error) {
		ps.pc.Burst, err = p.int64Arg(countRange(1))
		return err
	}},
	{name: "delay", usage: "delay <max_wait>", field: "delay", parse: func(p cfParser, ps *policyState) (err error) {
		ps.pc.Delay, err = p.durationArg()
		return err
	}},
	{name: "cost", usage: "cost <n|placeholder>", field: "cost", parse: func(p cfParser, ps *policyState) error {
		s, err := p.word()
		ps.pc.Cost = Cost(s)
		return err
	}},
	{name: "cost_after", usage: costAfterForms, field: "cost_after", parse: func(p cfParser, ps *policyState) (err error) {
		ps.pc.CostAfter, err = p.costAfter()
		return err
	}},
	{name: "cost_before", usage: costBeforeForm, field: "cost_before", parse: func(p cfParser, ps *policyState) (err error) {
		ps.pc.CostBeforeConfig, err = p.costBefore()
		return err
	}},
	{name: "price", usage: priceForm, repeatable: true, field: "prices", parse: func(p cfParser, ps *policyState) error {
		pc, err := p.price()
		ps.pc.Prices = append(ps.pc.Prices, pc)
		return err
	}},
	{name: "cost_missing", usage: "cost_missing <n>|estimate", field: "cost_missing", parse: func(p cfParser, ps *policyState) error {
		s, err := p.word()
		ps.pc.CostMissing = Cost(s)
		return err
	}},
	{name: "count_status", usage: "count_status <code|class>...", field: "count_status", parse: func(p cfParser, ps *policyState) (err error) {
		ps.pc.CountStatus, err = p.statuses()
		return err
	}},
	{name: "refund_status", usage: "refund_status <code|class>...", field: "refund_status", parse: func(p cfParser, ps *policyState) (err error) {
		ps.pc.RefundStatus, err = p.statuses()
		return err
	}},
	{name: "penalty", usage: penaltyForm, parse: func(p cfParser, ps *policyState) (err error) {
		ps.pc.Penalty, err = p.penalty()
		return err
	}},
	{name: "notify", usage: notifyForm, parse: func(p cfParser, ps *policyState) (err error) {
		ps.pc.Notify, err = p.notify()
		return err
	}},
	{name: "min_interval", usage: "min_interval <duration>", field: "min_interval", parse: func(p cfParser, ps *policyState) (err error) {
		ps.pc.MinInterval, err = p.durationArg()
		return err
	}},
	{name: "tier", usage: "tier <tier> <limit> [<window> | calendar <period> [<zone>]] [burst <n>] [delay <max_wait>] [shadow] | tier <tier> unlimited", repeatable: true, parse: func(p cfParser, ps *policyState) error {
		return ps.parseLimitRule(p, "tiers", &ps.pc.Tiers)
	}},
	{name: "tenant_limit", usage: "tenant_limit <tenant> <limit> [<window> | calendar <period> [<zone>]] [burst <n>] [delay <max_wait>] [shadow] | tenant_limit <tenant> unlimited", repeatable: true, parse: func(p cfParser, ps *policyState) error {
		return ps.parseLimitRule(p, "tenant_limits", &ps.pc.TenantLimits)
	}},
	{name: "override", usage: "override <tenant> <limit> [<window> | calendar <period> [<zone>]] [burst <n>] [delay <max_wait>] [shadow] | override <tenant> unlimited (older spelling of tenant_limit)", repeatable: true, parse: func(p cfParser, ps *policyState) error {
		return ps.parseLimitRule(p, "overrides", &ps.pc.Overrides)
	}},
	{name: "lease", usage: "lease <max_tokens> [<ttl>]", parse: func(p cfParser, ps *policyState) (err error) {
		ps.pc.Lease, err = p.lease()
		return err
	}},
	{name: "shadow", usage: "shadow", repeatable: true, field: "shadow", parse: func(p cfParser, ps *policyState) error {
		ps.pc.Shadow = true
		return p.flag()
	}},
	{name: "near_limit", usage: "near_limit <fraction>", field: "near_limit", parse: func(p cfParser, ps *policyState) (err error) {
		ps.pc.NearLimit, err = p.nearLimit()
		return err
	}},
	{name: "fail", usage: "fail " + strings.Join(failModeValues, "|"), field: "fail_mode", parse: func(p cfParser, ps *policyState) (err error) {
		ps.pc.FailMode, err = p.word()
		return err
	}},
	{name: "ipv4_prefix", usage: "ipv4_prefix <bits>", field: "ipv4_prefix", parse: func(p cfParser, ps *policyState) (err error) {
		ps.pc.IPv4Prefix, err = p.intArg("an integer from 0 to 32")
		return err
	}},
	{name: "ipv6_prefix", usage: "ipv6_prefix <bits>", field: "ipv6_prefix", parse: func(p cfParser, ps *policyState) (err error) {
		ps.pc.IPv6Prefix, err = p.intArg("an integer from 0 to 128")
		return err
	}},
}

// redisBlock lists the subdirectives of `redis { ... }`.
var redisBlock = block[*RedisConfig]{
	{name: "address", usage: "address <host:port>...", repeatable: true, parse: func(p cfParser, rc *RedisConfig) error {
		addrs, err := p.args(1, -1)
		if err != nil {
			return err
		}
		p.addAddresses(rc, addrs, p.label("address"))
		return nil
	}},
	{name: "cluster", usage: "cluster", repeatable: true, field: "cluster", parse: func(p cfParser, rc *RedisConfig) error {
		rc.Cluster = true
		return p.flag()
	}},
	{name: "sentinel", usage: "sentinel <master_name>", field: "sentinel_master", parse: func(p cfParser, rc *RedisConfig) (err error) {
		rc.SentinelMaster, err = p.word()
		return err
	}},
	{name: "username", usage: "username <user>", field: "username", parse: func(p cfParser, rc *RedisConfig) (err error) {
		rc.Username, err = p.word()
		return err
	}},
	{name: "password", usage: "password <password>", field: "password", parse: func(p cfParser, rc *RedisConfig) (err error) {
		rc.Password, err = p.word()
		return err
	}},
	{name: "db", usage: "db <n>", field: "db", parse: func(p cfParser, rc *RedisConfig) (err error) {
		rc.DB, err = p.intArg("a non-negative integer")
		return err
	}},
	{name: "tls", usage: "tls [insecure_skip_verify] [{ ca <file> cert <file> key <file> server_name <name> insecure_skip_verify }]", field: "tls", parse: parseRedisTLS},
	{name: "pool_size", usage: "pool_size <n>", field: "pool_size", parse: func(p cfParser, rc *RedisConfig) (err error) {
		rc.PoolSize, err = p.intArg("a positive integer")
		return err
	}},
	{name: "timeout", usage: "timeout <duration>", field: "timeout", parse: func(p cfParser, rc *RedisConfig) (err error) {
		rc.Timeout, err = p.durationArg()
		return err
	}},
	{name: "key_prefix", usage: "key_prefix <string>", field: "key_prefix", parse: func(p cfParser, rc *RedisConfig) (err error) {
		rc.KeyPrefix, err = p.word()
		return err
	}},
	{name: "breaker_failures", usage: "breaker_failures <n>", field: "breaker_failures", parse: func(p cfParser, rc *RedisConfig) (err error) {
		rc.BreakerFailures, err = p.intArg("a positive integer")
		return err
	}},
	{name: "breaker_cooldown", usage: "breaker_cooldown <duration>", field: "breaker_cooldown", parse: func(p cfParser, rc *RedisConfig) (err error) {
		rc.BreakerCooldown, err = p.durationArg()
		return err
	}},
	{name: "functions", usage: "functions [on|off]", field: "functions", parse: func(p cfParser, rc *RedisConfig) error {
		args, err := p.args(0, 1)
		if err != nil {
			return err
		}
		on := len(args) == 0 || args[0] == "on"
		if len(args) == 1 && args[0] != "on" && args[0] != "off" {
			return p.dirErr("%q: want on or off (default on: functions where the server allows them, else EVALSHA)", args[0])
		}
		rc.Functions = &on
		return nil
	}},
}

// tlsBlock lists the subdirectives of the redis `tls { ... }` block.
var tlsBlock = block[*RedisTLSConfig]{
	{name: "ca", usage: "ca <file>", field: "ca", parse: func(p cfParser, t *RedisTLSConfig) (err error) {
		t.CA, err = p.word()
		return err
	}},
	{name: "cert", usage: "cert <file>", field: "cert", parse: func(p cfParser, t *RedisTLSConfig) (err error) {
		t.Cert, err = p.word()
		return err
	}},
	{name: "key", usage: "key <file>", field: "key", parse: func(p cfParser, t *RedisTLSConfig) (err error) {
		t.Key, err = p.word()
		return err
	}},
	{name: "server_name", usage: "server_name <name>", field: "server_name", parse: func(p cfParser, t *RedisTLSConfig) (err error) {
		t.ServerName, err = p.word()
		return err
	}},
	{name: "insecure_skip_verify", usage: "insecure_skip_verify", repeatable: true, field: "insecure_skip_verify", parse: func(p cfParser, t *RedisTLSConfig) error {
		t.InsecureSkipVerify = true
		return p.flag()
	}},
}

// distributedBlock lists the subdirectives of `distributed { ... }`.
var distributedBlock = block[*DistributedConfig]{
	{name: "read_interval", usage: "read_interval <duration>", field: "read_interval", parse: func(p cfParser, c *DistributedConfig) (err error) {
		c.ReadInterval, err = p.durationArg()
		return err
	}},
	{name: "write_interval", usage: "write_interval <duration>", field: "write_interval", parse: func(p cfParser, c *DistributedConfig) (err error) {
		c.WriteInterval, err = p.durationArg()
		return err
	}},
	{name: "purge_age", usage: "purge_age <duration>", field: "purge_age", parse: func(p cfParser, c *DistributedConfig) (err error) {
		c.PurgeAge, err = p.durationArg()
		return err
	}},
}

// --- handler-level subdirectives ------------------------------------------

func parseTenantTier(p cfParser, h *Handler) error {
	args, err := p.args(2, 2)
	if err != nil {
		return err
	}
	tenant, tier := args[0], args[1]
	if prev, dup := h.TenantTiers[tenant]; dup {
		return p.dirErr("tenant %q is already mapped to tier %q", tenant, prev)
	}
	p.record([]string{"tenant_tiers", tenant}, p.label(p.dir))
	if h.TenantTiers == nil {
		h.TenantTiers = make(map[string]string)
	}
	h.TenantTiers[tenant] = tier
	return nil
}

func parseJitter(p cfParser, h *Handler) error {
	s, err := p.word()
	if err != nil {
		return err
	}
	j, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return p.dirErr("%q is not a number (want a fraction, e.g. 0.2 for up to 20%% extra)", s)
	}
	h.Jitter = j
	return nil
}

// DefaultDenialsStream is the stream length of a bare `denials_stream`.
const DefaultDenialsStream = 10000

func parseDenialsStream(p cfParser, h *Handler) error {
	args, err := p.args(0, 1)
	if err != nil {
		return err
	}
	if len(args) == 0 {
		h.DenialsStream = DefaultDenialsStream
		return nil
	}
	n, err := p.parseInt(args[0], "a positive integer")
	if err == nil && (n < 1 || n > math.MaxInt32) {
		err = p.dirErr("%d is out of range (want an integer from 1 to %d)", n, math.MaxInt32)
	}
	h.DenialsStream = int(n)
	return err
}

func parseDistributed(p cfParser, h *Handler) error {
	if _, err := p.lineArgs(0, 0); err != nil {
		return err
	}
	c := new(DistributedConfig)
	if err := parseBlock(p.nested("distributed", []string{"distributed"}), distributedBlock, c); err != nil {
		return err
	}
	h.Distributed = c
	return nil
}

func parseStorage(p cfParser, h *Handler) error {
	if !p.d.NextArg() {
		return p.dirErr("missing storage module name; usage: %s", p.usage)
	}
	modID := "caddy.storage." + p.d.Val()
	unm, err := caddyfile.UnmarshalModule(p.d, modID)
	if err != nil {
		return p.wrap(err)
	}
	storage, ok := unm.(caddy.StorageConverter)
	if !ok {
		return p.dirErr("module %s is not a storage module", modID)
	}
	h.StorageRaw = caddyconfig.JSONModuleObject(storage, "module", storage.(caddy.Module).CaddyModule().ID.Name(), nil)
	return nil
}

// wrap prefixes an error from Caddy's own parsers (matchers, storage
// modules) with the scope. Those errors normally already carry a location;
// when one does not, the current line is added.
func (p cfParser) wrap(err error) error {
	if !strings.Contains(err.Error(), ", at ") {
		return p.dirErr("%v", err)
	}
	if p.scope != "" {
		return fmt.Errorf("%s: %s: %w", p.scope, p.dir, err)
	}
	return fmt.Errorf("%s: %w", p.dir, err)
}

// --- redis -----------------------------------------------------------------

func parseRedis(p cfParser, h *Handler) error {
	p.record([]string{"redis"}, "redis")
	addrs, err := p.lineArgs(0, -1)
	if err != nil {
		return err
	}
	rc := new(RedisConfig)
	p.addAddresses(rc, addrs, "redis")
	if err := parseBlock(p.nested("redis", []string{"redis"}), redisBlock, rc); err != nil {
		return err
	}
	h.Redis = rc
	return nil
}

// addAddresses appends addrs, each recorded at the current line as label.
func (p cfParser) addAddresses(rc *RedisConfig, addrs []string, label string) {
	for _, a := range addrs {
		p.record([]string{"redis", "addresses[" + strconv.Itoa(len(rc.Addresses)) + "]"}, label)
		rc.Addresses = append(rc.Addresses, a)
	}
}

func parseRedisTLS(p cfParser, rc *RedisConfig) error {
	args, err := p.lineArgs(0, 1)
	if err != nil {
		return err
	}
	t := new(RedisTLSConfig)
	if len(args) == 1 {
		if args[0] != "insecure_skip_verify" {
			return p.dirErr("unknown argument %q (allowed: insecure_skip_verify)", args[0])
		}
		t.InsecureSkipVerify = true
	}
	if err := parseBlock(p.nested("redis: tls", []string{"redis", "tls"}), tlsBlock, t); err != nil {
		return err
	}
	rc.TLS = t
	return nil
}

// --- policies --------------------------------------------------------------

// policyState is a policy being read.
type policyState struct {
	name string
	pc   *PolicyConfig
	// limitRules are the tier and tenant_limit names seen, by kind, for
	// duplicate lines.
	limitRules map[string]int
}

func parsePolicy(p cfParser, h *Handler) error {
	args, err := p.lineArgs(1, 1)
	if err != nil {
		return err
	}
	name := args[0]
	if _, dup := h.RateLimits[name]; dup {
		return p.dirErr("duplicate policy name %q: each policy needs its own name", name)
	}
	path := []string{"rate_limits", name}
	scope := p.dir + " " + name
	p.record(path, scope)
	if p.dir == "policy" {
		p.rec.policyBlocks = append(p.rec.policyBlocks, name)
	}
	ps := &policyState{name: name, pc: new(PolicyConfig), limitRules: map[string]int{}}
	if err := parseBlock(p.nested(scope, path), policyBlock, ps); err != nil {
		return err
	}
	if h.RateLimits == nil {
		h.RateLimits = make(map[string]*PolicyConfig)
	}
	h.RateLimits[name] = ps.pc
	return nil
}

func parseMatch(p cfParser, ps *policyState) error {
	// Caddy's parser reports an unknown matcher at the end of the block;
	// check the names first so the error names the matcher's own line.
	seg := p.d.NewFromNextSegment()
	var toks []caddyfile.Token
	for seg.Next() {
		toks = append(toks, seg.Token())
	}
	names := caddyfile.NewDispenser(toks)
	names.Next() // "match"
	for nesting := names.Nesting(); names.NextArg() || names.NextBlock(nesting); {
		if names.Token().Quoted() {
			continue // a CEL expression
		}
		if _, err := caddy.GetModule("http.matchers." + names.Val()); err != nil {
			at := cfParser{d: names, scope: p.scope, dir: p.dir}
			return at.dirErr("unknown matcher %q (no module http.matchers.%s; see https://caddyserver.com/docs/caddyfile/matchers)", names.Val(), names.Val())
		}
		names.NextSegment()
	}
	d := caddyfile.NewDispenser(toks)
	d.Next()
	set, err := caddyhttp.ParseCaddyfileNestedMatcherSet(d)
	if err != nil {
		return p.wrap(err)
	}
	if len(set) > 0 {
		ps.pc.MatcherSetsRaw = append(ps.pc.MatcherSetsRaw, set)
	}
	return nil
}

// parseLimitRule reads a `tier` or `tenant_limit` (`override`) line into
// m, the JSON field field:
//
//	<name> <limit> [<window> | calendar <period> [<zone>]] [burst <n>] [delay <max_wait>] [shadow]
//	<name> unlimited
func (ps *policyState) parseLimitRule(p cfParser, field string, m *map[string]*LimitConfig) error {
	args, err := p.args(2, 10)
	if err != nil {
		return err
	}
	name := args[0]
	if line, dup := ps.limitRules[p.dir+"\x00"+name]; dup {
		return p.dirErr("%q already specified at line %d", name, line)
	}
	ps.limitRules[p.dir+"\x00"+name] = p.d.Line()
	path := sub(p.path, field, name)
	label := p.label(p.dir + " " + name)
	p.record(path, label)
	p.record(sub(path, "max_events"), label)
	p.record(sub(path, "window"), label+": window")
	p.record(sub(path, "burst"), label+": burst")
	p.record(sub(path, "delay"), label+": delay")
	p.record(sub(path, "calendar"), label+": calendar")
	lc := new(LimitConfig)
	if args[1] == "unlimited" {
		if len(args) > 2 {
			return p.dirErr("nothing may follow unlimited; usage: %s", p.usage)
		}
		lc.Unlimited = true
	} else {
		if lc.MaxEvents, err = p.parseInt(args[1], countRange(1)+", or unlimited"); err != nil {
			return err
		}
		if err := p.limitOptions(lc, args[2:]); err != nil {
			return err
		}
	}
	if *m == nil {
		*m = make(map[string]*LimitConfig)
	}
	(*m)[name] = lc
	return nil
}

// limitOptions reads the optional `[<window> | calendar <period> [<zone>]]
// [burst <n>] [delay <max_wait>] [shadow]` part of a tier or tenant_limit
// line, in any order.
func (p cfParser) limitOptions(lc *LimitConfig, opts []string) error {
	var window, burst, delay, shadow bool
	for i := 0; i < len(opts); i++ {
		var err error
		switch opt := opts[i]; {
		case opt == "calendar":
			if lc.Calendar != nil || i+1 == len(opts) {
				return p.dirErr("calendar must be given once, with a period (day, week or month) and an optional zone; usage: %s", p.usage)
			}
			i++
			lc.Calendar = &CalendarConfig{Period: opts[i]}
			if i+1 < len(opts) && isZoneWord(opts[i+1]) {
				i++
				lc.Calendar.Zone = opts[i]
			}
		case opt == "burst":
			if burst || i+1 == len(opts) {
				return p.dirErr("burst must be given once, with a value; usage: %s", p.usage)
			}
			i++
			lc.Burst, err = p.parseInt(opts[i], countRange(1))
			burst = true
		case opt == "delay":
			if delay || i+1 == len(opts) {
				return p.dirErr("delay must be given once, with a duration; usage: %s", p.usage)
			}
			i++
			lc.Delay, err = p.parseDuration(opts[i])
			delay = true
		case opt == "shadow":
			if shadow {
				return p.dirErr("shadow given twice; usage: %s", p.usage)
			}
			lc.Shadow, shadow = true, true
		case window:
			return p.dirErr("unexpected %q; usage: %s", opt, p.usage)
		default:
			lc.Window, err = p.parseDuration(opt)
			window = true
		}
		if err != nil {
			return err
		}
	}
	return nil
}
