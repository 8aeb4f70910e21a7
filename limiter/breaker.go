package limiter

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of BreakerOptions.
const (
	DefaultBreakerFailures = 3
	DefaultBreakerCooldown = 5 * time.Second
)

// ErrBreakerOpen is the error of every call a BreakerStore refuses without
// asking its inner store, because the breaker is open.
var ErrBreakerOpen = errors.New("limiter: circuit breaker open, store not asked")

// BreakerOptions configures NewBreakerStore.
type BreakerOptions struct {
	// Failures is the number of consecutive failed calls that opens the
	// breaker; 0 means 3.
	Failures int
	// Cooldown is how long the breaker stays open before it lets one probe
	// call through; 0 means 5s.
	Cooldown time.Duration
	// Clock tells the time; nil means SystemClock.
	Clock Clock
	// OnStateChange, when not nil, is called once per change of Open():
	// with open true and the error that tripped the breaker when it opens,
	// with open false and a nil error when a probe succeeded and it closed.
	// A failed probe (the breaker stays open for another cooldown) is not a
	// change. Calls are serialized and made in the order of the changes,
	// with the breaker's lock held: the function must be quick and must not
	// call the BreakerStore.
	OnStateChange func(open bool, err error)
	// Probe, when not nil, is called in the background once each cooldown
	// has passed while the breaker is open, as a probe call would be, so
	// the breaker closes within a cooldown of the store answering again
	// even when no request comes (an idle instance must not report a
	// healthy store as down). It must bound its own duration (a
	// RedisStore's Ping does).
	Probe func(ctx context.Context) error
}

// Breaker states.
const (
	breakerClosed uint32 = iota
	breakerOpen
	breakerProbing // half-open: one probe call is in flight
)

// BreakerStore is a Store that guards another one (typically a RedisStore)
// with a circuit breaker, so that a store that fails is not asked again on
// every request:
//
//   - Closed, every call goes to the inner store. A call that fails (any
//     error of Decide, Peek, Release, Reset or Charge, timeouts included)
//     counts one failure; a call that succeeds resets the count. Calls whose
//     context the caller cancelled or that ran out of the caller's own
//     deadline, and calls refused as invalid input, count neither way.
//   - After Failures consecutive failures the breaker opens: every call
//     fails at once with ErrBreakerOpen, without I/O and without waiting.
//   - Cooldown after opening, the next call is let through as a probe (the
//     breaker is half-open); calls made meanwhile still fail fast. A probe
//     that succeeds closes the breaker; one that fails opens it for another
//     Cooldown. A probe that ends for the caller's reasons (cancelled,
//     invalid input) lets the next call probe at once; a probe that never
//     returns is replaced after Cooldown.
//
// Results of calls that started before a state change are ignored: a slow
// failure that ends after the breaker closed again does not count against
// the new period.
//
// The closed path is two atomic loads before the call and at most one
// atomic add (failure) or a load (success) after it; no lock, no
// allocation. The open path reads the clock and one atomic.
//
// Close closes the inner store.
type BreakerStore struct {
	inner    Store
	failures int32
	cooldown int64 // ns
	clock    Clock
	onChange func(open bool, err error)
	probe    func(ctx context.Context) error

	// state, until and epoch are written only with mu held; read freely.
	state atomic.Uint32
	// until is, when open, the instant (Unix ns) from which a probe may go;
	// when probing, the instant from which the probe counts as lost and may
	// be replaced.
	until atomic.Int64
	// epoch changes at every state change (and every new probe); a call
	// whose epoch is no longer current has its result ignored.
	epoch atomic.Uint64
	// fails counts consecutive failures while closed.
	fails atomic.Int32
	mu    sync.Mutex
	// probeTimer runs the background probe (Probe); closed stops it;
	// probes counts the running ones, for Close. With mu held.
	probeTimer *time.Timer
	closed     bool
	probes     sync.WaitGroup
}

var _ Store = (*BreakerStore)(nil)

