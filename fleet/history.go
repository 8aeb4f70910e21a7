package fleet

import (
	"cmp"
	"context"
	"errors"
	"hash/maphash"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// Usage history: per tenant and policy, the units admitted, the requests
// denied and the shadow would-denies, by minute and by hour.
//
// A History aggregates in process: noting a decision is a map update
// under one of historyShards locks, no I/O. Every historyFlushInterval a
// writer sends what was noted, summed per tenant, policy and minute, to
// its sink: with Redis, one pipeline of HINCRBY (one to three fields per
// minute point and per hour point) and one EXPIREAT per key written, so
// a flush costs O(tenants active since the last one), never one write per
// request, and nothing while idle. The whole fleet writes the same keys,
// so a series is the fleet's.
//
// Keys (the tenant's hash slot): a hash per hour of minutes,
// <prefix>:hist:{<tenant>}:<policy>:m:<unix hour>, fields <minute of the
// hour> (admitted units), <minute>d (denied requests), <minute>s (shadow
// would-denies), expiring MinuteRetention after the hour ends; and a hash
// per day of hours, <prefix>:hist:{<tenant>}:<policy>:h:<unix day>,
// fields <hour of the day>[d|s], expiring HourRetention after the day
// ends. Small hashes stay listpacks: measured 47 KiB per tenant and
// policy with a point every minute for 48 hours and every hour for 90 days
// (see TestHistoryMemory).
//
// On the embedded store the sink is a process-wide map of the same
// hashes, bounded (historyMemoryKeys keys; when full, the tenth that
// expires first goes), surviving config reloads but not restarts.
//
// A flush that fails is dropped: history is an observability aid, never
// a source of truth (the buckets are).

const (
	// DefaultMinuteRetention and DefaultHourRetention are how long
	// minute and hour points are kept.
	DefaultMinuteRetention = 48 * time.Hour
	DefaultHourRetention   = 90 * 24 * time.Hour
	// historyFlushInterval is the least time between two flushes.
	historyFlushInterval = 10 * time.Second
	// historyMaxPending bounds the points noted between two flushes;
	// beyond it, points of new tenants are dropped.
	historyMaxPending = 100000
	// historyMemoryKeys bounds the embedded store's history hashes.
	historyMemoryKeys = 200000
	historyShards     = 16
)

// HistoryOptions configures a History.
type HistoryOptions struct {
	// MinuteRetention and HourRetention are how long points are kept (0:
	// the defaults).
	MinuteRetention, HourRetention time.Duration
	// Logger logs failed flushes (at most one WARN per minute).
	Logger *zap.Logger
}

// Point is one point of a series: what a tenant did in one minute or
// hour of one policy.
type Point struct {
	// At is the start of the minute or hour.
	At time.Time
	// Admitted is the units admitted, Denied the requests denied and
	// Shadow the requests a shadow limit would have denied.
	Admitted, Denied, Shadow int64
}

// historyKey is a point being aggregated: a tenant's minute of a policy.
type historyKey struct {
	policy, tenant string
	minute         int64 // Unix minutes
}

type historyShard struct {
	mu sync.Mutex
	m  map[historyKey]*[3]int64
}

// History records and reads one handler's usage history.
type History struct {
	opts   HistoryOptions
	sink   historySink
	seed   maphash.Seed
	shards [historyShards]historyShard

	// pending counts the points noted since the last flush (bounded).
	pendingMu sync.Mutex
	pending   int

	stop     chan struct{}
	done     chan struct{}
	lastWarn time.Time
	now      func() time.Time
}

// historySink is where points go: Redis, or the process's map.
type historySink interface {
	// add adds the counts to the fields of the hashes, and sets each
	// hash's expiry (Unix seconds).
	add(ctx context.Context, incs []historyIncr) error
	// read returns the fields of the hashes named.
	read(ctx context.Context, keys []string) ([]map[string]string, error)
	// addTop adds to members' scores in sorted sets, keeps the
	// historyTopKeep highest of each, and sets each set's expiry.
	addTop(ctx context.Context, incs []historyIncr) error
	// readTop returns the members and scores of the sets named.
	readTop(ctx context.Context, keys []string) ([]map[string]int64, error)
}

// historyTopKeep is how many tenants each hour's top set keeps.
const historyTopKeep = 1000

// historyIncr is one field increment of one hash.
type historyIncr struct {
	key, field string
	n          int64
	expireAt   int64 // Unix seconds
}

// NewRedisHistory returns a History written to Redis under prefix.
func NewRedisHistory(client redis.UniversalClient, prefix string, o HistoryOptions) *History {
	return newHistory(&redisHistorySink{client: client}, prefix, o)
}

// NewHistory returns a History written to b's Redis under its prefix.
func (b *Backend) NewHistory(o HistoryOptions) *History {
	return NewRedisHistory(b.client, b.opts.Prefix, o)
}

// NewMemoryHistory returns a History kept in the process's map.
func NewMemoryHistory(o HistoryOptions) *History {
	return newHistory(memoryHistory, "memory", o)
}

func newHistory(sink historySink, prefix string, o HistoryOptions) *History {
	if o.MinuteRetention <= 0 {
		o.MinuteRetention = DefaultMinuteRetention
	}
	if o.HourRetention <= 0 {
		o.HourRetention = DefaultHourRetention
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	h := &History{opts: o, sink: &prefixedSink{sink, prefix + ":hist:"}, seed: maphash.MakeSeed(),
		stop: make(chan struct{}), done: make(chan struct{}), now: time.Now}
	for i := range h.shards {
		h.shards[i].m = map[historyKey]*[3]int64{}
	}
	go h.run()
	return h
}

// Note records a decision of policy (its engine name) for tenant:
// admitted units, a denied request or a shadow would-deny (each 0 or
// more). No I/O.
func (h *History) Note(policy, tenant string, admitted, denied, shadow int64) {
	if admitted == 0 && denied == 0 && shadow == 0 {
		return
	}
	tenant = limiter.BoundedValue(tenant)
	k := historyKey{policy, tenant, h.now().Unix() / 60}
	sh := &h.shards[maphash.String(h.seed, tenant)%historyShards]
	sh.mu.Lock()
	c := sh.m[k]
	if c == nil {
		if !h.reserve() {
			sh.mu.Unlock()
			return
		}
		k.policy, k.tenant = strings.Clone(policy), strings.Clone(tenant)
		c = new([3]int64)
		sh.m[k] = c
	}
	c[0] += admitted
	c[1] += denied
	c[2] += shadow
	sh.mu.Unlock()
}

// reserve counts one more pending point, false when the bound is reached.
func (h *History) reserve() bool {
	h.pendingMu.Lock()
	defer h.pendingMu.Unlock()
	if h.pending >= historyMaxPending {
		return false
	}
	h.pending++
	return true
}

func (h *History) run() {
	defer close(h.done)
	t := time.NewTicker(historyFlushInterval)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
			h.Flush(context.Background())
		}
	}
}

