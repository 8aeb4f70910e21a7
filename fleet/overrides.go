package fleet

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// Override is a runtime override: a limit set at runtime (through Caddy's
// admin API) for one (tenant, policy). It wins over every limit of the
// config. Its JSON form is the admin API's and the one stored in Redis:
// window a duration, expires an RFC 3339 time.
type Override struct {
	Tenant    string        `json:"tenant"`
	Policy    string        `json:"policy"`
	MaxEvents int64         `json:"max_events,omitempty"`
	Window    time.Duration `json:"-"`
	Burst     int64         `json:"burst,omitempty"`
	Unlimited bool          `json:"unlimited,omitempty"`
	Shadow    bool          `json:"shadow,omitempty"`
	// NotifyURL is the tenant's own webhook for the policy's events
	// (notify); an override with only a NotifyURL keeps the tenant's
	// limits.
	NotifyURL string `json:"notify_url,omitempty"`
	// Expires is when the override stops applying; zero: never.
	Expires time.Time `json:"-"`
}

// overrideWire is the wire form of an Override, in the admin API and in
// Redis: window is a duration (a string, or nanoseconds on input), expires
// an RFC 3339 time (or, on input, a duration from now).
type overrideWire struct {
	Tenant    string       `json:"tenant"`
	Policy    string       `json:"policy"`
	MaxEvents int64        `json:"max_events,omitempty"`
	Window    flexDuration `json:"window,omitempty"`
	Burst     int64        `json:"burst,omitempty"`
	Unlimited bool         `json:"unlimited,omitempty"`
	Shadow    bool         `json:"shadow,omitempty"`
	NotifyURL string       `json:"notify_url,omitempty"`
	Expires   flexDuration `json:"expires,omitempty"`
}

func (o Override) MarshalJSON() ([]byte, error) {
	j := overrideWire{Tenant: o.Tenant, Policy: o.Policy, MaxEvents: o.MaxEvents, Burst: o.Burst, Unlimited: o.Unlimited, Shadow: o.Shadow, NotifyURL: o.NotifyURL}
	if o.Window > 0 {
		j.Window = flexDuration(o.Window.String())
	}
	if !o.Expires.IsZero() {
		j.Expires = flexDuration(o.Expires.UTC().Format(time.RFC3339Nano))
	}
	return json.Marshal(j)
}

func (o *Override) UnmarshalJSON(b []byte) error {
	var j overrideWire
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	parsed, err := j.parse(time.Now())
	if err != nil {
		return err
	}
	*o = parsed
	return nil
}

// flexDuration is a duration in JSON the way Caddy accepts them: a string
// ("90s", "1d") or a number of nanoseconds, kept as text.
type flexDuration string

// UnmarshalJSON accepts a JSON string or a number of nanoseconds.
func (f *flexDuration) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*f = flexDuration(s)
		return nil
	}
	var n int64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("want a duration such as \"90s\" or \"1d\", or a number of nanoseconds: %s", b)
	}
	*f = flexDuration(time.Duration(n).String())
	return nil
}

// DecodeOverride reads an override from the admin API's JSON, refusing
// unknown fields and values outside the numeric domain; an expires that is
// a duration counts from now. It does not check that the override suits
// its policy (see Override.Limit and limiter.Policy.ValidateLimit).
func DecodeOverride(body []byte, now time.Time) (Override, error) {
	var j overrideWire
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return Override{}, fmt.Errorf("malformed JSON: %w", err)
	}
	if j.Tenant == "" || j.Policy == "" {
		return Override{}, errors.New("tenant and policy are required")
	}
	return j.parse(now)
}

