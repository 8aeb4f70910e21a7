package gate

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// RedisOptions configures OpenRedis.
type RedisOptions struct {
	// Backend identifies the shared Redis backend (see BackendOptions).
	Backend fleet.BackendOptions
	// Hooks are the handler's logger and metrics observer on it.
	Hooks fleet.Hooks
	// Lease puts a lease cache in front: set it when any policy leases.
	Lease bool
	// ObserveLease counts lease units (nil: not counted).
	ObserveLease func(policy string, ev limiter.LeaseEvent, units int64)
	// DenialsStream is the denial stream's length the handler asks for;
	// 0: it writes none.
	DenialsStream int
	// History, when set, keeps the handler's usage history in Redis.
	History *fleet.HistoryOptions
	// Notify, when set, sends the handler's webhooks (markers in Redis).
	Notify *fleet.NotifyOptions
	// Logger logs what is specific to the handler.
	Logger *zap.Logger
}

// Redis is the Store of a handler with a redis block: its stack on the
// backend shared by every handler with the same Redis settings (see
// fleet.Backend and fleet.Stack).
type Redis struct {
	backend     *fleet.Backend
	attachment  *fleet.Attachment
	stack       *fleet.Stack
	fallbackKey string
	denials     *fleet.DenialStream
	denialsLen  int
	history     *fleet.History
	notifier    *fleet.Notifier
	closed      bool
}

var _ Store = (*Redis)(nil)

// OpenRedis attaches to the shared backend of o.Backend and builds the
// handler's store stack on it.
func OpenRedis(o RedisOptions) (*Redis, error) {
	backend, err := fleet.Acquire(o.Backend)
	if err != nil {
		return nil, fmt.Errorf("redis: %v", err)
	}
	r := &Redis{backend: backend, attachment: backend.Attach(o.Hooks)}
	fallback, key, err := loadFallbackStore()
	if err != nil {
		r.attachment.Detach()
		return nil, errors.Join(err, backend.Release())
	}
	r.fallbackKey = key
	r.stack = fleet.NewStack(backend, fleet.StackOptions{Fallback: fallback, Lease: o.Lease, Logger: o.Logger, ObserveLease: o.ObserveLease})
	if o.DenialsStream > 0 {
		r.denials, r.denialsLen = backend.Denials(), o.DenialsStream
		r.denials.Acquire(o.DenialsStream)
	}
	if o.History != nil {
		r.history = backend.NewHistory(*o.History)
	}
	if o.Notify != nil {
		r.notifier = backend.NewNotifier(*o.Notify)
	}
	return r, nil
}

// Decide implements Store.
func (r *Redis) Decide(ctx context.Context, d *limiter.Decision, items []limiter.Item) error {
	return r.stack.Decide(ctx, d, items)
}

// Settle implements Store.
func (r *Redis) Settle(ctx context.Context, d *limiter.Decision, real []int64) error {
	return r.stack.Settle(ctx, d, real)
}

// Cancel implements Store.
func (r *Redis) Cancel(ctx context.Context, d *limiter.Decision) error {
	return r.stack.Cancel(ctx, d)
}

// Release implements Store.
func (r *Redis) Release(ctx context.Context, d *limiter.Decision) error {
	return r.stack.Release(ctx, d)
}

// GiveBack implements Store.
func (r *Redis) GiveBack(ctx context.Context, d *limiter.Decision, back []bool) error {
	return r.stack.GiveBack(ctx, d, back)
}

// Peek implements Store: Redis's view, without this instance's leases.
func (r *Redis) Peek(ctx context.Context, checks []limiter.Check, results []limiter.Result) error {
	return r.stack.Store().Peek(ctx, checks, results)
}

// Reset implements Store: for the whole fleet (fleet.Backend.Reset).
func (r *Redis) Reset(ctx context.Context, tenant string, policies []string, remote string) error {
	return r.backend.Reset(ctx, tenant, policies, remote)
}

// Overrides implements Store: kept in Redis, in sync on every instance.
func (r *Redis) Overrides() Overrides { return r.backend.Overrides() }

// NearLimit implements Store: the backend's board, published for the
// fleet.
func (r *Redis) NearLimit() *fleet.NearLimitBoard { return r.backend.NearLimit() }

// NearLimitRecent implements Store: fleet-wide.
func (r *Redis) NearLimitRecent(ctx context.Context, policy string, n int) ([]fleet.NearLimitEntry, error) {
	return r.backend.NearLimitFleet(ctx, policy, n)
}

// Denials implements Store.
func (r *Redis) Denials() *fleet.DenialStream { return r.denials }

// History implements Store.
func (r *Redis) History() *fleet.History { return r.history }

// Notifier implements Store.
func (r *Redis) Notifier() *fleet.Notifier { return r.notifier }

// Penalties implements Store: the backend's, shared by the fleet.
func (r *Redis) Penalties() limiter.Penalties { return r.backend.Penalties() }

// PenaltyList implements Store: fleet-wide.
func (r *Redis) PenaltyList(ctx context.Context, tenant, policy string, n int) ([]limiter.PenaltyEntry, error) {
	return r.backend.Penalties().List(ctx, tenant, policy, n)
}

// PenaltyLift implements Store: for the whole fleet.
func (r *Redis) PenaltyLift(ctx context.Context, tenant, policy, remote string) ([]limiter.PenaltyEntry, error) {
	return r.backend.LiftPenalties(ctx, tenant, policy, remote)
}

// Status implements Store.
func (r *Redis) Status() Status {
	return Status{
		Kind:        "redis",
		KeyPrefix:   r.backend.Prefix(),
		BreakerOpen: r.backend.Store().Open(),
		Instances:   r.backend.Instances(),
		Leases:      r.stack.LeaseStats(),
	}
}

// Scope implements Store: handlers on one backend share its buckets and
// overrides.
func (r *Redis) Scope() any { return r.backend }

// Close implements Store. The stack gives its leases back first (it needs
// the backend's client); the last handler on the backend releases it. It
// may be called more than once. Requests still in flight keep working on
// what is released: a closed lease cache decides by its store, a released
// denial stream drops what it is given.
func (r *Redis) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	if r.denials != nil {
		r.denials.Release(r.denialsLen)
	}
	if r.history != nil {
		r.history.Close() // a last flush, before the client goes
	}
	if r.notifier != nil {
		r.notifier.Close()
	}
	errs := []error{r.stack.Close()}
	r.attachment.Detach()
	errs = append(errs, r.backend.Release())
	_, err := embeddedStores.Delete(r.fallbackKey)
	return errors.Join(append(errs, err)...)
}