// Close stops the writer after a last flush.
func (h *History) Close() {
	close(h.stop)
	<-h.done
	h.Flush(context.Background())
}

// take empties the shards and returns their points.
func (h *History) take() map[historyKey][3]int64 {
	out := map[historyKey][3]int64{}
	for i := range h.shards {
		sh := &h.shards[i]
		sh.mu.Lock()
		for k, c := range sh.m {
			out[k] = *c
		}
		clear(sh.m)
		sh.mu.Unlock()
	}
	h.pendingMu.Lock()
	h.pending = 0
	h.pendingMu.Unlock()
	return out
}

// Flush sends what was noted to the sink: one pipelined round trip (per
// node in a Cluster).
func (h *History) Flush(ctx context.Context) {
	points := h.take()
	if len(points) == 0 {
		return
	}
	incs := make([]historyIncr, 0, 2*len(points))
	tops := map[historyKey]int64{} // minute: the hour
	for k, c := range points {
		incs = h.appendIncrs(incs, k, c)
		if c[0] != 0 {
			tops[historyKey{k.policy, k.tenant, k.minute / 60}] += c[0]
		}
	}
	topIncs := make([]historyIncr, 0, len(tops))
	for k, n := range tops {
		topIncs = append(topIncs, historyIncr{key: topKey(k.policy, k.minute), field: k.tenant, n: n,
			expireAt: (k.minute+1)*3600 + int64(h.opts.MinuteRetention.Seconds())})
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := h.sink.add(ctx, incs)
	if err == nil {
		err = h.sink.addTop(ctx, topIncs)
	}
	if err != nil {
		if now := time.Now(); now.Sub(h.lastWarn) >= time.Minute {
			h.lastWarn = now
			h.opts.Logger.Warn("usage history: writing failed; these points are lost", zap.Int("points", len(points)), zap.Error(err))
		}
	}
}

// appendIncrs appends the increments of one minute point: to its minute
// hash and to its hour's field of the day hash.
func (h *History) appendIncrs(incs []historyIncr, k historyKey, c [3]int64) []historyIncr {
	hour, day := k.minute/60, k.minute/(60*24)
	mkey := minuteKey(k.policy, k.tenant, hour)
	hkey := hourKey(k.policy, k.tenant, day)
	mexp := (hour+1)*3600 + int64(h.opts.MinuteRetention.Seconds())
	hexp := (day+1)*86400 + int64(h.opts.HourRetention.Seconds())
	mfield := strconv.FormatInt(k.minute%60, 10)
	hfield := strconv.FormatInt(hour%24, 10)
	for i, suffix := range [3]string{"", "d", "s"} {
		if c[i] == 0 {
			continue
		}
		incs = append(incs,
			historyIncr{key: mkey, field: mfield + suffix, n: c[i], expireAt: mexp},
			historyIncr{key: hkey, field: hfield + suffix, n: c[i], expireAt: hexp})
	}
	return incs
}

// topKey is the sorted set of the tenants of policy that were admitted
// the most units in one hour (without the sink's prefix).
func topKey(policy string, hour int64) string {
	return "top:" + policy + ":" + strconv.FormatInt(hour, 10)
}

// TopEntry is a tenant's units admitted over a range.
type TopEntry struct {
	Tenant   string
	Admitted int64
}

// Top returns the n tenants of policy admitted the most units in the
// hours from from to to (at most the minute retention apart), most first.
// Each hour keeps its historyTopKeep busiest tenants, so a tenant outside
// them in some hour misses that hour's units: exact for the first
// thousand of every hour. This instance's points not flushed yet count.
func (h *History) Top(ctx context.Context, policy string, from, to time.Time, n int) ([]TopEntry, error) {
	first, last := from.Unix()/3600, to.Unix()/3600
	if last < first || time.Duration(last-first)*time.Hour > h.opts.MinuteRetention {
		return nil, errors.Join(ErrHistoryRange, errors.New("from and to: want from before to, at most the minute retention apart"))
	}
	var keys []string
	for hour := first; hour <= last; hour++ {
		keys = append(keys, topKey(policy, hour))
	}
	sets, err := h.sink.readTop(ctx, keys)
	if err != nil {
		return nil, err
	}
	sum := map[string]int64{}
	for _, set := range sets {
		for tenant, v := range set {
			sum[tenant] += v
		}
	}
	for i := range h.shards {
		sh := &h.shards[i]
		sh.mu.Lock()
		for k, c := range sh.m {
			if hour := k.minute / 60; k.policy == policy && hour >= first && hour <= last && c[0] != 0 {
				sum[k.tenant] += c[0]
			}
		}
		sh.mu.Unlock()
	}
	out := make([]TopEntry, 0, len(sum))
	for tenant, v := range sum {
		out = append(out, TopEntry{tenant, v})
	}
	slices.SortFunc(out, func(a, b TopEntry) int {
		return cmp.Or(cmp.Compare(b.Admitted, a.Admitted), cmp.Compare(a.Tenant, b.Tenant))
	})
	return out[:min(n, len(out))], nil
}

// minuteKey and hourKey are the hashes of a tenant's minutes of one hour
// and hours of one day (without the sink's prefix).
func minuteKey(policy, tenant string, hour int64) string {
	return seriesKey(policy, tenant, "m", hour)
}

func hourKey(policy, tenant string, day int64) string {
	return seriesKey(policy, tenant, "h", day)
}

func seriesKey(policy, tenant, res string, n int64) string {
	b := make([]byte, 0, len(policy)+len(tenant)+32)
	b = append(b, '{')
	b = limiter.AppendTenantTag(b, tenant)
	b = append(b, '}', ':')
	b = append(b, policy...)
	b = append(b, ':')
	b = append(b, res...)
	b = append(b, ':')
	b = strconv.AppendInt(b, n, 10)
	return string(b)
}

// Resolution of a series.
type Resolution time.Duration

// The resolutions of a series.
const (
	Minute = Resolution(time.Minute)
	Hour   = Resolution(time.Hour)
)

// Retention is how long points of resolution r are kept.
func (h *History) Retention(r Resolution) time.Duration {
	if r == Hour {
		return h.opts.HourRetention
	}
	return h.opts.MinuteRetention
}

// ErrHistoryRange is a range a series cannot be read for.
var ErrHistoryRange = errors.New("usage history: range")

// Series returns tenant's points of policy from from to to (both
// truncated to r), one per minute or hour, zeros included: what the sink
// holds plus what this instance noted since its last flush. The range is
// at most the retention of r.
func (h *History) Series(ctx context.Context, policy, tenant string, r Resolution, from, to time.Time) ([]Point, error) {
	step := int64(time.Duration(r) / time.Second)
	if step != 60 && step != 3600 {
		return nil, errors.Join(ErrHistoryRange, errors.New("resolution: want 1m or 1h"))
	}
	first, last := from.Unix()/step, to.Unix()/step
	if last < first || time.Duration(last-first)*time.Duration(r) > h.Retention(r) {
		return nil, errors.Join(ErrHistoryRange, errors.New("from and to: want from before to, at most the retention apart"))
	}
	tenant = limiter.BoundedValue(tenant)
	points := make([]Point, last-first+1)
	for i := range points {
		points[i].At = time.Unix((first+int64(i))*step, 0).UTC()
	}
	// The hashes that hold the range: hours of minutes, or days of hours.
	per := int64(60)
	if step == 3600 {
		per = 24
	}
	var keys []string
	var base []int64 // first point index of each hash
	for n := first / per; n <= last/per; n++ {
		if step == 60 {
			keys = append(keys, minuteKey(policy, tenant, n))
		} else {
			keys = append(keys, hourKey(policy, tenant, n))
		}
		base = append(base, n*per)
	}
	hashes, err := h.sink.read(ctx, keys)
	if err != nil {
		return nil, err
	}
	for j, fields := range hashes {
		for f, v := range fields {
			i, kind := parseHistoryField(f)
			n, err := strconv.ParseInt(v, 10, 64)
			if i < 0 || err != nil {
				continue
			}
			if at := base[j] + i - first; at >= 0 && at < int64(len(points)) {
				addPoint(&points[at], kind, n)
			}
		}
	}
	// This instance's points not flushed yet.
	for i := range h.shards {
		sh := &h.shards[i]
		sh.mu.Lock()
		for k, c := range sh.m {
			if k.policy != policy || k.tenant != tenant {
				continue
			}
			if at := k.minute*60/step - first; at >= 0 && at < int64(len(points)) {
				for kind := range 3 {
					addPoint(&points[at], kind, c[kind])
				}
			}
		}
		sh.mu.Unlock()
	}
	return points, nil
}

// parseHistoryField reads a field: its index in the hash and its kind (0
// admitted, 1 denied, 2 shadow); index -1 for a field that is not one.
func parseHistoryField(f string) (int64, int) {
	kind := 0
	switch {
	case strings.HasSuffix(f, "d"):
		kind, f = 1, f[:len(f)-1]
	case strings.HasSuffix(f, "s"):
		kind, f = 2, f[:len(f)-1]
	}
	i, err := strconv.ParseInt(f, 10, 64)
	if err != nil || i < 0 {
		return -1, 0
	}
	return i, kind
}

func addPoint(p *Point, kind int, n int64) {
	switch kind {
	case 0:
		p.Admitted += n
	case 1:
		p.Denied += n
	default:
		p.Shadow += n
	}
}

// prefixedSink puts a prefix before every key.
type prefixedSink struct {
	historySink
	prefix string
}

func (s *prefixedSink) add(ctx context.Context, incs []historyIncr) error {
	for i := range incs {
		incs[i].key = s.prefix + incs[i].key
	}
	return s.historySink.add(ctx, incs)
}

func (s *prefixedSink) read(ctx context.Context, keys []string) ([]map[string]string, error) {
	return s.historySink.read(ctx, s.full(keys))
}

func (s *prefixedSink) addTop(ctx context.Context, incs []historyIncr) error {
	for i := range incs {
		incs[i].key = s.prefix + incs[i].key
	}
	return s.historySink.addTop(ctx, incs)
}

func (s *prefixedSink) readTop(ctx context.Context, keys []string) ([]map[string]int64, error) {
	return s.historySink.readTop(ctx, s.full(keys))
}

func (s *prefixedSink) full(keys []string) []string {
	full := make([]string, len(keys))
	for i, k := range keys {
		full[i] = s.prefix + k
	}
	return full
}

// redisHistorySink writes the hashes to Redis.
type redisHistorySink struct{ client redis.UniversalClient }

func (s *redisHistorySink) add(ctx context.Context, incs []historyIncr) error {
	expiring := map[string]int64{}
	_, err := s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, inc := range incs {
			pipe.HIncrBy(ctx, inc.key, inc.field, inc.n)
			expiring[inc.key] = inc.expireAt
		}
		for key, at := range expiring {
			pipe.ExpireAt(ctx, key, time.Unix(at, 0))
		}
		return nil
	})
	return err
}

