package fleet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// BackendOptions identifies a Backend: handlers with equal options share
// one.
type BackendOptions struct {
	// Connection is the Redis to use.
	Connection Connection
	// Prefix starts every key; "" means limiter.DefaultPrefix.
	Prefix string
	// BreakerFailures and BreakerCooldown configure the circuit breaker;
	// 0 means limiter's defaults (3 failures, 5s).
	BreakerFailures int
	BreakerCooldown time.Duration
	// Functions calls the scripts as Redis 7 functions
	// (limiter.RedisOptions.Functions).
	Functions bool
	// Logger logs until a user attaches (normally the first one attaches
	// at once); nil means no logging.
	Logger *zap.Logger
}

// normalized is o with its defaults applied.
func (o BackendOptions) normalized() BackendOptions {
	if o.Prefix == "" {
		o.Prefix = limiter.DefaultPrefix
	}
	if o.BreakerFailures <= 0 {
		o.BreakerFailures = limiter.DefaultBreakerFailures
	}
	if o.BreakerCooldown <= 0 {
		o.BreakerCooldown = limiter.DefaultBreakerCooldown
	}
	o.Connection.Timeout = o.Connection.timeout()
	return o
}

func (o BackendOptions) key() string {
	return fmt.Sprintf("%s|prefix=%s|breaker=%d/%s|functions=%t", o.Connection.key(), o.Prefix, o.BreakerFailures, o.BreakerCooldown, o.Functions)
}

// recoveryFlushInterval is how often a backend charges Redis for units its
// fallback admitted, once Redis answers again.
const recoveryFlushInterval = time.Second

// Backend is the Redis side of Tollgate for one connection and key
// prefix, shared by every handler that uses them and across config
// reloads, so the breaker state, the instance heartbeat and the units owed
// to Redis after an outage carry over:
//
//   - the RedisStore behind a circuit breaker (Store);
//   - the live-instance Registry (heartbeat, Instances);
//   - the Recorder of what fail_mode local admitted while Redis failed,
//     charged back to Redis every second once it answers;
//   - the runtime overrides kept in sync with Redis (Overrides);
//   - the denial stream writer (Denials);
//   - the near-limit board, published for the fleet (NearLimit).
//
// Its background work, per instance: the heartbeat (one FCALL, or a
// script with functions off) once a second,
// one GET of the override version once a second (see OverrideSync), and
// nothing else while idle; nothing depends on the size of the keyspace.
// (While tenants cross their near-limit threshold, one pipelined write of
// the near-limit snapshot every 5 seconds.)
type Backend struct {
	opts    BackendOptions
	client  *client
	redis   *limiter.RedisStore
	store   *limiter.BreakerStore
	reg     *limiter.Registry
	rec     *limiter.Recorder
	ovr     *OverrideSync
	denials *DenialStream
	near    *NearLimitBoard
	nearPub *nearPublisher
	pen     *PenaltySync
	users   users
	logger  *zap.Logger

	stacksMu sync.Mutex
	stacks   map[*Stack]struct{}

	// probes counts the breaker's background probes.
	probes atomic.Int64

	stop chan struct{}
	done chan struct{}
}

// backends holds the shared Backends by options.
var backends pool[*Backend]

// AnyBreakerOpen reports whether the breaker of any backend in use is
// open: the process-wide state a single gauge can show. A released
// backend no longer counts, whatever its breaker's last state.
func AnyBreakerOpen() bool {
	backends.mu.Lock()
	defer backends.mu.Unlock()
	for _, it := range backends.items {
		if it.v.store.Open() {
			return true
		}
	}
	return false
}

// Acquire returns the shared Backend of opts, creating it (and its client)
// on first use. Release it when done.
func Acquire(opts BackendOptions) (*Backend, error) {
	opts = opts.normalized()
	return backends.acquire(opts.key(), func() (*Backend, error) { return newBackend(opts) })
}

func newBackend(opts BackendOptions) (*Backend, error) {
	c, err := acquireClient(opts.Connection)
	if err != nil {
		return nil, err
	}
	b := &Backend{
		opts:   opts,
		client: c,
		rec:    limiter.NewRecorder(limiter.RecorderOptions{}),
		stacks: map[*Stack]struct{}{},
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	fallback := opts.Logger
	if fallback == nil {
		fallback = zap.NewNop()
	}
	b.logger = b.users.newLogger(fallback)
	timeout := opts.Connection.Timeout
	b.redis = limiter.NewRedisStore(limiter.RedisOptions{
		// The go-redis client itself, not its wrapper: the store must see
		// a *redis.ClusterClient to batch per node and follow slots.
		Client:       c.UniversalClient,
		Prefix:       opts.Prefix,
		Timeout:      timeout,
		Observe:      b.observeRedis,
		ObserveQueue: b.observeQueue,
		Functions:    opts.Functions,
	})
	b.store = limiter.NewBreakerStore(b.redis, limiter.BreakerOptions{
		Failures:      opts.BreakerFailures,
		Cooldown:      opts.BreakerCooldown,
		OnStateChange: b.breakerChanged,
		// An idle instance closes its breaker too once Redis answers:
		// one PING per cooldown while open.
		Probe: b.probe,
	})
	b.reg = limiter.NewRegistry(limiter.RegistryOptions{
		Client:    c.UniversalClient,
		Prefix:    opts.Prefix,
		Timeout:   timeout,
		Functions: opts.Functions,
	})
	b.denials = newDenialStream(denialStreamOptions{
		client:   c,
		prefix:   opts.Prefix,
		instance: b.reg.ID(),
		timeout:  timeout,
		breaker:  b.store,
		logger:   b.logger,
		dropped:  b.dropped,
	})
	b.near = NewNearLimitBoard()
	b.nearPub = newNearPublisher(b.near, c, opts.Prefix, b.reg.ID(), b.store, b.logger)
	b.pen = newPenaltySync(penaltySyncOptions{
		client:  c,
		prefix:  opts.Prefix,
		timeout: timeout,
		breaker: b.store,
		logger:  b.logger,
		observe: b.observeRedis,
	})
	b.ovr = newOverrideSync(overrideSyncOptions{
		client:       c,
		prefix:       opts.Prefix,
		timeout:      timeout,
		logger:       b.logger,
		id:           b.reg.ID(),
		onReset:      b.forget,
		onNotice:     b.pen.handle,
		onSubscribed: b.pen.reload,
	})
	go b.flushLoop()
	return b, nil
}

// Release drops one use of b; the last one flushes what is owed to Redis
// and the buffered denials, removes the instance from the registry and
// releases the client. It returns the errors of that teardown.
func (b *Backend) Release() error {
	if !backends.release(b.opts.key()) {
		return nil
	}
	close(b.stop)
	<-b.done
	b.flush()
	// Stops the breaker's background probe (the store itself holds no
	// resource: the client is released below).
	_ = b.store.Close()
	b.denials.close()
	b.nearPub.close()
	b.ovr.close()
	b.pen.close()
	return errors.Join(b.reg.Close(), releaseClient(b.opts.Connection.key(), b.client))
}

// Attach registers a user's hooks (see users); Detach it when the user
// goes.
func (b *Backend) Attach(h Hooks) *Attachment {
	a := &Attachment{b: b, hooks: h}
	b.users.attach(a)
	return a
}

// Store is the breaker-guarded Redis store every decision goes to.
func (b *Backend) Store() *limiter.BreakerStore { return b.store }

// Prefix is the key prefix.
func (b *Backend) Prefix() string { return b.opts.Prefix }

// Instances is the number of live instances on the prefix, as the last
// heartbeat counted (1 before the first).
func (b *Backend) Instances() int { return b.reg.Count() }

// Overrides is the runtime override sync of the prefix.
func (b *Backend) Overrides() *OverrideSync { return b.ovr }

// Denials is the denial stream of the prefix.
func (b *Backend) Denials() *DenialStream { return b.denials }

// Penalties is the penalty boxes of the prefix.
func (b *Backend) Penalties() *PenaltySync { return b.pen }

// NewNotifier returns a Notifier whose once-per-period markers are in
// b's Redis, under its prefix, and whose events name this instance.
func (b *Backend) NewNotifier(o NotifyOptions) *Notifier {
	o.Client, o.Prefix, o.Instance = b.client, b.opts.Prefix, b.reg.ID()
	return NewNotifier(o)
}

// LiftPenalties lifts the boxes of tenant (of policy only, when set) for
// the whole fleet, and appends the lift to the audit stream.
func (b *Backend) LiftPenalties(ctx context.Context, tenant, policy, remote string) ([]limiter.PenaltyEntry, error) {
	return b.pen.Lift(ctx, tenant, policy, remote, b.ovr.audit)
}

// FallbackShare is the share of each limit one instance grants alone while
// Redis fails (fail_mode local): 70% of it, split over the live instances.
const FallbackShare = 0.7

// fallbackScale is FallbackShare over the last known live instances.
func (b *Backend) fallbackScale() float64 { return FallbackShare / float64(b.reg.Count()) }

// observeRedis reports a Redis round trip to the users' observer.
func (b *Backend) observeRedis(script, result string, d time.Duration) {
	if o := b.users.observe(); o != nil {
		o.RedisCall(script, result, d)
	}
}

// probe is the breaker's background probe: a PING, counted (probes).
func (b *Backend) probe(ctx context.Context) error {
	b.probes.Add(1)
	return b.redis.Ping(ctx)
}

// observeQueue reports how long a Redis call waited in this instance
// before it was written, and whether it was shed for waiting too long.
func (b *Backend) observeQueue(wait time.Duration, shed bool) {
	if o := b.users.observe(); o != nil {
		o.RedisQueued(wait, shed)
	}
}

// dropped reports denials that did not reach the stream.
func (b *Backend) dropped(reason string, n int) {
	if o := b.users.observe(); o != nil && n > 0 {
		o.DenialsDropped(reason, n)
	}
}

// breakerChanged logs one line per breaker transition (never per request)
// and reports it. It runs under the breaker's lock: no store calls.
func (b *Backend) breakerChanged(open bool, err error) {
	b.users.onBreaker(open)
	if open {
		err = b.client.dials.explain(err, max(time.Second, 2*b.opts.Connection.Timeout))
		b.logger.Warn("rate limit store unreachable ("+FailureCause(err)+"): circuit breaker open, deciding by fail mode",
			causeField(err), zap.Error(err), zap.Duration("cooldown", b.opts.BreakerCooldown))
		return
	}
	b.logger.Info("rate limit store reachable again: circuit breaker closed")
}

// flushLoop charges Redis, while it answers, for the units admitted
// locally during failures.
func (b *Backend) flushLoop() {
	defer close(b.done)
	t := time.NewTicker(recoveryFlushInterval)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			b.flush()
		}
	}
}

