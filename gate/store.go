package gate

import (
	"context"

	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// Store is what a handler decides with and reads its buckets through: the
// embedded store (Memory) or a Redis stack (Redis), behind one interface,
// so that nothing above it asks which one it is.
type Store interface {
	// Decide decides the items of one request into d. With Redis, when
	// Redis fails each policy's fail mode decides: d is complete and the
	// store's error is returned; an error wrapping limiter.ErrInvalidCheck
	// is input no store may decide (d then holds no results).
	Decide(ctx context.Context, d *limiter.Decision, items []limiter.Item) error
	// Settle charges the real costs of a metered request d admitted (see
	// limiter.Decision.Settle).
	Settle(ctx context.Context, d *limiter.Decision, real []int64) error
	// Cancel gives back what d holds for a request that will not pass
	// (see limiter.Decision.Cancel).
	Cancel(ctx context.Context, d *limiter.Decision) error
	// Release gives back the concurrency slots d holds when its request
	// is done (see limiter.Decision.Release).
	Release(ctx context.Context, d *limiter.Decision) error
	// GiveBack gives back the units d charged for the verdicts marked in
	// back, for a request whose outcome does not count (see
	// limiter.Decision.GiveBack).
	GiveBack(ctx context.Context, d *limiter.Decision, back []bool) error
	// Peek reads buckets without charging them (limiter.Store.Peek).
	Peek(ctx context.Context, checks []limiter.Check, results []limiter.Result) error
	// Reset clears the buckets of tenant in each of policies (engine
	// names), everywhere they live: with Redis, for the whole fleet.
	// remote names who asked (the audit stream).
	Reset(ctx context.Context, tenant string, policies []string, remote string) error
	// Overrides holds the runtime overrides (admin API).
	Overrides() Overrides
	// NearLimit is where tenants seen near their limit are noted.
	NearLimit() *fleet.NearLimitBoard
	// NearLimitRecent lists the tenants seen near their limit of policy
	// ("": all), newest first, at most n: with Redis, fleet-wide (an
	// error then says the other instances' lists could not be read; this
	// instance's are there).
	NearLimitRecent(ctx context.Context, policy string, n int) ([]fleet.NearLimitEntry, error)
	// Denials is the denial stream the handler writes, nil for none (it
	// needs Redis and denials_stream).
	Denials() *fleet.DenialStream
	// History is the handler's usage history, nil when it keeps none:
	// with Redis, written for the fleet.
	History() *fleet.History
	// Notifier sends the handler's webhooks, nil without notify: with
	// Redis, once per period for the fleet.
	Notifier() *fleet.Notifier
	// Penalties holds the penalty boxes decisions look up (in-process)
	// and report denials to: with Redis, shared by the fleet.
	Penalties() limiter.Penalties
	// PenaltyList lists the live boxes of tenant and policy (each "" for
	// any), the ones that end first first, at most n: with Redis,
	// fleet-wide (an error then says Redis could not be read; this
	// instance's boxes are there).
	PenaltyList(ctx context.Context, tenant, policy string, n int) ([]limiter.PenaltyEntry, error)
	// PenaltyLift lifts the boxes of tenant (of policy only, when set),
	// with Redis for the whole fleet, and returns them. remote names who
	// asked (the audit stream).
	PenaltyLift(ctx context.Context, tenant, policy, remote string) ([]limiter.PenaltyEntry, error)
	// Status describes the store for the admin API.
	Status() Status
	// Scope is what handlers sharing the store share: resets and
	// overrides are made once per scope.
	Scope() any
	// Close lets go of the store (the last user closes what is shared).
	Close() error
}

// Status describes a handler's store.
type Status struct {
	// Kind is "memory" or "redis".
	Kind string
	// KeyPrefix, BreakerOpen and Instances describe a Redis store: its
	// key prefix, its circuit breaker, the live instances on the prefix
	// (1 for the embedded store).
	KeyPrefix   string
	BreakerOpen bool
	Instances   int
	// Leases is the lease activity per policy; nil without leases.
	Leases map[string]limiter.LeaseStats
}

// Overrides is where a handler's runtime overrides live: Table answers
// the decisions (in-process, no I/O); Store changes one, for the whole
// fleet with Redis. o nil deletes. It returns the override replaced and
// whether there was one.
type Overrides interface {
	Table() *fleet.OverrideTable
	Store(ctx context.Context, tenant, policy string, o *fleet.Override, remote string) (fleet.Override, bool, error)
}