func (s *redisHistorySink) read(ctx context.Context, keys []string) ([]map[string]string, error) {
	cmds := make([]*redis.MapStringStringCmd, len(keys))
	_, err := s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = pipe.HGetAll(ctx, k)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	out := make([]map[string]string, len(keys))
	for i, c := range cmds {
		out[i], _ = c.Result()
	}
	return out, nil
}

func (s *redisHistorySink) addTop(ctx context.Context, incs []historyIncr) error {
	if len(incs) == 0 {
		return nil
	}
	expiring := map[string]int64{}
	_, err := s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, inc := range incs {
			pipe.ZIncrBy(ctx, inc.key, float64(inc.n), inc.field)
			expiring[inc.key] = inc.expireAt
		}
		for key, at := range expiring {
			pipe.ZRemRangeByRank(ctx, key, 0, -historyTopKeep-1)
			pipe.ExpireAt(ctx, key, time.Unix(at, 0))
		}
		return nil
	})
	return err
}

func (s *redisHistorySink) readTop(ctx context.Context, keys []string) ([]map[string]int64, error) {
	cmds := make([]*redis.ZSliceCmd, len(keys))
	_, err := s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = pipe.ZRangeWithScores(ctx, k, 0, -1)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	out := make([]map[string]int64, len(keys))
	for i, c := range cmds {
		zs, _ := c.Result()
		out[i] = make(map[string]int64, len(zs))
		for _, z := range zs {
			if m, ok := z.Member.(string); ok {
				out[i][m] = int64(z.Score)
			}
		}
	}
	return out, nil
}