func (b *Backend) flush() {
	if b.rec.Pending() == 0 || b.store.Open() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	refused := b.rec.Refused()
	st, err := b.rec.Flush(ctx, b.store)
	if st.Refused > 0 && refused == 0 {
		b.logger.Warn("recovery charging: dropped buckets Redis refused as invalid (logged once)", zap.Int64("buckets", st.Refused))
	}
	if err != nil {
		b.logger.Warn("charging Redis for units admitted during the outage", causeField(err), zap.Error(err))
		return
	}
	if st.Units > 0 {
		b.logger.Info("charged Redis for units admitted during the outage",
			zap.Int64("buckets", st.Buckets), zap.Int64("units", st.Units), zap.Int64("charged", st.Charged))
	}
}

// Reset clears every bucket of tenant in each of policies in Redis, tells
// every instance to drop its leases and cached denials of them, and
// appends the reset to the audit stream. remote names who asked. The
// notice and the audit entry name the policy when there is one, and no
// policy (all of the tenant's) otherwise.
func (b *Backend) Reset(ctx context.Context, tenant string, policies []string, remote string) error {
	policy := ""
	if len(policies) == 1 {
		policy = policies[0]
	}
	b.forget(tenant, policy)
	if err := b.store.Reset(ctx, tenant, policies); err != nil {
		return err
	}
	b.ovr.publishReset(ctx, tenant, policy)
	b.ovr.audit(ctx, "reset", tenant, policy, "", "", remote)
	return nil
}

// forget drops this instance's leases and cached denials of tenant (of
// policy, when set) in every stack on b.
func (b *Backend) forget(tenant, policy string) {
	b.stacksMu.Lock()
	defer b.stacksMu.Unlock()
	for s := range b.stacks {
		s.forget(tenant, policy)
	}
}

func (b *Backend) addStack(s *Stack) {
	b.stacksMu.Lock()
	b.stacks[s] = struct{}{}
	b.stacksMu.Unlock()
}

func (b *Backend) removeStack(s *Stack) {
	b.stacksMu.Lock()
	delete(b.stacks, s)
	b.stacksMu.Unlock()
}
