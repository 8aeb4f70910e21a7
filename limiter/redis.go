package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults of RedisOptions, and the safety TTL of concurrency buckets.
const (
	// DefaultRedisTimeout is the deadline of every Redis call.
	DefaultRedisTimeout = 100 * time.Millisecond
	// RedisConcurrencyTTL is the TTL of a concurrency bucket (and of its
	// held index), set again on every acquire. A concurrency bucket has no
	// window; the TTL makes an idle bucket go. A request still in flight
	// that long keeps its counter alive itself (Decision.KeepSlotsAlive).
	// The slots of an instance that died are given back sooner, by their
	// leases (RedisSlotLease). It is the value of CONCURRENCY_TTL_MS in
	// lua/concurrency.lua.
	RedisConcurrencyTTL = 10 * time.Minute
	// RedisSlotLease is how long a concurrency slot held on Redis stays
	// taken without word from its request: the acquire leases it for that
	// long, and a request still running renews the lease every
	// KeepSlotsEvery (Decision.KeepSlotsAlive). The next acquire in the
	// bucket after a lease ended gives the slot back: its instance died,
	// or was cut off from Redis (or paused) for a whole lease. So the
	// slots of a dead instance come back within a lease even while other
	// instances keep acquiring, which sets the counter's TTL again each
	// time. It is SLOT_LEASE_MS in lua/held.lua.
	RedisSlotLease = time.Minute
)

// RedisOptions configures NewRedisStore.
type RedisOptions struct {
	// Client talks to Redis: a *redis.Client (standalone), a failover
	// client (Sentinel) or a *redis.ClusterClient. The store does not close
	// it. Create it with ContextTimeoutEnabled: go-redis ignores context
	// deadlines on the socket otherwise, and Timeout is then not enforced
	// on a server that stopped answering.
	Client redis.UniversalClient
	// Prefix starts every key; "" means "rl". It must not contain ':',
	// '{' or '}': the scripts find the tenant and the part of a key by
	// them (the Caddy configuration refuses such a prefix).
	Prefix string
	// Timeout is the deadline of every call; 0 means 100ms.
	Timeout time.Duration
	// NoBatch sends every call in its own round trip. By default the calls
	// of concurrent requests bound for one Redis node share a pipeline
	// (see batcher).
	NoBatch bool
	// Functions makes the batchers call the scripts as functions of
	// lua.Library (FCALL), loading the library on each node as needed:
	// 7-38% less Redis time per decision, as measured (Redis 7; a node that
	// refuses them is called with EVALSHA). Off: EVALSHA, falling back on
	// NOSCRIPT to EVAL.
	Functions bool
	// QueueTimeout bounds how long a batched call may wait in this
	// instance to be written to Redis (both batches in flight, a saturated
	// host); 0 means max(1s, 10 x Timeout). A call still waiting then is
	// shed with ErrQueueTimeout, unsent: the host, not Redis, was slow, so
	// no breaker counts it. Timeout counts from the write.
	QueueTimeout time.Duration
	// Observe, when not nil, is called after every script round trip with
	// the script ("decide", "peek", "dry", "force", "lease",
	// "lease_return" or "release"), how it ended ("ok", "error",
	// "timeout", or "noscript" for an EVALSHA that Redis did not know,
	// which is then retried at once with EVAL) and how long the round
	// trip took: for a batched call, from the write of its batch to the
	// reply, not the time it was queued before. It must be cheap and safe
	// for concurrent use.
	Observe func(script, result string, d time.Duration)
	// ObserveQueue, when not nil, is called for every batched call with
	// the time it waited in this instance before its batch was written,
	// and whether it was shed (ErrQueueTimeout) for waiting too long.
	ObserveQueue func(wait time.Duration, shed bool)
}

// queueTimeout is o's QueueTimeout with its default.
func (o *RedisOptions) queueTimeout() time.Duration {
	if o.QueueTimeout > 0 {
		return o.QueueTimeout
	}
	return max(time.Second, 10*o.Timeout)
}