// NewBreakerStore returns inner guarded by a circuit breaker.
func NewBreakerStore(inner Store, opts BreakerOptions) *BreakerStore {
	if opts.Failures <= 0 {
		opts.Failures = DefaultBreakerFailures
	}
	if opts.Cooldown <= 0 {
		opts.Cooldown = DefaultBreakerCooldown
	}
	if opts.Clock == nil {
		opts.Clock = SystemClock{}
	}
	return &BreakerStore{
		inner:    inner,
		failures: int32(min(opts.Failures, 1<<30)),
		cooldown: int64(opts.Cooldown),
		clock:    opts.Clock,
		onChange: opts.OnStateChange,
		probe:    opts.Probe,
	}
}

// Open reports whether the breaker is open (half-open included): calls
// other than a probe fail with ErrBreakerOpen.
func (b *BreakerStore) Open() bool { return b.state.Load() != breakerClosed }

// Inner returns the guarded store.
func (b *BreakerStore) Inner() Store { return b.inner }

// ticket is what before hands to after: the epoch the call belongs to and
// whether it is the probe.
type ticket struct {
	epoch uint64
	probe bool
}

// before admits a call or refuses it with ErrBreakerOpen.
func (b *BreakerStore) before() (ticket, error) {
	e := b.epoch.Load()
	if b.state.Load() == breakerClosed {
		return ticket{epoch: e}, nil
	}
	now := b.clock.Now().UnixNano()
	if now < b.until.Load() {
		return ticket{}, ErrBreakerOpen
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.state.Load() == breakerClosed:
		return ticket{epoch: b.epoch.Load()}, nil
	case now < b.until.Load():
		return ticket{}, ErrBreakerOpen
	}
	// Open past its cooldown, or a probe that is overdue: probe.
	b.until.Store(now + b.cooldown)
	e = b.epoch.Add(1)
	b.state.Store(breakerProbing)
	return ticket{epoch: e, probe: true}, nil
}

// outcome classifies a call's error for the breaker.
type outcome uint8

const (
	outcomeOK      outcome = iota
	outcomeFailed          // the store failed
	outcomeNeutral         // the caller's doing: says nothing about the store
)

func classify(ctx context.Context, err error) outcome {
	switch {
	case err == nil:
		return outcomeOK
	case CallerLeft(ctx, err), errors.Is(err, ErrInvalidCheck), errors.Is(err, errShortResults), errors.Is(err, ErrBreakerOpen),
		errors.Is(err, ErrLeaseUnsupported), errors.Is(err, ErrQueueTimeout):
		// A nested breaker's refusal is not a new failure of the store
		// either: its own breaker counted those. Nor is a call shed from
		// this instance's own queue: the host was slow, not the store.
		return outcomeNeutral
	}
	return outcomeFailed
}