// memoryHistory is the embedded store's history: the process's, so it
// survives config reloads.
var memoryHistory = &memoryHistorySink{hashes: map[string]*memoryHash{}, now: time.Now}

// memoryHistorySink keeps the hashes in a bounded map.
type memoryHistorySink struct {
	mu     sync.Mutex
	hashes map[string]*memoryHash
	now    func() time.Time
}

type memoryHash struct {
	fields   map[string]int64
	expireAt int64
}

func (s *memoryHistorySink) add(_ context.Context, incs []historyIncr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now().Unix()
	for _, inc := range incs {
		h := s.hashes[inc.key]
		if h == nil || h.expireAt <= now {
			if h == nil && len(s.hashes) >= historyMemoryKeys {
				s.evict(now)
			}
			h = &memoryHash{fields: map[string]int64{}}
			s.hashes[inc.key] = h
		}
		h.fields[inc.field] += inc.n
		h.expireAt = inc.expireAt
	}
	return nil
}

// evict drops the expired hashes and, while more than nine tenths of
// the bound are left, those that expire first, so that the next tenth of
// the bound of new hashes is added without a scan. (Scanning for the one
// to drop at every new hash was 12 ms a hash under s.mu on a full map: a
// flush of many new tenants held the lock for minutes.) With s.mu held.
func (s *memoryHistorySink) evict(now int64) {
	type live struct {
		at  int64
		key string
	}
	var kept []live
	for k, h := range s.hashes {
		if h.expireAt <= now {
			delete(s.hashes, k)
			continue
		}
		kept = append(kept, live{h.expireAt, k})
	}
	keep := historyMemoryKeys * 9 / 10
	if len(kept) <= keep {
		return
	}
	slices.SortFunc(kept, func(a, b live) int { return cmp.Compare(a.at, b.at) })
	for _, l := range kept[:len(kept)-keep] {
		delete(s.hashes, l.key)
	}
}

