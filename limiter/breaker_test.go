package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// scriptedStore is a Store whose every call returns what fail says (nil:
// success); it counts the calls that reached it.
type scriptedStore struct {
	calls atomic.Int64
	mu    sync.Mutex
	fail  func(ctx context.Context) error
}

func (s *scriptedStore) set(f func(ctx context.Context) error) {
	s.mu.Lock()
	s.fail = f
	s.mu.Unlock()
}

func (s *scriptedStore) do(ctx context.Context) error {
	s.calls.Add(1)
	s.mu.Lock()
	f := s.fail
	s.mu.Unlock()
	if f == nil {
		return nil
	}
	return f(ctx)
}

func (s *scriptedStore) Decide(ctx context.Context, checks []Check, results []Result) (bool, error) {
	err := s.do(ctx)
	return err == nil, err
}
func (s *scriptedStore) Peek(ctx context.Context, _ []Check, _ []Result) error { return s.do(ctx) }
func (s *scriptedStore) Release(ctx context.Context, _ []Check) error          { return s.do(ctx) }
func (s *scriptedStore) Reset(ctx context.Context, _ string, _ []string) error { return s.do(ctx) }
func (s *scriptedStore) Close() error                                          { return nil }

// Charge makes scriptedStore a Charger.
func (s *scriptedStore) Charge(ctx context.Context, _ string, checks []Check, charged []int64) error {
	err := s.do(ctx)
	for i := range checks {
		charged[i] = checks[i].Cost
		if err != nil {
			charged[i] = -1
		}
	}
	return err
}

var errDown = errors.New("store down")

func failWith(err error) func(context.Context) error {
	return func(context.Context) error { return err }
}

// transitions records OnStateChange calls.
type transitions struct {
	mu  sync.Mutex
	log []string
}

func (tr *transitions) record(open bool, err error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if open {
		tr.log = append(tr.log, fmt.Sprintf("open(%v)", err))
	} else {
		tr.log = append(tr.log, fmt.Sprintf("close(%v)", err))
	}
}

func (tr *transitions) get() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.log...)
}

func newTestBreaker(t *testing.T, failures int, cooldown time.Duration) (*BreakerStore, *scriptedStore, *manualClock, *transitions) {
	t.Helper()
	inner := &scriptedStore{}
	clk := newManualClock(baseTime)
	tr := &transitions{}
	b := NewBreakerStore(inner, BreakerOptions{Failures: failures, Cooldown: cooldown, Clock: clk, OnStateChange: tr.record})
	return b, inner, clk, tr
}

var oneCheck = []Check{{Algorithm: FixedWindow, Tenant: "t", Policy: "p", Rate: Rate{Limit: 10, Window: time.Second}, Cost: 1}}

func decideErr(b Store) error {
	res := make([]Result, 1)
	_, err := b.Decide(context.Background(), oneCheck, res)
	return err
}

func wantLog(t *testing.T, tr *transitions, want ...string) {
	t.Helper()
	got := tr.get()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("transitions %q, want %q", got, want)
	}
}

func TestBreakerOpensAfterConsecutiveFailures(t *testing.T) {
	b, inner, clk, tr := newTestBreaker(t, 3, 5*time.Second)
	inner.set(failWith(errDown))
	for i := 0; i < 2; i++ {
		if err := decideErr(b); !errors.Is(err, errDown) {
			t.Fatalf("call %d: %v, want the store's error", i, err)
		}
		if b.Open() {
			t.Fatalf("open after %d failures", i+1)
		}
	}
	wantLog(t, tr)
	// Every method counts.
	if err := b.Peek(context.Background(), oneCheck, make([]Result, 1)); !errors.Is(err, errDown) {
		t.Fatal(err)
	}
	if !b.Open() {
		t.Fatal("closed after 3 failures")
	}
	wantLog(t, tr, "open(store down)")

	// Open: every call fails fast without reaching the store.
	before := inner.calls.Load()
	for range 100 {
		if err := decideErr(b); !errors.Is(err, ErrBreakerOpen) {
			t.Fatalf("open breaker: %v, want ErrBreakerOpen", err)
		}
	}
	for _, f := range []func() error{
		func() error { return b.Peek(context.Background(), oneCheck, make([]Result, 1)) },
		func() error { return b.Release(context.Background(), oneCheck) },
		func() error { return b.Reset(context.Background(), "t", []string{"p"}) },
		func() error { return b.Charge(context.Background(), "", oneCheck, make([]int64, 1)) },
	} {
		if err := f(); !errors.Is(err, ErrBreakerOpen) {
			t.Fatalf("open breaker: %v, want ErrBreakerOpen", err)
		}
	}
	clk.Advance(5*time.Second - time.Nanosecond)
	if err := decideErr(b); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("before the cooldown: %v", err)
	}
	if n := inner.calls.Load() - before; n != 0 {
		t.Fatalf("%d calls reached the store while open", n)
	}

	// Cooldown over: one probe; it fails: open for another cooldown, no
	// new transition.
	clk.Advance(time.Nanosecond)
	if err := decideErr(b); !errors.Is(err, errDown) {
		t.Fatalf("probe: %v, want the store's error", err)
	}
	if !b.Open() {
		t.Fatal("closed after a failed probe")
	}
	wantLog(t, tr, "open(store down)")
	clk.Advance(4 * time.Second)
	if err := decideErr(b); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("after a failed probe: %v", err)
	}

	// The next probe succeeds: closed, one transition.
	clk.Advance(time.Second)
	inner.set(nil)
	if err := decideErr(b); err != nil {
		t.Fatalf("probe: %v", err)
	}
	if b.Open() {
		t.Fatal("open after a successful probe")
	}
	wantLog(t, tr, "open(store down)", "close(<nil>)")
	if err := decideErr(b); err != nil {
		t.Fatal(err)
	}
}