// after records the outcome of a call admitted by before.
func (b *BreakerStore) after(ctx context.Context, t ticket, err error) {
	o := classify(ctx, err)
	if !t.probe {
		switch o {
		case outcomeOK:
			if b.fails.Load() != 0 && b.epoch.Load() == t.epoch {
				b.fails.Store(0)
			}
		case outcomeFailed:
			if b.epoch.Load() != t.epoch {
				return
			}
			if b.fails.Add(1) >= b.failures {
				b.trip(t.epoch, err)
			}
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.epoch.Load() != t.epoch {
		return // replaced by a later probe
	}
	switch o {
	case outcomeOK:
		b.fails.Store(0)
		b.epoch.Add(1)
		b.state.Store(breakerClosed)
		if b.onChange != nil {
			b.onChange(false, nil)
		}
	case outcomeFailed:
		b.until.Store(b.clock.Now().UnixNano() + b.cooldown)
		b.epoch.Add(1)
		b.state.Store(breakerOpen)
		b.scheduleProbe()
	default:
		// The probe told nothing: the next call probes.
		b.until.Store(0)
		b.epoch.Add(1)
		b.state.Store(breakerOpen)
		b.scheduleProbe()
	}
}

// scheduleProbe arms the background probe for the end of the cooldown;
// with b.mu held, the breaker open.
func (b *BreakerStore) scheduleProbe() {
	if b.probe == nil || b.closed {
		return
	}
	wait := time.Duration(b.until.Load() - b.clock.Now().UnixNano())
	if b.probeTimer == nil {
		b.probeTimer = time.AfterFunc(wait, b.backgroundProbe)
	} else {
		b.probeTimer.Reset(wait)
	}
}

// backgroundProbe probes the store when no call did since the cooldown
// ended (see BreakerOptions.Probe).
func (b *BreakerStore) backgroundProbe() {
	b.mu.Lock()
	if b.closed || b.state.Load() == breakerClosed {
		b.mu.Unlock()
		return
	}
	b.probes.Add(1)
	b.mu.Unlock()
	defer b.probes.Done()
	t, err := b.before()
	if err != nil || !t.probe {
		// Not due yet, or a request's probe is in flight: look again
		// when it is due.
		b.mu.Lock()
		if b.state.Load() != breakerClosed {
			b.scheduleProbe()
		}
		b.mu.Unlock()
		return
	}
	ctx := context.Background()
	b.after(ctx, t, b.probe(ctx))
}

// trip opens the breaker if it is still closed in epoch e.
func (b *BreakerStore) trip(e uint64, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state.Load() != breakerClosed || b.epoch.Load() != e {
		return
	}
	b.until.Store(b.clock.Now().UnixNano() + b.cooldown)
	b.epoch.Add(1)
	b.state.Store(breakerOpen)
	b.fails.Store(0)
	b.scheduleProbe()
	if b.onChange != nil {
		b.onChange(true, err)
	}
}

// Decide implements Store.
func (b *BreakerStore) Decide(ctx context.Context, checks []Check, results []Result) (bool, error) {
	t, err := b.before()
	if err != nil {
		return false, err
	}
	admitted, err := b.inner.Decide(ctx, checks, results)
	b.after(ctx, t, err)
	return admitted, err
}

// Peek implements Store.
func (b *BreakerStore) Peek(ctx context.Context, checks []Check, results []Result) error {
	t, err := b.before()
	if err != nil {
		return err
	}
	err = b.inner.Peek(ctx, checks, results)
	b.after(ctx, t, err)
	return err
}

// Release implements Store. While the breaker is open it fails with
// ErrBreakerOpen: slots held under ids are then released by the Recorder
// once the store answers (Decision.Release keeps them there); others stay
// taken in the inner store until its safety TTL (RedisConcurrencyTTL)
// forgets them.
func (b *BreakerStore) Release(ctx context.Context, checks []Check) error {
	t, err := b.before()
	if err != nil {
		return err
	}
	err = b.inner.Release(ctx, checks)
	b.after(ctx, t, err)
	return err
}

// releaseLost implements lostReleaser (see releaseLostTo).
func (b *BreakerStore) releaseLost(ctx context.Context, checks []Check) error {
	t, err := b.before()
	if err != nil {
		return err
	}
	err = releaseLostTo(ctx, b.inner, checks)
	b.after(ctx, t, err)
	return err
}

// Reset implements Store.
func (b *BreakerStore) Reset(ctx context.Context, tenant string, policies []string) error {
	t, err := b.before()
	if err != nil {
		return err
	}
	err = b.inner.Reset(ctx, tenant, policies)
	b.after(ctx, t, err)
	return err
}

// Charge implements Charger when the inner store does; otherwise it
// returns ErrNoCharge.
func (b *BreakerStore) Charge(ctx context.Context, id string, checks []Check, charged []int64) error {
	for i := range min(len(checks), len(charged)) {
		charged[i] = ChargeFailed
	}
	c, ok := b.inner.(Charger)
	if !ok {
		return ErrNoCharge
	}
	t, err := b.before()
	if err != nil {
		return err
	}
	err = c.Charge(ctx, id, checks, charged)
	b.after(ctx, t, err)
	return err
}

// Close implements Store: it stops the background probes, waits for one
// in flight, and closes the inner store.
func (b *BreakerStore) Close() error {
	b.mu.Lock()
	b.closed = true
	if b.probeTimer != nil {
		b.probeTimer.Stop()
	}
	b.mu.Unlock()
	b.probes.Wait()
	return b.inner.Close()
}
