package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/manualclock"
)

// manualClock is a Clock that only moves when told to.
type manualClock = manualclock.Clock

func newManualClock(t time.Time) *manualClock { return manualclock.New(t) }

// baseTime is aligned to the hour, so windows of 1s, 10s, 1m and 1h start on it.
var baseTime = time.Unix(1_699_999_200, 0)

// newTestStore returns a store on a manual clock at t0 without a background
// sweeper, closed at the end of the test.
func newTestStore(t testing.TB, opts MemoryOptions) (*MemoryStore, *manualClock) {
	t.Helper()
	clk := newManualClock(baseTime)
	if opts.Clock == nil {
		opts.Clock = clk
	}
	if opts.SweepInterval == 0 {
		opts.SweepInterval = -1
	}
	m := NewMemoryStore(opts)
	t.Cleanup(func() { m.Close() })
	return m, clk
}

// giveBack gives the costs of checks back, as for a request that did not
// pass after all (Decision.Cancel): a Charge of their negated costs.
func giveBack(s Store, checks []Check) error {
	back := make([]Check, len(checks))
	for i, c := range checks {
		c.Cost = -c.Cost
		back[i] = c
	}
	return s.(Charger).Charge(context.Background(), "", back, make([]int64, len(back)))
}

// mustDecide runs one Decide and fails the test on error.
func mustDecide(t testing.TB, s Store, checks ...Check) (bool, []Result) {
	t.Helper()
	res := make([]Result, len(checks))
	ok, err := s.Decide(context.Background(), checks, res)
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	// The instant of an admission is the store's clock; tests compare
	// the rest (TestGiveBackAt checks At).
	for i := range res {
		res[i].At = 0
	}
	return ok, res
}

// mustPeek runs one Peek and fails the test on error.
func mustPeek(t testing.TB, s Store, checks ...Check) []Result {
	t.Helper()
	res := make([]Result, len(checks))
	if err := s.Peek(context.Background(), checks, res); err != nil {
		t.Fatalf("Peek: %v", err)
	}
	return res
}

// pureBucket is a pure-function model of one stored bucket: it applies the
// algorithms exactly as MemoryStore does (state written only when charged,
// sliding-log units appended to the log).
type pureBucket struct {
	algo Algorithm
	s    bucketState
	log  logRing
}

func (b *pureBucket) decide(now int64, r Rate, cost int64) Result {
	if b.algo == SlidingLog {
		b.log.trim(now - int64(r.Window))
	}
	res, next := evalAlgorithm(b.algo, b.s, &b.log, now, r, cost)
	if res.Allowed && cost > 0 {
		if b.algo == SlidingLog {
			b.log.trim(now - int64(r.Window))
			b.log.add(now, cost)
			next = bucketState{At: next.At}
		}
		b.s = next
	}
	return res
}

func (b *pureBucket) release(n int64) { b.s = concurrencyRelease(b.s, n) }

// clone returns a copy of b that shares no memory with it.
func (b *pureBucket) clone() *pureBucket {
	c := *b
	c.log.buf = append([]logEntry(nil), b.log.buf...)
	return &c
}