// parse checks the wire form; an expires that is a duration counts from now.
func (j overrideWire) parse(now time.Time) (Override, error) {
	o := Override{Tenant: j.Tenant, Policy: j.Policy, MaxEvents: j.MaxEvents, Burst: j.Burst, Unlimited: j.Unlimited, Shadow: j.Shadow, NotifyURL: j.NotifyURL}
	if o.NotifyURL != "" {
		u, err := url.Parse(o.NotifyURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return o, fmt.Errorf("notify_url: %q: want an http or https URL", o.NotifyURL)
		}
	}
	if !o.WebhookOnly() && (o.MaxEvents != 0 || !o.Unlimited) {
		if err := limiter.CheckCount(o.MaxEvents, 1); err != nil {
			return o, fmt.Errorf("max_events: %w", err)
		}
	}
	if err := limiter.CheckCount(o.Burst, 0); err != nil {
		return o, fmt.Errorf("burst: %w", err)
	}
	if j.Window != "" {
		d, err := parseDuration(string(j.Window))
		if err != nil {
			return o, fmt.Errorf("window: %q: want a duration such as 90s, 1m or 1d", j.Window)
		}
		if err := limiter.CheckWindow(d); err != nil {
			return o, fmt.Errorf("window: %w", err)
		}
		o.Window = d
	}
	if j.Expires != "" {
		if t, err := time.Parse(time.RFC3339, string(j.Expires)); err == nil {
			o.Expires = t
		} else if d, err := parseDuration(string(j.Expires)); err == nil && d > 0 {
			o.Expires = now.Add(d)
		} else {
			return o, fmt.Errorf("expires: %q: want an RFC 3339 time or a positive duration such as 2h or 1d", j.Expires)
		}
	}
	return o, nil
}

// Limit converts o into a limit of p: the window defaults to the
// policy's, min_interval and delay are the policy's, and it is shadow when
// it or the policy is. An override of a calendar policy keeps the calendar period
// (the admin API refuses a window for one; a window stored anyway is
// ignored).
func (o *Override) Limit(p *limiter.Policy) limiter.Limit {
	l := limiter.Limit{Unlimited: o.Unlimited, Shadow: o.Shadow || p.Limit.Shadow}
	if !o.Unlimited {
		l.Rate = limiter.Rate{Limit: o.MaxEvents, Window: o.Window, Burst: o.Burst, MinInterval: p.Limit.MinInterval, Delay: p.Limit.Delay}
		if l.Window == 0 || p.Limit.Calendar != nil {
			l.Window, l.Calendar = p.Limit.Window, p.Limit.Calendar
		}
	}
	return l
}

// WebhookOnly reports whether o sets only the tenant's webhook: no limit.
func (o *Override) WebhookOnly() bool {
	return o.NotifyURL != "" && o.MaxEvents == 0 && !o.Unlimited
}

// Expired reports whether o no longer applies at now.
func (o *Override) Expired(now time.Time) bool {
	return !o.Expires.IsZero() && !now.Before(o.Expires)
}

type overrideKey struct{ tenant, policy string }

// OverrideTable is the in-process view of runtime overrides. Reads
// (every request) are one atomic load and a map lookup; writes copy the
// map. It implements limiter.OverrideLookup.
type OverrideTable struct {
	mu sync.Mutex // serializes writers
	m  atomic.Pointer[map[overrideKey]Override]
	// gen counts local writes, so a reload that read Redis before a
	// local write does not put the old value back.
	gen atomic.Uint64
}

func NewOverrideTable() *OverrideTable {
	t := new(OverrideTable)
	m := map[overrideKey]Override{}
	t.m.Store(&m)
	return t
}

// Lookup implements limiter.OverrideLookup.
func (t *OverrideTable) Lookup(p *limiter.Policy, tenant string) (limiter.Limit, bool) {
	m := *t.m.Load()
	if len(m) == 0 {
		return limiter.Limit{}, false
	}
	o, ok := m[overrideKey{tenant, p.Name}]
	if !ok || o.WebhookOnly() || o.Expired(time.Now()) {
		return limiter.Limit{}, false
	}
	return o.Limit(p), true
}

// NotifyURL is the webhook of tenant's live override in p, "" for none.
func (t *OverrideTable) NotifyURL(p *limiter.Policy, tenant string) string {
	m := *t.m.Load()
	if len(m) == 0 {
		return ""
	}
	o, ok := m[overrideKey{tenant, p.Name}]
	if !ok || o.Expired(time.Now()) {
		return ""
	}
	return o.NotifyURL
}

// List returns the live overrides, of tenant only when it is not empty,
// sorted by tenant and policy.
func (t *OverrideTable) List(tenant string) []Override {
	now := time.Now()
	out := []Override{}
	for k, o := range *t.m.Load() {
		if (tenant == "" || k.tenant == tenant) && !o.Expired(now) {
			out = append(out, o)
		}
	}
	SortOverrides(out)
	return out
}

// SortOverrides sorts overrides by tenant, then policy.
func SortOverrides(s []Override) {
	slices.SortFunc(s, func(a, b Override) int {
		return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Policy, b.Policy))
	})
}