// RedisStore is a Store that keeps buckets in Redis, for a fleet of
// instances sharing one budget. It means exactly what MemoryStore means
// (same algorithms, same all-or-nothing Decide, same shadow and duplicate-key
// rules), with time taken from Redis TIME inside the scripts, never from the
// instance's clock, and counted in microseconds: windows and min_interval
// are rounded up to a whole microsecond, and so are RetryAfter and Reset.
// GCRA's emission interval is ceil(window/limit) in µs, so when window/limit
// is not a whole number of µs GCRA admits up to 1µs per unit more slowly
// than in memory. Numbers stay within the domain of MaxCount; a cost above
// it is sent as MaxCount + 1, which no bucket can hold.
//
// Keys are AppendKey's; each written key gets a TTL that
// ends exactly when its state equals a fresh bucket, so an expired key and
// a fresh bucket mean the same thing. That TTL is at most 2 x Window for
// sliding and fixed windows, Window for the token bucket and GCRA with the
// default burst (Burst/Limit x Window with a larger burst) and
// max(Window, MinInterval) for the sliding log. Concurrency buckets have
// the safety TTL RedisConcurrencyTTL.
//
// Every Decide is one EVALSHA of one script (lua.Decide) that holds every
// algorithm, so it is atomic whatever the mix of algorithms, and costs one
// round trip. The script is sent again with EVAL when Redis answers
// NOSCRIPT (after a restart or SCRIPT FLUSH), so no decision is lost.
//
// Redis Cluster: a script may only touch keys of one hash slot, and the
// {tenant} hash tag puts every key of a tenant in one slot. When the checks
// of one Decide span several slots (policies whose tenant is their key)
// and Client is a
// *redis.ClusterClient, the store decides slot by slot, in order of first
// appearance, with compensation: each slot's checks are decided atomically
// and charged if they admit; once a slot denies, the remaining slots are
// only evaluated (not charged) and what the slots before charged is given
// back: concurrency slots released, other units by a Charge under an id
// (compensate). This is not atomic across slots:
// between a charge and its give-back (one round trip) other requests see
// the charged units, and may be denied; two requests racing on two slots
// may both be denied where one would have been admitted; never is more
// admitted than the limits allow. A give-back or release that fails is an
// error that says something ran (ranError) and carries the give-back: the
// fail mode hands both to the recorder, which sends them until Redis
// answers, each landing once (the give-back under its id, a held slot
// against its record).
// Standalone and Sentinel always use one call.
//
// When a call fails in a cluster, the store asks the client to reload its
// slot map, so a promoted replica takes over the dead master's slots as
// soon as the cluster has failed over (go-redis by itself reloads only on
// MOVED, which a dead node never answers, or every 60s).
//
// Redis 5.0 or later is required (scripts replicated by effects, so that
// they may read TIME before writing).
//
// Reset scans the tenant's keys (SCAN MATCH on the escaped tenant, on every
// master of a cluster) and deletes them.
type RedisStore struct {
	client  redis.UniversalClient
	cluster *redis.ClusterClient // non-nil when client is one
	prefix  string
	timeout time.Duration
	observe func(script, result string, d time.Duration)
	// observeQueue: RedisOptions.ObserveQueue; queueTimeout its limit.
	observeQueue func(wait time.Duration, shed bool)
	queueTimeout time.Duration
	pool         sync.Pool

	// batch sends concurrent calls in one pipeline (standalone and
	// Sentinel); nodeBatchers does per node in a cluster (by
	// *redis.Client); noBatch sends every call on its own.
	batch        *batcher
	nodeBatchers sync.Map
	noBatch      bool
	// functions: batchers call lua.Library's functions (Functions).
	functions bool

	// now, when set (tests only), gives the scripts the instant in µs to
	// use instead of Redis TIME. Production never sets it.
	now func() int64
}

var _ Store = (*RedisStore)(nil)

// NewRedisStore returns a store on opts.Client.
func NewRedisStore(opts RedisOptions) *RedisStore {
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultRedisTimeout
	}
	s := &RedisStore{
		client:  opts.Client,
		prefix:  opts.Prefix,
		timeout: opts.Timeout,
		observe: opts.Observe,

		observeQueue: opts.ObserveQueue,
		queueTimeout: opts.queueTimeout(), // after Timeout's default
	}
	s.cluster, _ = opts.Client.(*redis.ClusterClient)
	s.pool.New = func() any { return new(redisScratch) }
	s.noBatch = opts.NoBatch
	s.functions = opts.Functions
	if s.cluster == nil && !s.noBatch {
		s.batch = newBatcher(opts.Client.Pipeline, nil, s.functions, s.queueTimeout)
	}
	return s
}

// redisScratch is the per-call working memory of a RedisStore, pooled.
type redisScratch struct {
	buf   []byte
	keys  []string // key of each check
	slots []uint16 // cluster: hash slot of each check
	ckeys []string // keys of the current script call
	okeys []string // keys of the current call with its id key
	nums  []int64  // numeric arguments of the current call, 5 per check
	args  []any
	all   []int   // 0..n-1
	cal   []int64 // period boundaries of the calendar checks (appendCalendarArgs)
	// results receives the replies of Charge, units the units
	// each check of a Charge moved.
	results []Result
	units   []int64
	// once is the id key of the current force call ("" for none).
	once string
	// inFlight: a batch may still send args (its caller gave up).
	inFlight bool
}

// prepare builds the key (and, in a cluster, the slot) of every check and
// reports whether the checks span several slots.
func (s *RedisStore) prepare(sc *redisScratch, checks []Check) (multiSlot bool) {
	sc.keys = sc.keys[:0]
	sc.slots = sc.slots[:0]
	sc.all = sc.all[:0]
	for i := range checks {
		c := &checks[i]
		sc.buf = AppendKey(sc.buf[:0], s.prefix, c.Algorithm, c.Tenant, c.Policy, c.Part)
		sc.keys = append(sc.keys, string(sc.buf))
		sc.all = append(sc.all, i)
		if s.cluster != nil {
			slot := keySlot(sc.buf)
			sc.slots = append(sc.slots, slot)
			if slot != sc.slots[0] {
				multiSlot = true
			}
		}
	}
	return multiSlot
}

// groups splits the checks by hash slot, in order of first appearance.
func (sc *redisScratch) groups() [][]int {
	var gs [][]int
	var gslots []uint16
outer:
	for i, slot := range sc.slots {
		for g, gs2 := range gslots {
			if gs2 == slot {
				gs[g] = append(gs[g], i)
				continue outer
			}
		}
		gslots = append(gslots, slot)
		gs = append(gs, []int{i})
	}
	return gs
}

func validateAll(checks []Check, results []Result) error {
	if len(results) < len(checks) {
		return errShortResults
	}
	for i := range checks {
		if err := checks[i].validate(); err != nil {
			return err
		}
	}
	return nil
}

// Decide implements Store with the semantics of MemoryStore.Decide, in one
// atomic script call (see RedisStore for Redis Cluster).
func (s *RedisStore) Decide(ctx context.Context, checks []Check, results []Result) (bool, error) {
	if err := validateAll(checks, results); err != nil {
		return false, err
	}
	if len(checks) == 0 {
		return true, nil
	}
	sc := s.getScratch()
	defer s.putScratch(sc)
	multi := s.prepare(sc, checks)
	if !multi {
		admitted, err := s.run(ctx, sc, scriptDecide, checks, sc.all, results)
		return admitted, err
	}
	return s.decideSlots(ctx, sc, checks, results)
}

