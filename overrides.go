package tollgate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// runtimeOverride is a limit set through the admin API for one (tenant,
// policy). It wins over every limit of the config.
type runtimeOverride struct {
	Tenant    string        `json:"tenant"`
	Policy    string        `json:"policy"`
	MaxEvents int64         `json:"max_events,omitempty"`
	Window    time.Duration `json:"-"`
	Burst     int64         `json:"burst,omitempty"`
	Unlimited bool          `json:"unlimited,omitempty"`
	Shadow    bool          `json:"shadow,omitempty"`
	// Expires is when the override stops applying; zero: never.
	Expires time.Time `json:"-"`
}

// overrideJSON is the wire form of a runtimeOverride, in the admin API
// and in Redis: window is a duration string, expires RFC 3339.
type overrideJSON struct {
	Tenant    string       `json:"tenant"`
	Policy    string       `json:"policy"`
	MaxEvents int64        `json:"max_events,omitempty"`
	Window    flexDuration `json:"window,omitempty"`
	Burst     int64        `json:"burst,omitempty"`
	Unlimited bool         `json:"unlimited,omitempty"`
	Shadow    bool         `json:"shadow,omitempty"`
	Expires   flexDuration `json:"expires,omitempty"`
}

func (o runtimeOverride) MarshalJSON() ([]byte, error) {
	j := overrideJSON{Tenant: o.Tenant, Policy: o.Policy, MaxEvents: o.MaxEvents, Burst: o.Burst, Unlimited: o.Unlimited, Shadow: o.Shadow}
	if o.Window > 0 {
		j.Window = flexDuration(o.Window.String())
	}
	if !o.Expires.IsZero() {
		j.Expires = flexDuration(o.Expires.UTC().Format(time.RFC3339Nano))
	}
	return json.Marshal(j)
}

func (o *runtimeOverride) UnmarshalJSON(b []byte) error {
	var j overrideJSON
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

// parse checks the wire form; an expires that is a duration counts from now.
func (j overrideJSON) parse(now time.Time) (runtimeOverride, error) {
	o := runtimeOverride{Tenant: j.Tenant, Policy: j.Policy, MaxEvents: j.MaxEvents, Burst: j.Burst, Unlimited: j.Unlimited, Shadow: j.Shadow}
	if o.MaxEvents != 0 || !o.Unlimited {
		if err := limiter.CheckCount(o.MaxEvents, 1); err != nil {
			return o, fmt.Errorf("max_events: %w", err)
		}
	}
	if err := limiter.CheckCount(o.Burst, 0); err != nil {
		return o, fmt.Errorf("burst: %w", err)
	}
	if j.Window != "" {
		d, err := caddy.ParseDuration(string(j.Window))
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
		} else if d, err := caddy.ParseDuration(string(j.Expires)); err == nil && d > 0 {
			o.Expires = now.Add(d)
		} else {
			return o, fmt.Errorf("expires: %q: want an RFC 3339 time or a positive duration such as 2h or 1d", j.Expires)
		}
	}
	return o, nil
}

// limit converts o into a limit of p: the window defaults to the
// policy's, min_interval is the policy's, and it is shadow when it or the
// policy is.
func (o *runtimeOverride) limit(p *limiter.Policy) limiter.Limit {
	l := limiter.Limit{Unlimited: o.Unlimited, Shadow: o.Shadow || p.Limit.Shadow}
	if !o.Unlimited {
		l.Rate = limiter.Rate{Limit: o.MaxEvents, Window: o.Window, Burst: o.Burst, MinInterval: p.Limit.MinInterval}
		if l.Window == 0 {
			l.Window = p.Limit.Window
		}
	}
	return l
}

func (o *runtimeOverride) expired(now time.Time) bool {
	return !o.Expires.IsZero() && !now.Before(o.Expires)
}

type overrideKey struct{ tenant, policy string }