// Set stores o (or removes (tenant, policy) when o is nil) and returns
// the previous value and whether it was live.
func (t *OverrideTable) Set(tenant, policy string, o *Override) (old Override, had bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := *t.m.Load()
	k := overrideKey{tenant, policy}
	old, had = cur[k]
	next := maps.Clone(cur)
	if o == nil {
		delete(next, k)
	} else {
		next[k] = *o
	}
	t.m.Store(&next)
	t.gen.Add(1)
	return old, had && !old.Expired(time.Now())
}

// replace swaps in a whole new set of overrides (a reload from Redis
// that started at generation gen) and reports whether it did: it does
// nothing when a local write happened since, as the reload may predate it.
func (t *OverrideTable) replace(all []Override, gen uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.gen.Load() != gen {
		return false
	}
	next := make(map[overrideKey]Override, len(all))
	for _, o := range all {
		next[overrideKey{o.Tenant, o.Policy}] = o
	}
	t.m.Store(&next)
	return true
}

// OverrideSync keeps a Backend's OverrideTable in sync with Redis.
//
// Keys (prefix "rl" by default):
//
//   - <prefix>:ovr:{<tag>}: a hash per tenant with overrides (field =
//     policy, value = JSON), where <tag> is the tenant escaped as in
//     bucket keys (limiter.AppendEscaped).
//   - <prefix>:ovr-index: a set of the tags that have such a hash.
//   - <prefix>:ovr-version: a counter every change increments.
//
// (The index and the version are not named <prefix>:ovr:*: releases that
// found the hashes by SCAN MATCH <prefix>:ovr:* would read them as hashes,
// fail with WRONGTYPE and stop reloading during a rolling upgrade.)
//
// A change (store) writes the hash and the index first, then, once Redis
// has answered, increments the version and publishes the tenant on
// <prefix>:events; the commands are sent one after the other, never in
// one pipeline, so a Redis Cluster (where the keys live on different
// nodes) cannot apply the increment before the write.
//
// Every instance reloads on a message, when its pub/sub connection
// (re)subscribes (messages sent while it was disconnected are lost), at
// start, and when the version it polls every overrideRefresh differs from
// the one its table was loaded at. A reload reads the version first, then
// the index and every indexed hash, so a change that lands during the
// reload bumps the version past the one remembered and is read again at
// the next poll. No instance ever scans the keyspace.
//
// Redis cost of this background work, per instance: one GET of the
// version per second (plus the pub/sub connection's keep-alive PING every
// 3 s, and the registry's heartbeat call once a second, see
// limiter.Registry), whatever the size of the keyspace. A reload, only
// when something changed, costs one SMEMBERS and one HGETALL per tenant
// with overrides, in one pipelined round trip (per node in a Cluster),
// plus a few commands to drop the overrides found expired.
type OverrideSync struct {
	client  redis.UniversalClient
	prefix  string
	timeout time.Duration
	table   *OverrideTable
	logger  *zap.Logger
	cancel  context.CancelFunc
	done    chan struct{}
	// id is this instance's registry ID, and onReset is told about resets
	// that other instances published (see publishReset).
	id      string
	onReset func(tenant, policy string)
	// onNotice hears every other message first, and reports whether it
	// was its own (the penalty box's); onSubscribed runs at each
	// (re)subscription.
	onNotice     func(payload string) bool
	onSubscribed func(ctx context.Context)

	// State of the run goroutine: the version the table was loaded at
	// (loaded is false before the first load and after a load whose
	// result was dropped), and the failures since the last success.
	loaded   bool
	version  string
	failures int
	lastWarn time.Time
}

// overrideRefresh is how often an instance polls the version, the safety
// net for lost pub/sub messages.
const overrideRefresh = time.Second

// overrideWarnEvery throttles the WARN about failed reloads while Redis
// keeps failing.
const overrideWarnEvery = 10 * time.Second

// overrideSyncOptions configures newOverrideSync.
type overrideSyncOptions struct {
	client  redis.UniversalClient
	prefix  string
	timeout time.Duration
	logger  *zap.Logger
	// id is this instance's registry ID; onReset hears about resets that
	// other instances published (see publishReset).
	id      string
	onReset func(tenant, policy string)
	// onNotice and onSubscribed: see OverrideSync.
	onNotice     func(payload string) bool
	onSubscribed func(ctx context.Context)
}

