package tollgate

import (
	"context"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// redisBackends holds one backend per (connection, key prefix, breaker
// settings). Like the clients, backends are shared by every handler that
// uses them and survive config reloads, so the breaker state, the instance
// heartbeat and the units owed to Redis after an outage carry over.
var redisBackends = caddy.NewUsagePool()

// recoveryFlushInterval is how often a backend charges Redis for units its
// fallback admitted, once Redis answers again.
const recoveryFlushInterval = time.Second

// redisBackend is the Redis side of Tollgate for one prefix: the store
// behind a circuit breaker, the live-instance registry, and the recorder of
// what the local fallback admitted while Redis failed.
type redisBackend struct {
	clientKey string
	store     *limiter.BreakerStore
	registry  *limiter.Registry
	recorder  *limiter.Recorder
	// dials remembers the client's failed dials, to name the cause of a
	// timeout; timeout is the per-call deadline.
	dials   *dialErrors
	timeout time.Duration
	// users are the handlers attached to the backend; logger writes
	// through the newest one's logger.
	users    backendUsers
	logger   *zap.Logger
	cooldown time.Duration
	// denials is the denial stream <prefix>:denials; its writer starts
	// when the first handler with denials_stream acquires it.
	denials *denialStream
	// overrides mirrors the runtime overrides stored in Redis.
	overrides *redisOverrides

	stop chan struct{}
	done chan struct{}
}

// Destruct implements caddy.Destructor: a last flush (of the units owed
// and of the buffered denials), then the heartbeat entry is removed and the
// client released.
func (b *redisBackend) Destruct() error {
	close(b.stop)
	<-b.done
	b.flush()
	b.denials.close()
	b.overrides.close()
	_ = b.registry.Close()
	_, err := redisClients.Delete(b.clientKey)
	return err
}

// observeRedis records a Redis round trip while any attached handler
// records metrics.
func (b *redisBackend) observeRedis(script, result string, d time.Duration) {
	if b.users.recordsMetrics() {
		observeRedis(script, result, d)
	}
}

// fallbackScale is the share of each limit one instance grants alone while
// Redis fails: 70% split over the last known live instances.
func (b *redisBackend) fallbackScale() float64 {
	return fallbackShare / float64(b.registry.Count())
}

// breakerChanged logs one line per breaker transition (never per request)
// and sets the gauge. It runs under the breaker's lock: no store calls.
func (b *redisBackend) breakerChanged(open bool, err error) {
	setBreakerOpen(open)
	if open {
		err = b.dials.explain(err, max(time.Second, 2*b.timeout))
		b.logger.Warn("rate limit store unreachable ("+failureCause(err)+"): circuit breaker open, deciding by fail mode",
			causeField(err), zap.Error(err), zap.Duration("cooldown", b.cooldown))
		return
	}
	b.logger.Info("rate limit store reachable again: circuit breaker closed")
}

// flushLoop charges Redis, while it answers, for the units admitted
// locally during failures.
func (b *redisBackend) flushLoop() {
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

func (b *redisBackend) flush() {
	if b.recorder.Pending() == 0 || b.store.Open() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := b.recorder.Flush(ctx, b.store)
	if err != nil {
		b.logger.Warn("charging Redis for units admitted during the outage", zap.Error(err))
		return
	}
	if st.Units > 0 {
		b.logger.Info("charged Redis for units admitted during the outage",
			zap.Int64("buckets", st.Buckets), zap.Int64("units", st.Units), zap.Int64("charged", st.Charged))
	}
}

// loadRedisBackend returns the shared backend of rc, creating it (and
// taking a reference on its client) on first use. Release it with
// redisBackends.Delete(key).
func loadRedisBackend(rc *RedisConfig) (*redisBackend, string, error) {
	conn := rc.connection()
	failures := rc.BreakerFailures
	if failures <= 0 {
		failures = limiter.DefaultBreakerFailures
	}
	cooldown := time.Duration(rc.BreakerCooldown)
	if cooldown <= 0 {
		cooldown = limiter.DefaultBreakerCooldown
	}
	key := fmt.Sprintf("%s|prefix=%s|breaker=%d/%s", conn.poolKey(), rc.KeyPrefix, failures, cooldown)
	v, _, err := redisBackends.LoadOrNew(key, func() (caddy.Destructor, error) {
		client, dials, clientKey, err := loadRedisClient(conn)
		if err != nil {
			return nil, err
		}
		b := &redisBackend{
			clientKey: clientKey,
			dials:     dials,
			timeout:   conn.Timeout,
			cooldown:  cooldown,
			recorder:  limiter.NewRecorder(limiter.RecorderOptions{}),
			stop:      make(chan struct{}),
			done:      make(chan struct{}),
		}
		b.logger = b.users.logger(caddy.Log().Named("http.handlers.rate_limit"))
		logger := b.logger
		redisStore := limiter.NewRedisStore(limiter.RedisOptions{
			Client:  client,
			Prefix:  rc.KeyPrefix,
			Timeout: conn.Timeout,
			Observe: b.observeRedis,
		})
		b.store = limiter.NewBreakerStore(redisStore, limiter.BreakerOptions{
			Failures:      failures,
			Cooldown:      cooldown,
			OnStateChange: b.breakerChanged,
		})
		b.registry = limiter.NewRegistry(limiter.RegistryOptions{
			Client:  client,
			Prefix:  rc.KeyPrefix,
			Timeout: conn.Timeout,
		})
		b.denials = newDenialStream(client, rc.KeyPrefix, b.registry.ID(), conn.Timeout, b.store, logger)
		b.overrides = newRedisOverrides(client, rc.KeyPrefix, conn.Timeout, logger, b.registry.ID(), func(tenant, policy string) {
			forgetLeases(b, tenant, policy)
		})
		go b.flushLoop()
		return b, nil
	})
	if err != nil {
		return nil, "", err
	}
	return v.(*redisBackend), key, nil
}

var _ caddy.Destructor = (*redisBackend)(nil)