// overrideTable is the in-process view of the runtime overrides. Reads
// (every request) are one atomic load and a map lookup; writes copy the
// map.
type overrideTable struct {
	mu sync.Mutex // serializes writers
	m  atomic.Pointer[map[overrideKey]runtimeOverride]
	// gen counts local writes, so a reload that read Redis before a
	// local write does not put the old value back.
	gen atomic.Uint64
}

func newOverrideTable() *overrideTable {
	t := new(overrideTable)
	m := map[overrideKey]runtimeOverride{}
	t.m.Store(&m)
	return t
}

// Lookup implements limiter.OverrideLookup.
func (t *overrideTable) Lookup(p *limiter.Policy, tenant string) (limiter.Limit, bool) {
	m := *t.m.Load()
	if len(m) == 0 {
		return limiter.Limit{}, false
	}
	o, ok := m[overrideKey{tenant, p.Name}]
	if !ok || o.expired(time.Now()) {
		return limiter.Limit{}, false
	}
	return o.limit(p), true
}

// get returns the live override of (tenant, policy).
func (t *overrideTable) get(tenant, policy string) (runtimeOverride, bool) {
	o, ok := (*t.m.Load())[overrideKey{tenant, policy}]
	if !ok || o.expired(time.Now()) {
		return runtimeOverride{}, false
	}
	return o, true
}

// list returns the live overrides, of tenant only when it is not empty.
func (t *overrideTable) list(tenant string) []runtimeOverride {
	now := time.Now()
	out := []runtimeOverride{}
	for k, o := range *t.m.Load() {
		if (tenant == "" || k.tenant == tenant) && !o.expired(now) {
			out = append(out, o)
		}
	}
	sortOverrides(out)
	return out
}

func sortOverrides(s []runtimeOverride) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && (s[j].Tenant < s[j-1].Tenant || s[j].Tenant == s[j-1].Tenant && s[j].Policy < s[j-1].Policy); j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// set stores o (or removes (tenant, policy) when o is nil) and returns
// the previous value.
func (t *overrideTable) set(tenant, policy string, o *runtimeOverride) (old runtimeOverride, had bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := *t.m.Load()
	k := overrideKey{tenant, policy}
	old, had = cur[k]
	next := make(map[overrideKey]runtimeOverride, len(cur)+1)
	for kk, v := range cur {
		next[kk] = v
	}
	if o == nil {
		delete(next, k)
	} else {
		next[k] = *o
	}
	t.m.Store(&next)
	t.gen.Add(1)
	return old, had
}

// replace swaps in a whole new set of overrides (a reload from Redis
// that started at generation gen); it does nothing when a local write
// happened since, as the reload may predate it.
func (t *overrideTable) replace(all []runtimeOverride, gen uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.gen.Load() != gen {
		return
	}
	next := make(map[overrideKey]runtimeOverride, len(all))
	for _, o := range all {
		next[overrideKey{o.Tenant, o.Policy}] = o
	}
	t.m.Store(&next)
}

// memoryOverrides holds the runtime overrides of handlers on the embedded
// store: process-wide, lost on restart.
var memoryOverrides = newOverrideTable()

// redisOverrides keeps a backend's override table in sync with Redis:
// the hashes <prefix>:ovr:{<tenant>} (field = policy, value = JSON). A
// change is published on <prefix>:events; every instance reloads on a
// message and, as a safety net, every overrideRefresh.
type redisOverrides struct {
	client  redis.UniversalClient
	prefix  string
	timeout time.Duration
	table   *overrideTable
	logger  *zap.Logger
	cancel  context.CancelFunc
	done    chan struct{}
	// id is this instance's registry ID, and onReset is told about resets
	// that other instances published (see publishReset).
	id      string
	onReset func(tenant, policy string)
}

// overrideRefresh is how often the table is reloaded from Redis even
// without a change notice.
const overrideRefresh = time.Second