// decideSlots decides checks that span several cluster slots, slot by slot
// with compensation (see RedisStore).
func (s *RedisStore) decideSlots(ctx context.Context, sc *redisScratch, checks []Check, results []Result) (bool, error) {
	var done [][]int // the groups that admitted, so were charged
	admitted := true
	var err error
	for _, g := range sc.groups() {
		if !admitted {
			// Denied already: only evaluate, for the results.
			if _, err = s.run(ctx, sc, scriptDry, checks, g, results); err != nil {
				break
			}
			continue
		}
		var ok bool
		if ok, err = s.run(ctx, sc, scriptDecide, checks, g, results); err != nil {
			break
		}
		if ok {
			done = append(done, g)
		} else {
			admitted = false
		}
	}
	if err == nil && admitted {
		return true, nil
	}
	return false, s.compensate(ctx, checks, done, results, err)
}

// compensate gives back what the slots listed in done charged before a
// later slot denied the request (or its call failed with err): every check
// that allowed with a positive cost. Concurrency slots are released
// (against their hold, when they carry one); the other checks' units are
// given back at the instant they were charged, by one Charge under a new
// id. When either fails, the error is a ranError (something ran), and one
// whose give-back failed carries it, id and all, so that DecideOrFallback
// hands it to the recorder: sent again, it lands once. A release that
// timed out (a stalled node) leaves the give-back to the recorder
// unsent, so the request waits one timeout, not two. A check given back
// reports its bucket afterwards. When err is nil, every slot answered and
// one denied: the ranError says so (denied), and the denial stands.
func (s *RedisStore) compensate(ctx context.Context, checks []Check, done [][]int, results []Result, err error) error {
	// A client gone meanwhile leaves what it was charged to give back:
	// the store's timeout bounds these calls, not the request.
	ctx = context.WithoutCancel(ctx)
	var slots, back []Check
	var slotOf, backOf []int
	for _, g := range done {
		for _, i := range g {
			c := &checks[i]
			switch {
			case !results[i].Allowed || c.Cost <= 0:
			case takesSlots(c):
				slots = append(slots, *c)
				slotOf = append(slotOf, i)
			default:
				back = append(back, giveBackCheck(c, results[i].At))
				backOf = append(backOf, i)
			}
		}
	}
	ran := ranError{denied: err == nil}
	if len(slots) > 0 {
		if rerr := s.Release(ctx, slots); rerr != nil {
			ran.err = fmt.Errorf("limiter: release after a cross-slot denial: %w", rerr)
		} else {
			for _, i := range slotOf {
				results[i].Remaining = min(results[i].Remaining+checks[i].Cost, checks[i].Rate.Limit)
			}
		}
	}
	if len(back) > 0 {
		id := NewChargeID()
		got := make([]Result, len(back))
		var gerr error
		if ran.err != nil && IsTimeout(ran.err) {
			gerr = errGiveBackBehindStall
		} else {
			gerr = s.charge(ctx, id, back, make([]int64, len(back)), got)
		}
		if gerr != nil {
			ran.err = errors.Join(ran.err, fmt.Errorf("limiter: give-back after a cross-slot denial: %w", gerr))
			ran.giveBackID, ran.giveBack = id, back
		} else {
			for k, i := range backOf {
				// Allowed, as the check was, with nothing kept: no wait.
				results[i].Remaining, results[i].Reset = got[k].Remaining, got[k].Reset
				results[i].RetryAfter, results[i].Wait = 0, 0
			}
		}
	}
	if ran.err != nil {
		// Its slots were taken or its units charged: the error must not
		// say that nothing ran (NotSent), or no one gives them back.
		ran.err = errors.Join(err, ran.err)
		return ran
	}
	return err
}

// errGiveBackBehindStall is why a cross-slot give-back was left to the
// recorder unsent: the release before it, to a node of the same request,
// timed out.
var errGiveBackBehindStall = errors.New("not sent: the release before it timed out")