func newOverrideSync(o overrideSyncOptions) *OverrideSync {
	ctx, cancel := context.WithCancel(context.Background())
	r := &OverrideSync{client: o.client, prefix: o.prefix, timeout: o.timeout, table: NewOverrideTable(), logger: o.logger,
		cancel: cancel, done: make(chan struct{}), id: o.id, onReset: o.onReset,
		onNotice: o.onNotice, onSubscribed: o.onSubscribed}
	go r.run(ctx)
	return r
}

// Table is the in-process view, read on every request.
func (r *OverrideSync) Table() *OverrideTable { return r.table }

func (r *OverrideSync) close() {
	r.cancel()
	<-r.done
}

func (r *OverrideSync) channel() string { return r.prefix + ":events" }

// indexKey is the set of the tags of tenants that have an override hash.
func (r *OverrideSync) indexKey() string { return r.prefix + ":ovr-index" }

// versionKey is the counter every override change increments.
func (r *OverrideSync) versionKey() string { return r.prefix + ":ovr-version" }

// overrideTag is tenant as it appears in keys, and in the index.
func overrideTag(tenant string) string { return string(limiter.AppendTenantTag(nil, tenant)) }

// tagKey is the override hash of the tenant whose tag is tag.
func (r *OverrideSync) tagKey(tag string) string { return r.prefix + ":ovr:{" + tag + "}" }

func (r *OverrideSync) run(ctx context.Context) {
	defer close(r.done)
	sub := r.client.Subscribe(ctx, r.channel())
	defer sub.Close()
	msgs := sub.ChannelWithSubscriptions()
	tick := time.NewTicker(overrideRefresh)
	defer tick.Stop()
	r.reload(ctx, nil)
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-msgs:
			if !ok {
				msgs = nil
				continue
			}
			// Take every message already queued, then reload once.
			reload := r.handle(ctx, m)
			for more := true; more; {
				select {
				case m, ok := <-msgs:
					if !ok {
						msgs, more = nil, false
						continue
					}
					reload = r.handle(ctx, m) || reload
				default:
					more = false
				}
			}
			if reload {
				r.reload(ctx, nil)
			}
		case <-tick.C:
			r.poll(ctx)
		}
	}
}

// handle acts on one pub/sub event and reports whether the table must be
// reloaded: after an override change, and after a (re)subscription, as
// the changes published while the connection was down are lost.
func (r *OverrideSync) handle(ctx context.Context, m any) bool {
	switch m := m.(type) {
	case *redis.Subscription:
		if m.Kind != "subscribe" {
			return false
		}
		if r.onSubscribed != nil {
			r.onSubscribed(ctx)
		}
		return true
	case *redis.Message:
		if r.onNotice != nil && r.onNotice(m.Payload) {
			return false
		}
		if id, tenant, policy, ok := parseResetNotice(m.Payload); ok {
			if id != r.id && r.onReset != nil {
				r.onReset(tenant, policy)
			}
			return false
		}
		return true
	}
	return false
}

// poll reads the version and reloads when it is not the one the table was
// loaded at.
func (r *OverrideSync) poll(ctx context.Context) {
	if !r.loaded {
		r.reload(ctx, nil)
		return
	}
	v, err := r.readVersion(ctx)
	if err != nil {
		r.failed(ctx, err)
		return
	}
	if v == r.version {
		r.succeeded()
		return
	}
	r.reload(ctx, &v)
}

func (r *OverrideSync) readVersion(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*r.timeout)
	defer cancel()
	v, err := r.client.Get(ctx, r.versionKey()).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return v, err
}

// reload replaces the table with what Redis holds. version, when set, was
// read just before (by poll). On error the table is kept.
func (r *OverrideSync) reload(ctx context.Context, version *string) {
	gen := r.table.gen.Load()
	v := ""
	if version != nil {
		v = *version
	} else {
		var err error
		if v, err = r.readVersion(ctx); err != nil {
			r.failed(ctx, err)
			return
		}
	}
	all, stale, err := r.readAll(ctx)
	if err != nil {
		r.failed(ctx, err)
		return
	}
	r.succeeded()
	// A local write since gen: the table is newer than what was read, and
	// the next poll reloads.
	r.loaded = r.table.replace(all, gen)
	r.version = v
	r.dropStale(ctx, stale)
}