func (s *memoryHistorySink) addTop(ctx context.Context, incs []historyIncr) error {
	if err := s.add(ctx, incs); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, inc := range incs {
		if h := s.hashes[inc.key]; h != nil && len(h.fields) > historyTopKeep {
			trimTop(h.fields)
		}
	}
	return nil
}

// trimTop keeps the historyTopKeep largest of fields (ties: the smaller
// name goes first), in one sort rather than a scan per member dropped.
func trimTop(fields map[string]int64) {
	names := slices.Collect(maps.Keys(fields))
	slices.SortFunc(names, func(a, b string) int {
		if c := cmp.Compare(fields[a], fields[b]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	for _, f := range names[:len(names)-historyTopKeep] {
		delete(fields, f)
	}
}

func (s *memoryHistorySink) readTop(ctx context.Context, keys []string) ([]map[string]int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now().Unix()
	out := make([]map[string]int64, len(keys))
	for i, k := range keys {
		if h := s.hashes[k]; h != nil && h.expireAt > now {
			out[i] = maps.Clone(h.fields)
		}
	}
	return out, nil
}

func (s *memoryHistorySink) read(_ context.Context, keys []string) ([]map[string]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now().Unix()
	out := make([]map[string]string, len(keys))
	for i, k := range keys {
		h := s.hashes[k]
		if h == nil || h.expireAt <= now {
			continue
		}
		out[i] = make(map[string]string, len(h.fields))
		for f, n := range h.fields {
			out[i][f] = strconv.FormatInt(n, 10)
		}
	}
	return out, nil
}
