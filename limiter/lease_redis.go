package limiter

import (
	"context"
	"fmt"
	"strconv"

	"github.com/tollgate/caddy-tollgate/lua"
)

var (
	leaseScript     = newLuaScript(lua.Lease, "lease")
	scriptLeaseTake = &redisScript{"lease", leaseScript, nil}
	scriptLeaseGive = &redisScript{"lease_return", leaseScript, nil}

	_ LeaseTaker = (*RedisStore)(nil)
	_ LeaseTaker = (*BreakerStore)(nil)
)

// leaseLeadingArgs is the number of arguments of lease.lua before the
// checks'.
const leaseLeadingArgs = 7

// The id modes of lease.lua (ARGV[7]), boxed once.
var argLeaseOnce = [3]any{"0", "1", "2"}

// Lease implements LeaseTaker with one script call (lua.Lease). In a
// cluster the checks must share one slot (as they do when they share a
// tenant); otherwise it returns ErrLeaseUnsupported. Observe sees the call
// as script "lease", or "lease_return" when it only gives back.
func (s *RedisStore) Lease(ctx context.Context, req *LeaseRequest, results []Result) (LeaseGrant, error) {
	checks := req.Checks
	if err := validateAll(checks, results); err != nil {
		return LeaseGrant{}, err
	}
	if len(checks) == 0 || req.Want < 0 || req.GiveBack < 0 || req.Want > MaxCount || req.GiveBack > MaxCount {
		return LeaseGrant{}, fmt.Errorf("%w: a lease needs checks and non-negative counts", ErrInvalidCheck)
	}
	if req.Retry && (req.ID == "" || req.Want != 0) {
		return LeaseGrant{}, fmt.Errorf("%w: a retried lease call needs its id and takes nothing", ErrInvalidCheck)
	}
	for i := range checks {
		c := &checks[i]
		if !c.Algorithm.SupportsLease() {
			return LeaseGrant{}, fmt.Errorf("%w: %s", ErrLeaseUnsupported, c.Algorithm)
		}
		if c.Cost > 0 && (req.Want+req.GiveBack) > MaxCount/c.Cost {
			return LeaseGrant{}, fmt.Errorf("%w: a lease of %d requests of cost %d exceeds %d units", ErrInvalidCheck, req.Want+req.GiveBack, c.Cost, MaxCount)
		}
	}
	sc := s.getScratch()
	defer s.putScratch(sc)
	if s.prepare(sc, checks) {
		return LeaseGrant{}, fmt.Errorf("%w: the buckets span several cluster slots", ErrLeaseUnsupported)
	}

	var nowArg any = argZero
	if s.now != nil {
		nowArg = strconv.FormatInt(s.now(), 10)
	}
	ttl := req.TTL
	if ttl <= 0 {
		ttl = MinDefaultLeaseTTL
	}
	if need := leaseLeadingArgs + checkArgs*len(checks); cap(sc.args) < need {
		sc.args = make([]any, 0, need)
	}
	once := 0
	if req.ID != "" {
		once = 1
		if req.Retry {
			once = 2
		}
	}
	sc.args = append(sc.args[:0], nowArg, req.Want, max(req.Instances, 1), micros(ttl), req.GiveBack, req.GiveBackAt, argLeaseOnce[once])
	keys := sc.appendCheckArgs(checks, sc.all)
	if once != 0 {
		sc.buf = appendOnceKey(sc.buf[:0], s.prefix, checks[0].Tenant, req.ID)
		sc.once = string(sc.buf)
		keys = sc.withOnceKey(keys)
	}
	if hasCalendar(checks, sc.all) {
		sc.appendCalendarArgs(checks, sc.all, s.gatewayNow())
	}
	script := scriptLeaseTake
	if req.Want == 0 {
		script = scriptLeaseGive
	}
	reply, err := s.eval(ctx, sc, script, keys, sc.args)
	if err != nil {
		return LeaseGrant{}, err
	}
	var head [3]int64
	if err := parseResults(reply, head[:], sc.all, results, nil); err != nil {
		return LeaseGrant{}, err
	}
	return LeaseGrant{Requests: head[0], At: head[1], Expires: fromMicros(head[2])}, nil
}

// Lease implements LeaseTaker when the inner store does; otherwise it
// returns ErrLeaseUnsupported. A refused lease (ErrLeaseUnsupported) does
// not count as a failure of the store.
func (b *BreakerStore) Lease(ctx context.Context, req *LeaseRequest, results []Result) (LeaseGrant, error) {
	lt, ok := b.inner.(LeaseTaker)
	if !ok {
		return LeaseGrant{}, ErrLeaseUnsupported
	}
	t, err := b.before()
	if err != nil {
		return LeaseGrant{}, err
	}
	g, err := lt.Lease(ctx, req, results)
	b.after(ctx, t, err)
	return g, err
}