// Peek implements Store with the semantics of MemoryStore.Peek.
func (s *RedisStore) Peek(ctx context.Context, checks []Check, results []Result) error {
	if err := validateAll(checks, results); err != nil {
		return err
	}
	if len(checks) == 0 {
		return nil
	}
	sc := s.getScratch()
	defer s.putScratch(sc)
	multi := s.prepare(sc, checks)
	if !multi {
		_, err := s.run(ctx, sc, scriptPeek, checks, sc.all, results)
		return err
	}
	for _, g := range sc.groups() {
		if _, err := s.run(ctx, sc, scriptPeek, checks, g, results); err != nil {
			return err
		}
	}
	return nil
}

// Charge implements Charger with the force mode of the decide script (see
// lua/decide.lua): a positive cost charges what fits down to the bucket's
// empty under the check's rate (min_interval ignored; concurrency buckets
// never charged), a negative one gives units back to a token bucket or
// GCRA bucket that exists, never beyond full. It is one script call per
// cluster slot (one for Standalone and Sentinel), each with the store's
// Timeout; with an id each call carries that id's key in its slot, so a
// retry is applied once (see IdempotencyTTL). A check outside the numeric
// domain is not sent and gets charged[i] = ChargeRefused; the others are
// moved all the same. On error charged[i] is ChargeFailed for every check
// whose call failed or was not made (a call that timed out may still have
// run: retry it with the same id).
func (s *RedisStore) Charge(ctx context.Context, id string, checks []Check, charged []int64) error {
	return s.charge(ctx, id, checks, charged, nil)
}

// charge is Charge; when out is not nil, out[i] receives the bucket of
// check i after its call (remaining and reset).
func (s *RedisStore) charge(ctx context.Context, id string, checks []Check, charged []int64, out []Result) error {
	if len(charged) < len(checks) {
		return errShortResults
	}
	valid := 0
	for i := range checks {
		charged[i] = ChargeFailed
		if chargeable(&checks[i]) != nil {
			// One bad entry must not keep the others from being charged.
			charged[i] = ChargeRefused
			continue
		}
		valid++
	}
	if valid == 0 {
		return nil
	}
	sc := s.getScratch()
	defer s.putScratch(sc)
	multi := s.prepare(sc, checks)
	sc.results = resizeSlice(sc.results, len(checks))
	sc.units = resizeSlice(sc.units, len(checks))
	results := sc.results
	groups := [][]int{sc.all}
	if multi {
		groups = sc.groups()
	}
	for _, g := range groups {
		if valid < len(checks) {
			g = slices.DeleteFunc(slices.Clone(g), func(i int) bool { return charged[i] == ChargeRefused })
		}
		if len(g) == 0 {
			continue
		}
		sc.once = ""
		if id != "" {
			sc.buf = appendOnceKey(sc.buf[:0], s.prefix, checks[g[0]].Tenant, id)
			sc.once = string(sc.buf)
		}
		_, err := s.run(ctx, sc, scriptForce, checks, g, results)
		if err != nil {
			return err
		}
		for _, i := range g {
			charged[i] = sc.units[i]
			if out != nil {
				out[i] = results[i]
			}
		}
	}
	return nil
}