// staleOverride is an override hash field found expired, or (field "") an
// indexed tenant whose hash is empty.
type staleOverride struct{ tag, field, value string }

// readAll reads the index, then every indexed hash in one pipeline. It
// returns the live overrides and what should be dropped from Redis.
func (r *OverrideSync) readAll(ctx context.Context) (all []Override, stale []staleOverride, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*r.timeout)
	defer cancel()
	tags, err := r.client.SMembers(ctx, r.indexKey()).Result()
	if err != nil || len(tags) == 0 {
		return nil, nil, err
	}
	pipe := r.client.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(tags))
	for i, tag := range tags {
		cmds[i] = pipe.HGetAll(ctx, r.tagKey(tag))
	}
	_, _ = pipe.Exec(ctx)
	now := time.Now()
	for i, cmd := range cmds {
		fields, err := cmd.Result()
		var rerr redis.Error
		if errors.As(err, &rerr) {
			// A key of another type under our name: skip it, do not let
			// it stop every reload.
			r.logger.Warn("runtime overrides: ignoring a key that is not a hash",
				zap.String("key", r.tagKey(tags[i])), zap.Error(err))
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		if len(fields) == 0 {
			stale = append(stale, staleOverride{tag: tags[i]})
			continue
		}
		for field, v := range fields {
			var o Override
			if json.Unmarshal([]byte(v), &o) != nil {
				continue
			}
			if o.Expired(now) {
				stale = append(stale, staleOverride{tags[i], field, v})
				continue
			}
			all = append(all, o)
		}
	}
	return all, stale, nil
}