func TestBreakerSuccessResetsCount(t *testing.T) {
	b, inner, _, tr := newTestBreaker(t, 3, time.Second)
	for range 10 {
		inner.set(failWith(errDown))
		decideErr(b)
		decideErr(b)
		inner.set(nil)
		if err := decideErr(b); err != nil {
			t.Fatal(err)
		}
	}
	if b.Open() {
		t.Fatal("2 failures between successes opened the breaker")
	}
	wantLog(t, tr)
}

func TestBreakerDefaults(t *testing.T) {
	inner := &scriptedStore{}
	clk := newManualClock(baseTime)
	b := NewBreakerStore(inner, BreakerOptions{Clock: clk})
	inner.set(failWith(errDown))
	decideErr(b)
	decideErr(b)
	if b.Open() {
		t.Fatal("default opened before 3 failures")
	}
	decideErr(b)
	if !b.Open() {
		t.Fatal("default did not open after 3 failures")
	}
	clk.Advance(DefaultBreakerCooldown - time.Millisecond)
	if err := decideErr(b); !errors.Is(err, ErrBreakerOpen) {
		t.Fatal(err)
	}
	clk.Advance(time.Millisecond)
	inner.set(nil)
	if err := decideErr(b); err != nil || b.Open() {
		t.Fatalf("probe after the default cooldown: %v open=%v", err, b.Open())
	}
	if b.Inner() != inner {
		t.Error("Inner")
	}
}

// TestBreakerCallerErrors: cancellation by the caller and invalid input
// are not store failures.
func TestBreakerCallerErrors(t *testing.T) {
	b, inner, clk, tr := newTestBreaker(t, 2, time.Second)
	inner.set(func(ctx context.Context) error { return ctx.Err() })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 10 {
		if _, err := b.Decide(ctx, oneCheck, make([]Result, 1)); !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	}
	dctx, dcancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer dcancel()
	for range 10 {
		b.Decide(dctx, oneCheck, make([]Result, 1))
	}
	inner.set(failWith(fmt.Errorf("wrapped: %w", ErrInvalidCheck)))
	for range 10 {
		decideErr(b)
	}
	if b.Open() {
		t.Fatal("caller errors opened the breaker")
	}

	// A store timeout (its own deadline, the caller's context alive) is a
	// failure.
	inner.set(failWith(fmt.Errorf("limiter: redis decide: %w", context.DeadlineExceeded)))
	decideErr(b)
	decideErr(b)
	if !b.Open() {
		t.Fatal("store timeouts did not open the breaker")
	}

	// A probe cancelled by its caller says nothing: the next call probes
	// at once.
	clk.Advance(time.Second)
	inner.set(func(ctx context.Context) error { return ctx.Err() })
	b.Decide(ctx, oneCheck, make([]Result, 1))
	if !b.Open() {
		t.Fatal("a cancelled probe closed the breaker")
	}
	inner.set(nil)
	if err := decideErr(b); err != nil {
		t.Fatalf("call after a cancelled probe: %v, want a probe", err)
	}
	if b.Open() {
		t.Fatal("still open")
	}
	wantLog(t, tr, "open(limiter: redis decide: context deadline exceeded)", "close(<nil>)")
}