func newRedisOverrides(client redis.UniversalClient, prefix string, timeout time.Duration, logger *zap.Logger, id string, onReset func(tenant, policy string)) *redisOverrides {
	if timeout <= 0 {
		timeout = 100 * time.Millisecond
	}
	if prefix == "" {
		prefix = limiter.DefaultPrefix
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &redisOverrides{client: client, prefix: prefix, timeout: timeout, table: newOverrideTable(), logger: logger, cancel: cancel, done: make(chan struct{}), id: id, onReset: onReset}
	go r.run(ctx)
	return r
}

func (r *redisOverrides) close() {
	r.cancel()
	<-r.done
}

func (r *redisOverrides) channel() string { return r.prefix + ":events" }

func (r *redisOverrides) hashKey(tenant string) string {
	return string(limiter.AppendEscaped([]byte(r.prefix+":ovr:{"), tenant)) + "}"
}

func (r *redisOverrides) run(ctx context.Context) {
	defer close(r.done)
	sub := r.client.Subscribe(ctx, r.channel())
	defer sub.Close()
	msgs := sub.Channel()
	tick := time.NewTicker(overrideRefresh)
	defer tick.Stop()
	r.reload(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-msgs:
			if id, tenant, policy, ok := parseResetNotice(m.Payload); ok {
				if id != r.id && r.onReset != nil {
					r.onReset(tenant, policy)
				}
				continue
			}
			r.reload(ctx)
		case <-tick.C:
			r.reload(ctx)
		}
	}
}

// reload reads every override hash. On error the table is kept.
func (r *redisOverrides) reload(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*r.timeout)
	defer cancel()
	var (
		mu  sync.Mutex
		all []runtimeOverride
	)
	now := time.Now()
	gen := r.table.gen.Load()
	scan := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, r.prefix+":ovr:*", 1000).Iterator()
		for iter.Next(ctx) {
			fields, err := c.HGetAll(ctx, iter.Val()).Result()
			if err != nil {
				return err
			}
			for field, v := range fields {
				var o runtimeOverride
				if json.Unmarshal([]byte(v), &o) != nil {
					continue
				}
				if o.expired(now) {
					// Expired: drop it from Redis too (any instance may).
					c.HDel(ctx, iter.Val(), field)
					continue
				}
				mu.Lock()
				all = append(all, o)
				mu.Unlock()
			}
		}
		return iter.Err()
	}
	var err error
	if cc, ok := r.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, r.client)
	}
	if err != nil {
		if ctx.Err() == nil || !errors.Is(err, context.Canceled) {
			r.logger.Debug("reloading runtime overrides", zap.Error(err))
		}
		return
	}
	r.table.replace(all, gen)
}

// store writes (or deletes, o nil) the override in Redis, publishes the
// change and appends it to the audit stream. The local table is updated
// at once.
func (r *redisOverrides) store(ctx context.Context, tenant, policy string, o *runtimeOverride, remote string) (old runtimeOverride, had bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*r.timeout)
	defer cancel()
	key := r.hashKey(tenant)
	prev, err := r.client.HGet(ctx, key, policy).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return old, false, err
	}
	if prev != "" && json.Unmarshal([]byte(prev), &old) == nil {
		had = !old.expired(time.Now())
	}
	action := "delete"
	newJSON := ""
	if o == nil {
		if err := r.client.HDel(ctx, key, policy).Err(); err != nil {
			return old, had, err
		}
	} else {
		action = "set"
		b, _ := json.Marshal(o)
		newJSON = string(b)
		if err := r.client.HSet(ctx, key, policy, newJSON).Err(); err != nil {
			return old, had, err
		}
	}
	r.table.set(tenant, policy, o)
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
func (r *redisOverrides) audit(ctx context.Context, action, tenant, policy, old, new, remote string) {
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
func (r *redisOverrides) publishReset(ctx context.Context, tenant, policy string) {
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