// hdelIfScript deletes a hash field only if it still holds the value
// read, so dropping an expired override never deletes the one an admin
// has just put in its place.
var hdelIfScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
	return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0`)

// dropStale deletes expired overrides from Redis (any instance may) and
// takes tenants whose hash is empty out of the index. The other instances
// need not reload: they ignore expired overrides already.
func (r *OverrideSync) dropStale(ctx context.Context, stale []staleOverride) {
	if len(stale) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*r.timeout)
	defer cancel()
	for _, s := range stale {
		if s.field != "" {
			if err := hdelIfScript.Run(ctx, r.client, []string{r.tagKey(s.tag)}, s.field, s.value).Err(); err != nil {
				r.logger.Warn("runtime overrides: dropping an expired override", zap.String("key", r.tagKey(s.tag)), zap.Error(err))
				return
			}
		}
		readded, err := r.unindexIfEmpty(ctx, s.tag)
		if err == nil && readded {
			err = r.client.Incr(ctx, r.versionKey()).Err()
		}
		if err != nil {
			r.logger.Warn("runtime overrides: updating the index", zap.String("key", r.indexKey()), zap.Error(err))
			return
		}
	}
}

// unindexIfEmpty takes tag out of the index when its hash is empty. A
// setter writes the hash before it adds the tag, so checking the hash
// again after SREM and adding the tag back when it is not empty never
// leaves a hash with overrides out of the index, without a transaction
// (the two keys may live on different Cluster nodes). readded reports
// that the tag was put back: a reload elsewhere may have read the index
// without it meanwhile, so the caller must bump the version.
func (r *OverrideSync) unindexIfEmpty(ctx context.Context, tag string) (readded bool, err error) {
	key := r.tagKey(tag)
	if n, err := r.client.HLen(ctx, key).Result(); err != nil || n > 0 {
		return false, err
	}
	if err := r.client.SRem(ctx, r.indexKey(), tag).Err(); err != nil {
		return false, err
	}
	n, err := r.client.HLen(ctx, key).Result()
	if err != nil || n > 0 {
		// When in doubt put it back: an empty hash in the index costs
		// one HGETALL per reload, a hash missing from it is lost.
		if err2 := r.client.SAdd(ctx, r.indexKey(), tag).Err(); err == nil {
			err = err2
		}
		return true, err
	}
	return false, nil
}

// failed notes a failed poll or reload: a WARN at the first failure, then
// at most one per overrideWarnEvery while Redis keeps failing.
func (r *OverrideSync) failed(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return // shutting down
	}
	r.failures++
	if now := time.Now(); r.failures == 1 || now.Sub(r.lastWarn) >= overrideWarnEvery {
		r.lastWarn = now
		r.logger.Warn("runtime overrides: reading them from Redis failed; keeping the ones loaded, retrying every second",
			zap.Int("failures", r.failures), zap.Error(err))
	}
}

// succeeded notes a successful poll or reload: one INFO after failures.
func (r *OverrideSync) succeeded() {
	if r.failures > 0 {
		r.logger.Info("runtime overrides: reading them from Redis works again", zap.Int("failures", r.failures))
		r.failures = 0
	}
}

// Store writes (or deletes, o nil) the override in Redis, then bumps the
// version, publishes the change and appends it to the audit stream (remote
// names who asked). The local table is updated at once. It returns the
// previous override and whether it was live.
func (r *OverrideSync) Store(ctx context.Context, tenant, policy string, o *Override, remote string) (old Override, had bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*r.timeout)
	defer cancel()
	tag := overrideTag(tenant)
	key := r.tagKey(tag)
	prev, err := r.client.HGet(ctx, key, policy).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return old, false, err
	}
	if prev != "" && json.Unmarshal([]byte(prev), &old) == nil {
		had = !old.Expired(time.Now())
	}
	action := "delete"
	newJSON := ""
	if o == nil {
		if err := r.client.HDel(ctx, key, policy).Err(); err != nil {
			return old, had, err
		}
		// The version is bumped below in any case.
		if _, err := r.unindexIfEmpty(ctx, tag); err != nil {
			return old, had, err
		}
	} else {
		action = "set"
		b, _ := json.Marshal(o)
		newJSON = string(b)
		if err := r.client.HSet(ctx, key, policy, newJSON).Err(); err != nil {
			return old, had, err
		}
		// After the HSET's reply: see unindexIfEmpty.
		if err := r.client.SAdd(ctx, r.indexKey(), tag).Err(); err != nil {
			return old, had, err
		}
	}
	r.table.Set(tenant, policy, o)
	// After the writes' replies, so an instance that sees the new version
	// reads the new value.
	if err := r.client.Incr(ctx, r.versionKey()).Err(); err != nil {
		return old, had, fmt.Errorf("override stored, but the other instances may not see it until the next change (retry): incrementing %s: %w", r.versionKey(), err)
	}
	if err := r.client.Publish(ctx, r.channel(), tenant).Err(); err != nil {
		r.logger.Warn("publishing runtime override change", zap.Error(err))
	}
	r.audit(ctx, action, tenant, policy, prev, newJSON, remote)
	return old, had, nil
}

// auditMaxLen caps the audit stream (approximately).
const auditMaxLen = 10000

// audit appends one change to <prefix>:audit. A failure is logged: the
// change itself has been made.
func (r *OverrideSync) audit(ctx context.Context, action, tenant, policy, old, new, remote string) {
	err := r.client.XAdd(ctx, &redis.XAddArgs{
		Stream: r.prefix + ":audit",
		MaxLen: auditMaxLen,
		Approx: true,
		Values: []any{
			"ts", time.Now().UTC().Format(time.RFC3339Nano),
			"action", action, "tenant", tenant, "policy", policy,
			"old", old, "new", new, "remote", remote,
		},
	}).Err()
	if err != nil {
		r.logger.Warn("appending to the audit stream", zap.Error(err))
	}
}

// resetNotice starts the pub/sub message that tells the other instances
// a tenant was reset: "reset\x00<instance id>\x00<tenant>\x00<policy>".
// (Override changes publish the bare tenant.)
const resetNotice = "reset\x00"

// publishReset tells the other instances that tenant (policy, when set)
// was reset, so they drop their leases and cached denials of it.
func (r *OverrideSync) publishReset(ctx context.Context, tenant, policy string) {
	msg := resetNotice + r.id + "\x00" + tenant + "\x00" + policy
	if err := r.client.Publish(ctx, r.channel(), msg).Err(); err != nil {
		r.logger.Warn("publishing a reset to the other instances", zap.Error(err))
	}
}

// parseResetNotice reads a publishReset message. Policy names have no NUL
// byte, so the tenant is everything between the id and the last NUL.
func parseResetNotice(msg string) (id, tenant, policy string, ok bool) {
	rest, found := strings.CutPrefix(msg, resetNotice)
	if !found {
		return "", "", "", false
	}
	id, rest, found = strings.Cut(rest, "\x00")
	i := strings.LastIndexByte(rest, 0)
	if !found || i < 0 {
		return "", "", "", false
	}
	return id, rest[:i], rest[i+1:], true
}