// run calls the decide script in script's mode on the checks idx and
// stores their results (an admitted decision's checks with its instant,
// Result.At). It returns the script's admission.
func (s *RedisStore) run(ctx context.Context, sc *redisScratch, script *redisScript, checks []Check, idx []int, results []Result) (bool, error) {
	var nowArg any = argZero
	if s.now != nil {
		nowArg = strconv.FormatInt(s.now(), 10)
	}
	if need := 2 + checkArgs*len(idx); cap(sc.args) < need {
		sc.args = make([]any, 0, need)
	}
	acquire := script == scriptDecide && holdsAll(checks, idx)
	switch {
	case script == scriptForce && sc.once != "":
		sc.args = append(sc.args[:0], argForceOnce, nowArg)
	case acquire:
		sc.args = append(sc.args[:0], argAcquire, nowArg)
	default:
		sc.args = append(sc.args[:0], script.mode, nowArg)
	}
	keys := sc.appendCheckArgs(checks, idx)
	if script == scriptForce && sc.once != "" {
		keys = sc.withOnceKey(keys)
	}
	if acquire {
		keys = s.appendHoldKeys(sc, append(sc.okeys[:0], keys...), checks, idx)
		sc.okeys = keys
	}
	turns := handsOutTurns(script)
	if turns {
		sc.setDelayArgs(checks, idx)
	}
	if hasCalendar(checks, idx) {
		sc.appendCalendarArgs(checks, idx, s.gatewayNow())
	}
	reply, err := s.eval(ctx, sc, script, keys, sc.args)
	if err != nil {
		return false, err
	}
	var units []int64
	if script == scriptForce {
		units = sc.units
	}
	admitted, at, err := parseReply(reply, idx, results, units)
	if err == nil && admitted && script == scriptDecide {
		for _, i := range idx {
			results[i].At = at * int64(time.Microsecond)
		}
	}
	if turns && err == nil {
		takeWaits(idx, results)
	}
	return admitted, err
}

// getScratch and putScratch pool the per-call memory; a scratch whose
// arguments a batch may still send is left to the garbage collector.
func (s *RedisStore) getScratch() *redisScratch {
	sc := s.pool.Get().(*redisScratch)
	sc.inFlight = false
	return sc
}

func (s *RedisStore) putScratch(sc *redisScratch) {
	if !sc.inFlight {
		s.pool.Put(sc)
	}
}

// Release implements Store: every Concurrency check gives back Cost units
// of its bucket (never going below zero; a bucket that expired or was reset
// is left alone). Pass only the checks that were charged, and whose
// acquire answered: when every one carries its Hold, each slot is given
// back once, against its acquire's record (see hold.go; retry a release
// that failed with releaseLost, as Recorder.RetryRelease does).
func (s *RedisStore) Release(ctx context.Context, checks []Check) error {
	return s.release(ctx, checks, argReleaseSure)
}

// releaseLost implements lostReleaser: Release for slots whose acquire
// may or may not have run, or whose release may have run already.
func (s *RedisStore) releaseLost(ctx context.Context, checks []Check) error {
	return s.release(ctx, checks, argReleaseUnsure)
}

// release is Release; mode says what a missing hold record means
// (lua/release.lua).
func (s *RedisStore) release(ctx context.Context, checks []Check, mode any) error {
	sc := s.getScratch()
	defer s.putScratch(sc)
	sc.keys = sc.keys[:0]
	sc.slots = sc.slots[:0]
	sc.args = sc.args[:0]
	sc.all = sc.all[:0]
	multi := false
	for i := range checks {
		c := &checks[i]
		if c.Algorithm != Concurrency {
			continue
		}
		if c.Cost < 0 {
			return c.validate()
		}
		if c.Cost == 0 {
			continue // nothing taken (and no hold key: see appendHoldKeys)
		}
		sc.buf = AppendKey(sc.buf[:0], s.prefix, c.Algorithm, c.Tenant, c.Policy, c.Part)
		sc.keys = append(sc.keys, string(sc.buf))
		sc.args = append(sc.args, c.Cost)
		sc.all = append(sc.all, i)
		if s.cluster != nil {
			sc.slots = append(sc.slots, keySlot(sc.buf))
			multi = multi || sc.slots[len(sc.slots)-1] != sc.slots[0]
		}
	}
	if len(sc.keys) == 0 {
		return nil
	}
	// sc.all maps each key to its check.
	held := holdsAll(checks, sc.all)
	if !multi {
		keys, args := sc.keys, sc.args
		if held {
			keys = s.appendHoldKeys(sc, slices.Clip(keys), checks, sc.all)
			args = append(args, mode)
		}
		_, err := s.eval(ctx, sc, scriptRelease, keys, args)
		return err
	}
	checkOf := slices.Clone(sc.all)
	for _, g := range sc.groups() {
		keys := make([]string, len(g))
		args := make([]any, len(g))
		idx := make([]int, len(g))
		for j, i := range g {
			keys[j], args[j], idx[j] = sc.keys[i], sc.args[i], checkOf[i]
		}
		if held {
			keys = s.appendHoldKeys(sc, keys, checks, idx)
			args = append(args, mode)
		}
		if _, err := s.eval(ctx, sc, scriptRelease, keys, args); err != nil {
			return err
		}
	}
	return nil
}

