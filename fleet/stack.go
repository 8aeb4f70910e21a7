package fleet

import (
	"context"
	"errors"

	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// StackOptions configures NewStack.
type StackOptions struct {
	// Fallback is the in-process store fail_mode local decides on while
	// Redis fails; keep it apart from any store that holds real buckets
	// (it may be shared by the stacks of a process). Nil: the stack makes
	// its own and closes it with the stack.
	Fallback limiter.Store
	// Lease puts a lease cache in front of the backend: set it when any
	// policy leases.
	Lease bool
	// Logger logs what is specific to this stack (give-backs that failed).
	Logger *zap.Logger
	// ObserveLease counts lease units (limiter.LeaseOptions.Observe).
	ObserveLease func(policy string, ev limiter.LeaseEvent, units int64)
}

// Stack is one handler's store stack on a Backend, built here and only
// here, from the bottom up:
//
//	RedisStore → BreakerStore (shared, in the Backend)
//	           → fail modes over the fallback store, recording for recovery
//	           → LeaseStore (this handler's own, when a policy leases)
//
// A handler's own lease cache means a config reload (a new handler, the
// old one cleaned up) and a shutdown give every lease back.
type Stack struct {
	b        *Backend
	fallback limiter.Store
	// ownFallback is set when the stack made its fallback store.
	ownFallback bool
	leases      *limiter.LeaseStore
	store       limiter.Store // what requests are decided by: leases or b.store
}

// NewStack builds the stack of one user of b. Close it before releasing b.
func NewStack(b *Backend, opts StackOptions) *Stack {
	s := &Stack{b: b, fallback: opts.Fallback, store: b.store}
	if s.fallback == nil {
		s.fallback = limiter.NewMemoryStore(limiter.MemoryOptions{Prefix: "fallback"})
		s.ownFallback = true
	}
	if opts.Lease {
		logger := opts.Logger
		if logger == nil {
			logger = zap.NewNop()
		}
		s.leases = limiter.NewLeaseStore(limiter.LeaseOptions{
			Store:     b.store,
			Taker:     b.store,
			Recorder:  b.rec,
			Instances: b.reg.Count,
			Observe:   opts.ObserveLease,
			OnGiveBackError: func(err error) {
				logger.Debug("giving leased units back to Redis", causeField(err), zap.Error(err))
			},
		})
		s.store = s.leases
	}
	b.addStack(s)
	return s
}

// Decide decides the items of one request: by Redis (through this stack's
// leases), or, when Redis fails, by each policy's fail mode. It returns
// the store's error, nil when Redis answered; d is complete either way,
// except for input the store refused (limiter.ErrInvalidCheck), which no
// fail mode decides.
func (s *Stack) Decide(ctx context.Context, d *limiter.Decision, items []limiter.Item) error {
	fb := limiter.Fallback{Store: s.fallback, Scale: s.b.fallbackScale(), Recorder: s.b.rec}
	return d.DecideOrFallback(ctx, s.store, fb, items)
}

// Settle settles the real costs of a request d decided (see
// limiter.Decision.Settle): on Redis (paid from this stack's leases
// first), or on the fallback store while Redis fails, recorded for
// recovery.
func (s *Stack) Settle(ctx context.Context, d *limiter.Decision, real []int64) error {
	fb := limiter.Fallback{Store: s.fallback, Scale: s.b.fallbackScale(), Recorder: s.b.rec}
	return d.Settle(ctx, fb, real)
}

// Cancel gives back what d holds for a request that will not pass (see
// limiter.Decision.Cancel): on the store that decided it, a give-back
// that fails being kept for recovery.
func (s *Stack) Cancel(ctx context.Context, d *limiter.Decision) error {
	fb := limiter.Fallback{Store: s.fallback, Scale: s.b.fallbackScale(), Recorder: s.b.rec}
	return d.Cancel(ctx, fb)
}

// Release gives back the concurrency slots d holds (see
// limiter.Decision.Release): a release that fails is kept for recovery,
// and lands once.
func (s *Stack) Release(ctx context.Context, d *limiter.Decision) error {
	fb := limiter.Fallback{Store: s.fallback, Scale: s.b.fallbackScale(), Recorder: s.b.rec}
	return d.Release(ctx, fb)
}

// GiveBack gives back the units d charged for the verdicts marked in
// back, exactly once (see limiter.Decision.GiveBack).
func (s *Stack) GiveBack(ctx context.Context, d *limiter.Decision, back []bool) error {
	fb := limiter.Fallback{Store: s.fallback, Scale: s.b.fallbackScale(), Recorder: s.b.rec}
	return d.GiveBack(ctx, fb, back)
}

// Store is the store requests are decided by (with the leases in front).
func (s *Stack) Store() limiter.Store { return s.store }

// Backend is the shared backend under the stack.
func (s *Stack) Backend() *Backend { return s.b }

// LeaseStats returns this stack's lease activity per policy; nil without
// leases.
func (s *Stack) LeaseStats() map[string]limiter.LeaseStats {
	if s.leases == nil {
		return nil
	}
	return s.leases.Stats()
}

// forget drops this stack's leases and cached denials of tenant (of
// policy, when set): after a reset they would serve stale answers.
func (s *Stack) forget(tenant, policy string) {
	if s.leases != nil {
		s.leases.Forget(tenant, policy)
	}
}

// Close gives every lease back (within the lease store's give-back
// timeout) and detaches the stack from its backend. It does not release
// the backend.
func (s *Stack) Close() error {
	s.b.removeStack(s)
	var errs []error
	if s.leases != nil {
		errs = append(errs, s.leases.Close())
	}
	if s.ownFallback {
		errs = append(errs, s.fallback.Close())
	}
	return errors.Join(errs...)
}