// TestBreakerSingleProbe: while the probe is in flight, every other call
// fails fast; a probe that never returns is replaced after a cooldown.
func TestBreakerSingleProbe(t *testing.T) {
	b, inner, clk, tr := newTestBreaker(t, 1, time.Second)
	inner.set(failWith(errDown))
	decideErr(b)
	if !b.Open() {
		t.Fatal("not open")
	}
	clk.Advance(time.Second)

	release := make(chan struct{})
	entered := make(chan struct{}, 10)
	inner.set(func(context.Context) error {
		entered <- struct{}{}
		<-release
		return nil
	})
	probeDone := make(chan error)
	go func() { probeDone <- decideErr(b) }()
	<-entered

	// Concurrent callers fail fast while the probe hangs.
	var wg sync.WaitGroup
	var fast atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				if errors.Is(decideErr(b), ErrBreakerOpen) {
					fast.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if fast.Load() != 800 {
		t.Fatalf("%d of 800 calls failed fast during the probe", fast.Load())
	}

	// The probe is overdue after a cooldown: the next call replaces it.
	clk.Advance(time.Second)
	inner.set(nil)
	if err := decideErr(b); err != nil {
		t.Fatalf("replacement probe: %v", err)
	}
	if b.Open() {
		t.Fatal("replacement probe did not close")
	}
	// The first probe ends late, successfully: ignored (already closed).
	close(release)
	if err := <-probeDone; err != nil {
		t.Fatal(err)
	}
	wantLog(t, tr, "open(store down)", "close(<nil>)")
}

// TestBreakerStaleResults: a failure of a call that started before the
// breaker closed does not count against the new period.
func TestBreakerStaleResults(t *testing.T) {
	b, inner, clk, tr := newTestBreaker(t, 2, time.Second)
	release := make(chan struct{})
	entered := make(chan struct{}, 2)
	inner.set(func(context.Context) error {
		entered <- struct{}{}
		<-release
		return errDown
	})
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- decideErr(b) }()
	}
	<-entered
	<-entered
	inner.set(failWith(errDown))
	decideErr(b)
	decideErr(b) // opens
	if !b.Open() {
		t.Fatal("not open")
	}
	clk.Advance(time.Second)
	inner.set(nil)
	decideErr(b) // probe closes
	if b.Open() {
		t.Fatal("not closed")
	}
	close(release) // the two slow failures end now
	<-errs
	<-errs
	inner.set(failWith(errDown))
	decideErr(b) // first failure of the new period
	if b.Open() {
		t.Fatal("stale failures counted in the new period")
	}
	decideErr(b)
	if !b.Open() {
		t.Fatal("not open after 2 new failures")
	}
	wantLog(t, tr, "open(store down)", "close(<nil>)", "open(store down)")
}

// TestBreakerConcurrent: many goroutines on a flapping store; transitions
// alternate open/close, and the final state matches the last one.
func TestBreakerConcurrent(t *testing.T) {
	inner := &scriptedStore{}
	var opens, closes atomic.Int64
	var last atomic.Int32 // 1 open, 2 closed
	bad := atomic.Bool{}
	b := NewBreakerStore(inner, BreakerOptions{Failures: 3, Cooldown: time.Millisecond, OnStateChange: func(open bool, _ error) {
		if open {
			if last.Load() == 1 {
				bad.Store(true)
			}
			opens.Add(1)
			last.Store(1)
		} else {
			if last.Load() != 1 {
				bad.Store(true)
			}
			closes.Add(1)
			last.Store(2)
		}
	}})
	var down atomic.Bool
	inner.set(func(context.Context) error {
		if down.Load() {
			return errDown
		}
		return nil
	})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := make([]Result, 1)
			for {
				select {
				case <-stop:
					return
				default:
				}
				b.Decide(context.Background(), oneCheck, res)
			}
		}()
	}
	for range 20 {
		down.Store(true)
		time.Sleep(3 * time.Millisecond)
		down.Store(false)
		time.Sleep(3 * time.Millisecond)
	}
	// Let it settle closed.
	deadline := time.Now().Add(5 * time.Second)
	for b.Open() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if bad.Load() {
		t.Fatal("transitions did not alternate open/close")
	}
	if b.Open() || opens.Load() != closes.Load() || opens.Load() == 0 {
		t.Fatalf("open=%v after %d opens and %d closes", b.Open(), opens.Load(), closes.Load())
	}
	t.Logf("%d open/close cycles", opens.Load())
}