// resetChunk is how many parts one call of a reset deletes at most: a
// script blocks Redis for every other client while it runs (about 1 ms
// per thousand keys here), and a tenant may have many parts.
const resetChunk = 1000

// resetMaxCalls bounds the calls of one Reset: parts written while it
// runs are deleted too, and traffic that adds parts faster than a call
// deletes them must not keep it running.
const resetMaxCalls = 10000

// What each key of a reset is (lua/reset.lua): a bucket, deleted, or a
// partition index, whose members are deleted.
var (
	argResetBucket any = "0"
	argResetIndex  any = "1"
)

// Reset implements Store: it deletes the buckets of tenant in each of
// policies with script calls (lua.Reset; a tenant's keys share one
// cluster slot). For each policy that is its bucket under every
// algorithm's name (so a policy whose algorithm changed loses its old
// bucket too) and the buckets of every part its partition index lists
// (lua/common.lua: every write of a partitioned bucket keeps it there),
// resetChunk parts per call, until none is left. Nothing is scanned: a
// reset costs Redis O(policies + parts), whatever else the keyspace
// holds.
func (s *RedisStore) Reset(ctx context.Context, tenant string, policies []string) error {
	if len(policies) == 0 {
		return nil
	}
	n := len(policies) * (int(numAlgorithms) + 1)
	keys, args := make([]string, 0, n), make([]any, 1, n+1)
	args[0] = resetChunk
	var b []byte
	for _, p := range policies {
		for a := range Algorithm(numAlgorithms) {
			b = AppendKey(b[:0], s.prefix, a, tenant, p, "")
			keys, args = append(keys, string(b)), append(args, argResetBucket)
		}
		b = appendPartIndexKey(b[:0], s.prefix, tenant, p)
		keys, args = append(keys, string(b)), append(args, argResetIndex)
	}
	sc := s.getScratch()
	defer s.putScratch(sc)
	for range resetMaxCalls {
		reply, err := s.eval(ctx, sc, scriptReset, keys, args)
		if err != nil {
			return err
		}
		if len(reply) != 2 {
			return fmt.Errorf("limiter: redis reset: reply of %d values, want 2", len(reply))
		}
		if reply[1] == 0 {
			return nil
		}
	}
	return fmt.Errorf("limiter: redis reset of tenant %q: parts still left after %d calls of %d", tenant, resetMaxCalls, resetChunk)
}

// appendPartIndexKey appends the key of the partition index of tenant in
// policy, <prefix>:parts:{<tenant>}:<policy>: the set of the bucket keys
// of the tenant's parts of the policy, which the scripts keep (see
// index_part in lua/common.lua, which derives the same name from a
// bucket key).
func appendPartIndexKey(dst []byte, prefix, tenant, policy string) []byte {
	dst = append(dst, prefix...)
	dst = append(dst, ":parts:{"...)
	dst = AppendTenantTag(dst, tenant)
	dst = append(dst, "}:"...)
	return append(dst, policy...)
}

// Ping asks Redis whether it answers: one PING (one per master of a
// cluster, after the slot map is loaded or reloaded), all within the
// store's Timeout. A breaker's background probe (BreakerOptions.Probe).
func (s *RedisStore) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var err error
	if s.cluster != nil {
		err = s.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() })
	} else {
		err = s.client.Ping(ctx).Err()
	}
	if err != nil {
		return fmt.Errorf("limiter: redis ping: %w", err)
	}
	return nil
}

// Close implements Store. It does not close the client, which the store
// does not own.
func (s *RedisStore) Close() error { return nil }
