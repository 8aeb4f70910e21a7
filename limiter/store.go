package limiter

import (
	"context"
	"time"
)

// Rate is the budget of one bucket.
type Rate struct {
	// Limit is the number of units admitted per Window; for Concurrency it is
	// the number of requests in flight.
	Limit int64
	// Window is the period Limit applies to. Unused by Concurrency.
	Window time.Duration
	// Burst is the capacity of a TokenBucket or GCRA bucket; 0 means Limit.
	Burst int64
	// MinInterval is the smallest gap SlidingLog allows between two admitted
	// requests; 0 means no gap is required.
	MinInterval time.Duration
	// Calendar, when set, makes a FixedWindow rate count per calendar
	// period (days, ISO weeks or months of a time zone) instead of per
	// Window; Window is then the calendar's Nominal (see CalendarRate).
	Calendar *Calendar
	// Delay is the longest a request may wait for its turn instead of
	// being denied (TokenBucket and GCRA only; 0: never wait). A request
	// the bucket would deny, but that it holds within Delay, is admitted
	// with its turn reserved: it is charged at once (the bucket goes into
	// debt) and its Result says how long to Wait. See reserveTurn.
	Delay time.Duration
}

// Capacity is the most units the bucket can hold: Burst when set, else Limit.
func (r Rate) Capacity() int64 {
	if r.Burst > 0 {
		return r.Burst
	}
	return r.Limit
}

// Check asks a store to count one request against one bucket.
type Check struct {
	// Algorithm decides how the bucket counts.
	Algorithm Algorithm
	// Tenant, Policy and Part identify the bucket (see AppendKey). Part is
	// the partition inside the tenant and may be empty.
	Tenant, Policy, Part string
	// Rate is the budget resolved for this tenant.
	Rate Rate
	// Cost is how many units the request takes; 0 only peeks.
	Cost int64
	// Shadow checks never block the request; they are charged only when
	// they would allow it themselves.
	Shadow bool
	// Lease lets a LeaseStore serve this check from locally leased units.
	// Other stores ignore it.
	Lease Lease
	// ChargedAt, for a negative Cost given back by a Charger, is the
	// instant (Unix ns, Result.At of the decision) the units were charged
	// at: window and log algorithms then give them back to the window or
	// log entry that holds them. 0 gives back token bucket and GCRA units
	// only (theirs mean the same whenever they were charged).
	ChargedAt int64
	// Hold, for a Concurrency check of positive cost, is the id of its
	// slots (NewChargeID; Decision.Decide makes one per check): a
	// RedisStore records its acquire under it, and Release then gives the
	// slots back once, also when the acquire's reply was lost (see
	// hold.go). Empty: released by count alone. Other stores ignore it.
	Hold string
}

// Result is a store's answer for one Check.
type Result struct {
	// Allowed reports whether this bucket alone admits the request. For a
	// shadow check it is the would-be decision.
	Allowed bool
	// Remaining is the number of units left after this request when it is
	// charged, or left now when it is not.
	Remaining int64
	// RetryAfter is, for a denied check, how long until the same request
	// could be admitted by this bucket. Zero when allowed.
	RetryAfter time.Duration
	// Reset is how long until the bucket has more quota than Remaining;
	// zero when it is already full.
	Reset time.Duration
	// Wait is, for a check admitted with a reserved turn (Rate.Delay), how
	// long until that turn: the request must wait that long before it
	// passes. Zero when it may pass at once, and when not allowed.
	Wait time.Duration
	// From says who answered: the store itself, a local lease or the local
	// denial cache (see LeaseStore).
	From Origin
	// At is the instant (Unix ns, the store's clock) an admitted check's
	// units were charged at: the decision's for a store, the lease's for
	// units served from a lease. Giving them back (Check.ChargedAt) needs
	// it for window and log algorithms.
	At int64
}

// Origin says who answered a check.
type Origin uint8

// Origins of a Result.
const (
	// OriginStore: the store decided (for a RedisStore, one script call).
	OriginStore Origin = iota
	// OriginLease: served from units this instance had leased; Remaining
	// and Reset are the store's last answer plus the units still leased.
	OriginLease
	// OriginDenialCache: denied locally because the store denied the same
	// request earlier and its Retry-After has not passed.
	OriginDenialCache
)

// Store keeps bucket state and decides requests atomically.
//
// Decide evaluates every check against the same instant. The request is
// admitted when every non-shadow check allows it; then every non-shadow
// check is charged, and every shadow check that allows is charged too. When
// any non-shadow check denies, nothing is charged. results must have
// len(checks) entries and receives one Result per check; the returned
// admission is the AND of the non-shadow results.
type Store interface {
	Decide(ctx context.Context, checks []Check, results []Result) (admitted bool, err error)
	// Release gives back the slots that an admitted Decide took for the
	// Concurrency checks among checks; other algorithms are ignored.
	Release(ctx context.Context, checks []Check) error
	// Peek fills results as Decide would for Cost-unit requests, without
	// charging anything.
	Peek(ctx context.Context, checks []Check, results []Result) error
	// Reset forgets every bucket of tenant in each of policies (its parts
	// too). A store is not asked to find the policies itself: a shared
	// Redis cannot list them without scanning the keyspace.
	Reset(ctx context.Context, tenant string, policies []string) error
	// Close releases the store's resources and stops its goroutines.
	Close() error
}

// Clock tells the time. Stores take one so tests can drive time by hand.
type Clock interface {
	Now() time.Time
}

// SystemClock is the wall clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }
