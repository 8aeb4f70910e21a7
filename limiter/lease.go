package limiter

import (
	"context"
	"errors"
	"time"
)

// The default lease ttl (Lease.TTL unset) is a sixth of the bucket's
// window, within these bounds.
//
// Why a share of the window: a lease serves a tenant only if the tenant
// comes back within the ttl, so a tenant seen every second or two is
// decided by the store on every request under a 1s ttl, and that thin
// tail is most of a fleet's tenants. What a longer ttl costs is bounded
// elsewhere: a lease is never more than the requests seen over the last
// ttl nor more than remaining/(2 x instances), window leases end with
// their window, unspent units go back, and a reset reaches every
// instance at once. What it does cost is staleness: the headers of a
// request served from a lease count down from the store's answer when
// the lease was taken. A sixth of the window keeps that to a small part
// of what the headers describe, and the 10s cap keeps it to seconds. (A
// tenant seen once costs the lease cache a hash for a ttl, and one seen
// more often an entry until it has been idle for a ttl: see lookup.)
const (
	MinDefaultLeaseTTL = time.Second
	MaxDefaultLeaseTTL = 10 * time.Second
)

// Lease lets an instance take a policy's units from the shared store ahead
// of demand and serve them locally (see LeaseStore).
type Lease struct {
	// Max is the most requests one store call may cover; 0 disables
	// leasing.
	Max int64
	// TTL is how long leased units may be served before what is left goes
	// back; 0 means the default for the bucket's window (see TTLFor).
	TTL time.Duration
}

// Enabled reports whether l leases at all.
func (l Lease) Enabled() bool { return l.Max > 0 }

// TTLFor is how long l's units of a bucket with window may be served:
// TTL when set, else a sixth of window between MinDefaultLeaseTTL and
// MaxDefaultLeaseTTL (1h, a day or a calendar month: 10s; 1m: 10s; 10s:
// 1.67s; 1s: 1s).
func (l Lease) TTLFor(window time.Duration) time.Duration {
	if l.TTL > 0 {
		return l.TTL
	}
	return min(max(window/6, MinDefaultLeaseTTL), MaxDefaultLeaseTTL)
}

// ErrLeaseUnsupported is returned by a LeaseTaker that cannot lease the
// given checks: an algorithm that cannot lease, checks whose buckets span
// several Redis Cluster slots, or a store without leases.
var ErrLeaseUnsupported = errors.New("limiter: these checks cannot be leased")

// LeaseRequest asks a LeaseTaker to give back what is left of a lease and
// to take a new one, in one call.
type LeaseRequest struct {
	// Checks are one request's checks; every algorithm must SupportsLease
	// and each Cost is the units of one request. Shadow flags are ignored.
	Checks []Check
	// Want is how many requests the lease should cover; 0 only gives back.
	Want int64
	// Instances is the number of live instances sharing the budget; a
	// bucket hands one lease at most remaining/(2 x Instances) of itself.
	// Less than 1 means 1.
	Instances int
	// TTL caps LeaseGrant.Expires; 0 means MinDefaultLeaseTTL.
	TTL time.Duration
	// GiveBack is how many requests' worth of units (each check's Cost
	// times GiveBack) of an earlier lease on the same checks go back
	// first, and GiveBackAt that lease's LeaseGrant.At.
	GiveBack   int64
	GiveBackAt int64
	// ID, when not empty, makes the give-back land once (see
	// NewChargeID): set it on a call that gives units back, and keep it
	// to retry the call when its reply is lost.
	ID string
	// Retry sends the call with ID again after its reply was lost, with
	// Want 0: its give-back is made if the lost call did not run, and the
	// units the lost call granted (which no request will be served from)
	// go back if it did. Once either way.
	Retry bool
}

// LeaseGrant is a LeaseTaker's answer.
type LeaseGrant struct {
	// Requests is how many requests' worth of units were taken from every
	// bucket (each check's Cost times Requests). 0 with Want > 0 denies one
	// request: the results then say why, as Decide would.
	Requests int64
	// At is the store's instant of the grant (µs), for GiveBackAt.
	At int64
	// Expires is how long the units may be served from now: TTL, cut at
	// the end of the current window for window algorithms.
	Expires time.Duration
}

// LeaseTaker is a store that can lease units. RedisStore and a
// BreakerStore around one are LeaseTakers.
type LeaseTaker interface {
	// Lease gives back req.GiveBack and takes up to req.Want requests'
	// worth of units from every bucket of req.Checks, all or nothing, and
	// fills results: after a grant, each bucket's remaining quota without
	// the leased units; after a denial, what Decide would answer.
	Lease(ctx context.Context, req *LeaseRequest, results []Result) (LeaseGrant, error)
}
