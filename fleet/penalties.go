package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// Penalty boxes for the fleet (limiter.Penalty). A PenaltySync is
// limiter.Penalties for every instance on one Redis prefix:
//
//   - Boxed is a lookup in this instance's limiter.PenaltyTable: a boxed
//     bucket costs no Redis call, on any instance that knows of its box.
//   - Denied queues the denial; a writer goroutine sends what is queued,
//     summed per bucket, in one pipeline: per bucket, one call of
//     penaltyScript, which counts the denials in Redis (so the whole fleet
//     counts one total) and, at the policy's count, sets the box's marker
//     with the box's exact TTL.
//   - The instance whose call set the marker adds the box to the index
//     <prefix>:penalties (a sorted set: member the bucket, score the end
//     of its box, Unix ms) and publishes it on <prefix>:events; every
//     instance puts it in its table at once. An instance that missed the
//     message learns of the box from its next call for that bucket (the
//     script answers with the marker's end), and reloads the index
//     whenever its pub/sub connection (re)subscribes. That instance
//     alone tells its box watchers (WatchBoxes: the penalty webhook), so
//     a box is announced once for the fleet.
//
// Keys, in the tenant's hash slot (next to its buckets):
// <prefix>:denied:{<tenant>}:<policy>[:<part>] (the count, TTL one
// window from the first denial) and <prefix>:penalty:{<tenant>}:<policy>[:<part>]
// (the marker: the end of the box, Unix ms, TTL the box's duration).
//
// Redis cost: nothing per request while a bucket is boxed, nor for a
// policy without a penalty. Per denial of a penalty policy, a share of one
// script call (denials of one bucket queued together are one call; about
// 6 µs of Redis time each, with TIME, PTTL, INCRBY and PEXPIRE; 3 µs
// for a bucket boxed already), and
// per box one index update and one PUBLISH. Background work: none; a
// reload (on (re)subscription) is one ZRANGEBYSCORE of the live boxes.
//
// Clocks: a box ends at a Redis time (TIME); instances compare it with
// their own clock, so the fleet's clocks must agree (NTP) to within the
// precision wanted.
type PenaltySync struct {
	penaltySyncOptions
	table *limiter.PenaltyTable
	local limiter.LocalPenalties // the lookup on table
	// boxes hear of the boxes this instance's calls make: each box of
	// the fleet once (see WatchBoxes).
	boxes limiter.BoxWatchers

	mu      sync.Mutex
	pending map[limiter.PenaltyKey]pendingDenials
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
}

var (
	_ limiter.Penalties  = (*PenaltySync)(nil)
	_ limiter.BoxWatcher = (*PenaltySync)(nil)
)

// pendingDenials are a bucket's denials not sent to Redis yet.
type pendingDenials struct {
	n       int64
	penalty limiter.Penalty
	limit   limiter.Limit // of the last denial
}

// maxPendingPenalties bounds the buckets whose denials wait to be sent:
// beyond it, denials of new buckets are not counted (a flood of distinct
// keys must not grow memory).
const maxPendingPenalties = 10000

// penaltyIndexMax bounds the boxes a reload reads.
const penaltyIndexMax = limiter.DefaultPenaltyTableSize

// penaltyScript counts add denials of a bucket and boxes it at the
// policy's count. KEYS: the count, the marker. ARGV: add, after, window
// (ms), duration (ms). It answers {state, end}: state 0 counted (end 0),
// 1 boxed by this call, 2 already boxed; end in Unix ms (Redis time).
var penaltyScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local left = redis.call('PTTL', KEYS[2])
if left > 0 then
	return {2, now + left}
end
local add = tonumber(ARGV[1])
local n = redis.call('INCRBY', KEYS[1], add)
if n == add then
	redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
if n < tonumber(ARGV[2]) then
	return {0, 0}
end
local dur = tonumber(ARGV[4])
redis.call('SET', KEYS[2], now + dur, 'PX', dur)
redis.call('DEL', KEYS[1])
return {1, now + dur}`)

// penaltyIndexScript adds a box to the index. KEYS: the index. ARGV: the
// end (Unix ms), the member, now (Unix ms). Boxes that have ended are
// trimmed, and the index expires with its last box.
var penaltyIndexScript = redis.NewScript(`
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[3])
local want = tonumber(ARGV[1]) - tonumber(ARGV[3])
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -1 or ttl < want then
	redis.call('PEXPIRE', KEYS[1], want)
end
return 1`)

// penaltyNotice and penaltyLiftNotice start the pub/sub messages of a
// box and of lifted boxes: the notice, then JSON ([]penaltyWire).
const (
	penaltyNotice     = "penalty\x00"
	penaltyLiftNotice = "penalty-lift\x00"
)

// penaltyWire is a box in messages and index members.
type penaltyWire struct {
	Policy string `json:"p"`
	Tenant string `json:"t"`
	Part   string `json:"k,omitempty"`
	// Until is the end of the box, Unix ms (messages only).
	Until int64 `json:"u,omitempty"`
}

// penaltySyncOptions configures newPenaltySync.
type penaltySyncOptions struct {
	client  redis.UniversalClient
	prefix  string
	timeout time.Duration
	breaker *limiter.BreakerStore
	logger  *zap.Logger
	observe func(script, result string, d time.Duration)
}

func newPenaltySync(o penaltySyncOptions) *PenaltySync {
	p := &PenaltySync{
		penaltySyncOptions: o,
		table:              limiter.NewPenaltyTable(0),
		pending:            map[limiter.PenaltyKey]pendingDenials{},
		wake:               make(chan struct{}, 1),
		stop:               make(chan struct{}),
		done:               make(chan struct{}),
	}
	p.local.PenaltyTable = p.table
	go p.run()
	return p
}

// Boxed implements limiter.Penalties: an in-process lookup.
func (p *PenaltySync) Boxed(k limiter.PenaltyKey) (time.Duration, bool) {
	return p.local.Boxed(k)
}

// Denied implements limiter.Penalties: queued, sent by the writer.
func (p *PenaltySync) Denied(k limiter.PenaltyKey, pen limiter.Penalty, l limiter.Limit) {
	p.mu.Lock()
	e, had := p.pending[k]
	if !had {
		if len(p.pending) >= maxPendingPenalties {
			p.mu.Unlock()
			return
		}
		k = limiter.PenaltyKey{Policy: strings.Clone(k.Policy), Tenant: strings.Clone(k.Tenant), Part: strings.Clone(k.Part)}
	}
	e.n++
	e.penalty, e.limit = pen, l
	p.pending[k] = e
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// WatchBoxes implements limiter.BoxWatcher: f hears of the boxes this
// instance makes, that is of the boxes whose script call answered "boxed
// by this call", which Redis answers to one call per box: each box of the
// fleet is told on one instance, once, without another Redis call.
func (p *PenaltySync) WatchBoxes(f func(limiter.Box) bool) (stop func()) {
	return p.boxes.WatchBoxes(f)
}

// Table is this instance's table of boxes.
func (p *PenaltySync) Table() *limiter.PenaltyTable { return p.table }

func (p *PenaltySync) run() {
	defer close(p.done)
	for {
		select {
		case <-p.stop:
			return
		case <-p.wake:
			p.flush()
		}
	}
}

func (p *PenaltySync) close() {
	close(p.stop)
	<-p.done
}

// flush sends the queued denials: one pipelined round trip (per node in
// a Cluster), then one index update and one message per new box.
func (p *PenaltySync) flush() {
	p.mu.Lock()
	batch := p.pending
	p.pending = make(map[limiter.PenaltyKey]pendingDenials, len(batch))
	p.mu.Unlock()
	if len(batch) == 0 || p.breaker.Open() {
		// While Redis fails, denials are decided by fail modes: they do
		// not count toward a box.
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*p.timeout)
	defer cancel()
	keys := make([]limiter.PenaltyKey, 0, len(batch))
	for k := range batch {
		keys = append(keys, k)
	}
	cmds, err := p.count(ctx, keys, batch)
	if isNoScript(err) {
		// A restarted or new node: load the script (on every master of
		// a Cluster) and send again the calls it refused, only those
		// (the others have counted).
		var again []limiter.PenaltyKey
		var at []int
		for i, c := range cmds {
			if isNoScript(c.Err()) {
				again, at = append(again, keys[i]), append(at, i)
			}
		}
		if err = penaltyScript.Load(ctx, p.client).Err(); err == nil {
			var retried []*redis.Cmd
			retried, err = p.count(ctx, again, batch)
			for j, i := range at {
				cmds[i] = retried[j]
			}
		}
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		p.logger.Debug("penalty box: counting denials in Redis failed; these denials do not count", zap.Int("buckets", len(batch)), zap.Error(err))
	}
	now := time.Now()
	var boxed []penaltyWire
	for i, c := range cmds {
		vals, err := c.Int64Slice()
		if err != nil || len(vals) != 2 || vals[0] == 0 {
			continue
		}
		k, until := keys[i], vals[1]
		p.table.Box(k, until*int64(time.Millisecond), now.UnixNano())
		if vals[0] == 1 {
			boxed = append(boxed, penaltyWire{Policy: k.Policy, Tenant: k.Tenant, Part: k.Part, Until: until})
			p.boxes.Made(limiter.Box{PenaltyEntry: limiter.PenaltyEntry{PenaltyKey: k, Until: until * int64(time.Millisecond)}, Limit: batch[k].limit})
		}
	}
	for _, w := range boxed {
		member := penaltyMember(w)
		if err := penaltyIndexScript.Run(ctx, p.client, []string{p.indexKey()}, w.Until, member, now.UnixMilli()).Err(); err != nil {
			p.logger.Warn("penalty box: adding a box to the index failed; it holds, but the admin API may not list it", zap.Error(err))
		}
	}
	if len(boxed) > 0 {
		p.publish(ctx, penaltyNotice, boxed)
	}
}

// count sends the denials of batch, in the order of keys, as one
// pipeline of penaltyScript calls (EVALSHA).
func (p *PenaltySync) count(ctx context.Context, keys []limiter.PenaltyKey, batch map[limiter.PenaltyKey]pendingDenials) ([]*redis.Cmd, error) {
	cmds := make([]*redis.Cmd, len(keys))
	start := time.Now()
	_, err := p.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, k := range keys {
			e := batch[k]
			cmds[i] = penaltyScript.EvalSha(ctx, pipe, []string{p.countKey(k), p.markerKey(k)},
				e.n, e.penalty.After, max(e.limit.Window.Milliseconds(), 1), e.penalty.Duration.Milliseconds())
		}
		return nil
	})
	p.observeCall("penalty", err, time.Since(start))
	return cmds, err
}

// isNoScript reports whether err (of a pipeline: its first error) is
// Redis's NOSCRIPT.
func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

func (p *PenaltySync) observeCall(script string, err error, d time.Duration) {
	if p.observe == nil {
		return
	}
	result := "ok"
	switch {
	case err == nil || errors.Is(err, redis.Nil):
	case errors.Is(err, context.DeadlineExceeded):
		result = "timeout"
	default:
		result = "error"
	}
	p.observe(script, result, d)
}

// publish sends boxes (or lifts) to the other instances.
func (p *PenaltySync) publish(ctx context.Context, notice string, ws []penaltyWire) {
	raw, _ := json.Marshal(ws)
	if err := p.client.Publish(ctx, p.channel(), notice+string(raw)).Err(); err != nil {
		p.logger.Warn("penalty box: telling the other instances failed; they learn of it at their next denial of the bucket", zap.Error(err))
	}
}

// handle acts on a pub/sub message; it reports whether it was one of
// the penalty box's.
func (p *PenaltySync) handle(payload string) bool {
	notice, lift := penaltyNotice, false
	rest, ok := strings.CutPrefix(payload, penaltyNotice)
	if !ok {
		if rest, ok = strings.CutPrefix(payload, penaltyLiftNotice); !ok {
			return false
		}
		notice, lift = penaltyLiftNotice, true
	}
	var ws []penaltyWire
	if err := json.Unmarshal([]byte(rest), &ws); err != nil {
		p.logger.Debug("penalty box: ignoring a malformed message", zap.String("notice", strings.TrimSuffix(notice, "\x00")), zap.Error(err))
		return true
	}
	now := time.Now().UnixNano()
	for _, w := range ws {
		k := limiter.PenaltyKey{Policy: w.Policy, Tenant: w.Tenant, Part: w.Part}
		if lift {
			p.table.Unbox(k)
			continue
		}
		p.table.Box(k, w.Until*int64(time.Millisecond), now)
	}
	return true
}

// reload puts the live boxes of the index in the table: after a
// (re)subscription, as messages sent while it was down are lost.
func (p *PenaltySync) reload(ctx context.Context) {
	entries, err := p.readIndex(ctx, penaltyIndexMax)
	if err != nil {
		p.logger.Warn("penalty box: reading the boxes from Redis failed; this instance learns of them at their next denial", zap.Error(err))
		return
	}
	now := time.Now().UnixNano()
	for _, e := range entries {
		p.table.Box(e.PenaltyKey, e.Until, now)
	}
}

// readIndex reads up to n live boxes from the index, the ones that end
// first first.
func (p *PenaltySync) readIndex(ctx context.Context, n int) ([]limiter.PenaltyEntry, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*p.timeout)
	defer cancel()
	zs, err := p.client.ZRangeByScoreWithScores(ctx, p.indexKey(), &redis.ZRangeBy{
		Min: "(" + strconv.FormatInt(time.Now().UnixMilli(), 10), Max: "+inf", Count: int64(n),
	}).Result()
	if err != nil {
		return nil, err
	}
	out := make([]limiter.PenaltyEntry, 0, len(zs))
	for _, z := range zs {
		member, _ := z.Member.(string)
		var w penaltyWire
		if json.Unmarshal([]byte(member), &w) != nil {
			continue
		}
		out = append(out, limiter.PenaltyEntry{
			PenaltyKey: limiter.PenaltyKey{Policy: w.Policy, Tenant: w.Tenant, Part: w.Part},
			Until:      int64(z.Score) * int64(time.Millisecond),
		})
	}
	return out, nil
}

// List returns the live boxes of tenant and policy (each "" for any),
// the ones that end first first, at most n, fleet-wide (from the index).
// On a Redis error it returns this instance's table and the error.
func (p *PenaltySync) List(ctx context.Context, tenant, policy string, n int) ([]limiter.PenaltyEntry, error) {
	all, err := p.readIndex(ctx, penaltyIndexMax)
	if err != nil {
		return p.table.List(tenant, policy, time.Now().UnixNano(), n), err
	}
	out := all[:0]
	for _, e := range all {
		if (tenant == "" || e.Tenant == tenant) && (policy == "" || e.Policy == policy) {
			out = append(out, e)
		}
	}
	limiter.SortPenalties(out)
	return out[:min(n, len(out))], nil
}

// Lift lifts the boxes of tenant (of policy only, when set) for the whole
// fleet: their markers, counts and index entries are deleted, and every
// instance is told. It returns the boxes lifted. remote names who asked
// (the audit stream).
func (p *PenaltySync) Lift(ctx context.Context, tenant, policy, remote string, audit func(ctx context.Context, action, tenant, policy, old, new, remote string)) ([]limiter.PenaltyEntry, error) {
	local := p.table.Lift(tenant, policy, time.Now().UnixNano())
	all, err := p.readIndex(ctx, penaltyIndexMax)
	if err != nil {
		return local, err
	}
	// The boxes of the index, and those this instance knows that the
	// index missed (its update failed).
	found := map[limiter.PenaltyKey]bool{}
	var lifted, lift []limiter.PenaltyEntry
	for _, e := range append(all, local...) {
		if e.Tenant == tenant && (policy == "" || e.Policy == policy) && !found[e.PenaltyKey] {
			found[e.PenaltyKey] = true
			lift = append(lift, e)
		}
	}
	var ws []penaltyWire
	ctx, cancel := context.WithTimeout(ctx, 10*p.timeout)
	defer cancel()
	for _, e := range lift {
		w := penaltyWire{Policy: e.Policy, Tenant: e.Tenant, Part: e.Part}
		// The marker and count share a slot; the index may be elsewhere.
		if err := p.client.Del(ctx, p.markerKey(e.PenaltyKey), p.countKey(e.PenaltyKey)).Err(); err != nil {
			return lifted, err
		}
		if err := p.client.ZRem(ctx, p.indexKey(), penaltyMember(w)).Err(); err != nil {
			return lifted, err
		}
		lifted = append(lifted, e)
		ws = append(ws, w)
	}
	limiter.SortPenalties(lifted)
	if len(ws) > 0 {
		p.publish(ctx, penaltyLiftNotice, ws)
		raw, _ := json.Marshal(ws)
		audit(ctx, "penalty_lift", tenant, policy, string(raw), "", remote)
	}
	return lifted, nil
}

func (p *PenaltySync) channel() string  { return p.prefix + ":events" }
func (p *PenaltySync) indexKey() string { return p.prefix + ":penalties" }

func (p *PenaltySync) countKey(k limiter.PenaltyKey) string  { return p.bucketKey("denied", k) }
func (p *PenaltySync) markerKey(k limiter.PenaltyKey) string { return p.bucketKey("penalty", k) }

// bucketKey is <prefix>:<kind>:{<tenant>}:<policy>[:<part>], escaped as
// bucket keys are (limiter.AppendKey).
func (p *PenaltySync) bucketKey(kind string, k limiter.PenaltyKey) string {
	b := make([]byte, 0, len(p.prefix)+len(kind)+len(k.Tenant)+len(k.Policy)+len(k.Part)+8)
	b = append(b, p.prefix...)
	b = append(b, ':')
	b = append(b, kind...)
	b = append(b, ':', '{')
	b = limiter.AppendTenantTag(b, k.Tenant)
	b = append(b, '}', ':')
	b = append(b, k.Policy...)
	if k.Part != "" {
		b = append(b, ':')
		b = limiter.AppendEscaped(b, k.Part)
	}
	return string(b)
}

// penaltyMember is a box's member in the index: its bucket as JSON.
func penaltyMember(w penaltyWire) string {
	w.Until = 0
	raw, _ := json.Marshal(w)
	return string(raw)
}