func TestBreakerChargeNeedsCharger(t *testing.T) {
	b := NewBreakerStore(brokenStore{}, BreakerOptions{})
	if err := b.Charge(context.Background(), "", oneCheck, make([]int64, 1)); !errors.Is(err, ErrNoCharge) {
		t.Fatalf("%v, want ErrNoCharge", err)
	}
	b2, inner, _, _ := newTestBreaker(t, 1, time.Second)
	charged := make([]int64, 1)
	if err := b2.Charge(context.Background(), "", oneCheck, charged); err != nil || charged[0] != 1 || inner.calls.Load() != 1 {
		t.Fatalf("Charge through the breaker: %v %v", err, charged)
	}
}

// TestBreakerNoAllocs: neither the closed nor the open path allocates.
func TestBreakerNoAllocs(t *testing.T) {
	b, inner, _, _ := newTestBreaker(t, 1, time.Hour)
	res := make([]Result, 1)
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() { b.Decide(ctx, oneCheck, res) }); n != 0 {
		t.Errorf("closed path: %v allocations per call", n)
	}
	inner.set(failWith(errDown))
	decideErr(b)
	if !b.Open() {
		t.Fatal("not open")
	}
	if n := testing.AllocsPerRun(1000, func() { b.Decide(ctx, oneCheck, res) }); n != 0 {
		t.Errorf("open path: %v allocations per call", n)
	}
}

func BenchmarkBreakerClosed(b *testing.B) {
	br := NewBreakerStore(&scriptedStore{}, BreakerOptions{})
	ctx := context.Background()
	b.RunParallel(func(pb *testing.PB) {
		res := make([]Result, 1)
		for pb.Next() {
			br.Decide(ctx, oneCheck, res)
		}
	})
}

// TestBreakerBackgroundProbe: with a Probe, an open breaker probes by
// itself once each cooldown has passed, without any call: a probe that
// fails keeps it open for another cooldown, one that succeeds closes it.
// Close stops the probes and leaves no goroutine behind.
func TestBreakerBackgroundProbe(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	inner := &scriptedStore{}
	inner.set(failWith(errDown))
	var probes atomic.Int64
	var probeErr atomic.Pointer[error]
	probeErr.Store(&errDown)
	var tr transitions
	const cooldown = 60 * time.Millisecond
	b := NewBreakerStore(inner, BreakerOptions{Failures: 1, Cooldown: cooldown, OnStateChange: tr.record,
		Probe: func(context.Context) error {
			probes.Add(1)
			return *probeErr.Load()
		}})
	if _, err := b.Decide(bgCtx, oneCheck, make([]Result, 1)); !errors.Is(err, errDown) || !b.Open() {
		t.Fatalf("first failure: %v, open %v", err, b.Open())
	}
	opened := time.Now()
	// Two failed probes, a cooldown apart, and still open.
	for probes.Load() < 2 {
		if time.Since(opened) > 20*cooldown {
			t.Fatalf("%d background probes after %v", probes.Load(), time.Since(opened))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if d := time.Since(opened); d < 2*cooldown {
		t.Fatalf("2 probes after %v, want one per cooldown (%v)", d, cooldown)
	}
	if !b.Open() {
		t.Fatal("closed after failed probes")
	}
	var ok error
	probeErr.Store(&ok)
	back := time.Now()
	for b.Open() {
		if time.Since(back) > cooldown+100*time.Millisecond {
			t.Fatalf("still open %v after the store answered, with no call (cooldown %v)", time.Since(back), cooldown)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if inner.calls.Load() != 1 {
		t.Errorf("%d calls reached the store, want only the first: probes are the Probe's", inner.calls.Load())
	}
	tr.mu.Lock()
	got := fmt.Sprint(tr.log)
	tr.mu.Unlock()
	if got != "[open(store down) close(<nil>)]" {
		t.Errorf("transitions %s", got)
	}
	// Open again, then closed: no probe after Close.
	if _, err := b.Decide(bgCtx, oneCheck, make([]Result, 1)); !errors.Is(err, errDown) || !b.Open() {
		t.Fatal("did not open again")
	}
	n := probes.Load()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * cooldown)
	if probes.Load() != n {
		t.Errorf("%d probes after Close", probes.Load()-n)
	}
}
