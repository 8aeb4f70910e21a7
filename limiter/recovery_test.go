package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// chargeLog is a Charger that records what it was asked to charge and
// fails when told to.
type chargeLog struct {
	mu     sync.Mutex
	calls  int
	units  map[string]int64
	rates  map[string]Rate
	failAt int // call number (1-based) that fails; 0 never
}

func (c *chargeLog) Charge(_ context.Context, checks []Check, charged []int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	if c.units == nil {
		c.units, c.rates = map[string]int64{}, map[string]Rate{}
	}
	if c.calls == c.failAt {
		for i := range checks {
			charged[i] = -1
		}
		return errDown
	}
	for i, ch := range checks {
		k := ch.Tenant + "/" + ch.Policy + "/" + ch.Part
		c.units[k] += ch.Cost
		c.rates[k] = ch.Rate
		charged[i] = ch.Cost
	}
	return nil
}

// chargingStore is a Store whose Charge is a chargeLog's.
type chargingStore struct {
	brokenStore
	*chargeLog
}

func recCheck(tenant string) *Check {
	return &Check{Algorithm: SlidingWindow, Tenant: tenant, Policy: "p", Rate: Rate{Limit: 7, Window: 10 * time.Second}, Cost: 1}
}

var recRate = Rate{Limit: 10, Window: 10 * time.Second}

// TestRecorderTrailingWindow: a flush charges the units of the slots (a
// tenth of a window each) that overlap the trailing window, and forgets
// older ones.
func TestRecorderTrailingWindow(t *testing.T) {
	clk := newManualClock(baseTime) // window-aligned
	r := NewRecorder(RecorderOptions{Clock: clk})
	c := recCheck("a")
	r.Record(c, recRate, 4) // slot 0
	clk.Advance(10 * time.Second)
	r.Record(c, recRate, 2) // slot 10
	clk.Advance(5 * time.Second)
	r.Record(c, recRate, 1) // slot 15
	if r.Pending() != 1 {
		t.Fatalf("Pending %d", r.Pending())
	}
	var cl chargeLog
	st, err := r.Flush(bgCtx, &cl)
	if err != nil {
		t.Fatal(err)
	}
	// At 15s the trailing window (5s, 15s] holds slots 5..15: 2 + 1.
	if got := cl.units["a/p/"]; got != 3 || st.Units != 3 || st.Charged != 3 || st.Buckets != 1 {
		t.Fatalf("charged %d (stats %+v), want 3", got, st)
	}
	if cl.rates["a/p/"] != recRate {
		t.Errorf("rate %+v, want the unscaled %+v", cl.rates["a/p/"], recRate)
	}
	if r.Pending() != 0 {
		t.Fatal("not emptied by Flush")
	}

	// Rounded out to whole slots: units 10.5s old still count (their slot
	// overlaps the window), 11s old no more.
	for _, c := range []struct {
		age  time.Duration
		want int64
	}{{10500 * time.Millisecond, 5}, {11 * time.Second, 0}} {
		clk.Set(baseTime)
		r.Record(recCheck("b"), recRate, 5)
		clk.Advance(c.age)
		cl = chargeLog{}
		st, err = r.Flush(bgCtx, &cl)
		if err != nil || cl.units["b/p/"] != c.want {
			t.Fatalf("units %v old: charged %d (%v, %+v), want %d", c.age, cl.units["b/p/"], err, st, c.want)
		}
		if c.want == 0 && (cl.calls != 0 || st.Expired != 1) {
			t.Fatalf("old units: %d calls, stats %+v; want no call, 1 expired", cl.calls, st)
		}
	}
	// A burst late in a window and units spread over the next one: all
	// within the trailing window, all charged.
	clk.Set(baseTime.Add(9900 * time.Millisecond))
	r.Record(c, recRate, 70)
	for range 10 {
		clk.Advance(900 * time.Millisecond)
		r.Record(c, recRate, 1)
	}
	cl = chargeLog{}
	if _, err := r.Flush(bgCtx, &cl); err != nil || cl.units["a/p/"] != 80 {
		t.Fatalf("charged %d (%v), want 80", cl.units["a/p/"], err)
	}
	// Ignored: concurrency, zero units, no window.
	r.Record(&Check{Algorithm: Concurrency, Tenant: "a", Policy: "c"}, Rate{Limit: 2}, 1)
	r.Record(c, recRate, 0)
	if r.Pending() != 0 {
		t.Fatal("recorded what it should ignore")
	}
}

func TestRecorderBounded(t *testing.T) {
	clk := newManualClock(baseTime)
	r := NewRecorder(RecorderOptions{Clock: clk, MaxEntries: 3})
	for i := range 5 {
		r.Record(recCheck(fmt.Sprint(i)), recRate, 2)
	}
	r.Record(recCheck("0"), recRate, 1) // an existing bucket still counts
	if r.Pending() != 3 || r.Dropped() != 4 {
		t.Fatalf("Pending %d Dropped %d, want 3 and 4", r.Pending(), r.Dropped())
	}
	var cl chargeLog
	if _, err := r.Flush(bgCtx, &cl); err != nil {
		t.Fatal(err)
	}
	if cl.units["0/p/"] != 3 || len(cl.units) != 3 {
		t.Fatalf("charged %v", cl.units)
	}
}

// TestRecorderFlushFailure: buckets of a failed call, and of the calls not
// made, are kept and merged with what was recorded meanwhile.
func TestRecorderFlushFailure(t *testing.T) {
	clk := newManualClock(baseTime)
	r := NewRecorder(RecorderOptions{Clock: clk, Batch: 2})
	for i := range 6 {
		r.Record(recCheck(fmt.Sprint(i)), recRate, int64(i+1))
	}
	cl := chargeLog{failAt: 2}
	st, err := r.Flush(bgCtx, &cl)
	if !errors.Is(err, errDown) {
		t.Fatalf("err %v", err)
	}
	if st.Buckets != 2 || st.Charged != 1+2 {
		t.Fatalf("stats %+v, want the first batch (tenants 0, 1)", st)
	}
	if r.Pending() != 4 {
		t.Fatalf("Pending %d, want 4 kept", r.Pending())
	}
	r.Record(recCheck("5"), recRate, 10) // meanwhile
	cl = chargeLog{}
	if _, err := r.Flush(bgCtx, &cl); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"2/p/": 3, "3/p/": 4, "4/p/": 5, "5/p/": 16}
	if fmt.Sprint(cl.units) != fmt.Sprint(want) {
		t.Fatalf("second flush charged %v, want %v", cl.units, want)
	}
}

// TestRecorderFlushBreakerOpen: a flush refused by an open breaker keeps
// everything for the next one.
func TestRecorderFlushBreakerOpen(t *testing.T) {
	clk := newManualClock(baseTime)
	r := NewRecorder(RecorderOptions{Clock: clk})
	r.Record(recCheck("a"), recRate, 3)
	cl := &chargeLog{failAt: 1}
	br := NewBreakerStore(chargingStore{brokenStore{}, cl}, BreakerOptions{Failures: 1, Clock: clk})
	if _, err := r.Flush(bgCtx, br); !errors.Is(err, errDown) {
		t.Fatal(err)
	}
	st, err := r.Flush(bgCtx, br)
	if !errors.Is(err, ErrBreakerOpen) || st.Buckets != 0 || r.Pending() != 1 {
		t.Fatalf("flush on an open breaker: %v %+v, Pending %d", err, st, r.Pending())
	}
	clk.Advance(DefaultBreakerCooldown)
	if st, err := r.Flush(bgCtx, br); err != nil || st.Charged != 3 || cl.units["a/p/"] != 3 {
		t.Fatalf("flush after the cooldown: %v %+v", err, st)
	}
}

// TestDecideOrFallbackRecords: what the fallback charges is recorded with
// the unscaled rate; denials, shadow denials, FailOpen and closed
// denials are not.
func TestDecideOrFallbackRecords(t *testing.T) {
	mk := func(name string, mode FailMode, shadow bool) *Policy {
		return &Policy{Name: name, Algorithm: FixedWindow, FailMode: mode,
			Limit: Limit{Rate: Rate{Limit: 10, Window: time.Hour}, Shadow: shadow}}
	}
	local, open, closed := mk("local", FailLocal, false), mk("open", FailOpen, false), mk("closed", FailClosed, false)
	shadow := &Policy{Name: "shadow", Algorithm: FixedWindow, Limit: Limit{Rate: Rate{Limit: 3, Window: time.Hour}, Shadow: true}}
	store, clk := newTestStore(t, MemoryOptions{})
	rec := NewRecorder(RecorderOptions{Clock: clk})
	fb := Fallback{Store: store, Scale: 0.7, Recorder: rec}
	var d Decision
	for range 20 {
		items := []Item{{Policy: local, Tenant: "acme", Cost: 1}, {Policy: open, Tenant: "acme", Cost: 1}, {Policy: shadow, Tenant: "acme", Cost: 1}}
		d.DecideOrFallback(bgCtx, brokenStore{}, fb, items)
	}
	for range 5 {
		d.DecideOrFallback(bgCtx, brokenStore{}, fb, []Item{{Policy: closed, Tenant: "acme", Cost: 1}, {Policy: mk("local2", FailLocal, false), Tenant: "acme", Cost: 1}})
	}
	var cl chargeLog
	if _, err := rec.Flush(bgCtx, &cl); err != nil {
		t.Fatal(err)
	}
	// local admits 7 (10 x 0.7); the shadow policy (fallback limit 2)
	// is charged only while it allows.
	want := map[string]int64{"acme/local/": 7, "acme/shadow/": 2}
	if fmt.Sprint(cl.units) != fmt.Sprint(want) {
		t.Fatalf("recorded %v, want %v", cl.units, want)
	}
	if r := cl.rates["acme/local/"]; r.Limit != 10 {
		t.Errorf("recorded rate %+v, want the unscaled limit 10", r)
	}
}

// TestRedisCharge: RedisStore.Charge (the force mode) takes exactly the
// units asked while they fit, and drives a bucket at most to empty.
func TestRedisCharge(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	s := NewRedisStore(RedisOptions{Client: srv.Client(t), Timeout: testTimeout})
	clk := newManualClock(baseTime.Add(3 * time.Second))
	s.now = func() int64 { return clk.Now().UnixMicro() }
	for _, algo := range benchAlgorithms {
		t.Run(algo.String(), func(t *testing.T) {
			c := Check{Algorithm: algo, Tenant: "charge", Policy: algo.String(), Rate: Rate{Limit: 20, Window: 10 * time.Second}, Cost: 1}
			for range 3 {
				mustDecide(t, s, c)
			}
			before := mustPeek(t, s, c)[0].Remaining
			f := c
			f.Cost = 5
			charged := make([]int64, 1)
			if err := s.Charge(bgCtx, []Check{f}, charged); err != nil {
				t.Fatal(err)
			}
			after := mustPeek(t, s, c)[0].Remaining
			if algo == Concurrency {
				if charged[0] != 0 || after != before {
					t.Fatalf("concurrency charged %d, remaining %d -> %d; want untouched", charged[0], before, after)
				}
				return
			}
			if charged[0] != 5 || after != before-5 {
				t.Fatalf("charged %d, remaining %d -> %d; want 5 and %d", charged[0], before, after, before-5)
			}
			// More than remains: capped at empty.
			f.Cost = 1000
			if err := s.Charge(bgCtx, []Check{f}, charged); err != nil {
				t.Fatal(err)
			}
			if charged[0] != after || mustPeek(t, s, c)[0].Remaining != 0 {
				t.Fatalf("charged %d of %d remaining; remaining now %d", charged[0], after, mustPeek(t, s, c)[0].Remaining)
			}
			if ok, _ := mustDecide(t, s, c); ok {
				t.Fatal("admitted after being charged to empty")
			}
			// Never into debt: one unit's refill later (half a window
			// for the window algorithms) something is admitted again.
			clk.Advance(10 * time.Second)
			if ok, _ := mustDecide(t, s, c); !ok {
				t.Fatal("still denied a window after a charge to empty: the charge went into debt")
			}
		})
	}
}

// TestRecorderFlushRedis: units recorded on the fallback path are charged
// to Redis by Flush: the Redis bucket's Remaining drops by exactly those.
func TestRecorderFlushRedis(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	s := NewRedisStore(RedisOptions{Client: srv.Client(t), Timeout: testTimeout})
	clk := newManualClock(baseTime.Add(time.Second))
	s.now = func() int64 { return clk.Now().UnixMicro() }
	rec := NewRecorder(RecorderOptions{Clock: clk})
	policy := &Policy{Name: "api", Algorithm: TokenBucket, Limit: Limit{Rate: Rate{Limit: 100, Window: time.Minute}}}
	mem, _ := newTestStore(t, MemoryOptions{Clock: clk})
	fb := Fallback{Store: mem, Scale: 0.7, Recorder: rec}
	check := Check{Algorithm: TokenBucket, Tenant: "acme", Policy: "api", Rate: policy.Limit.Rate}

	// Before the outage: 10 units on Redis.
	var d Decision
	items := []Item{{Policy: policy, Tenant: "acme", Cost: 1}}
	for range 10 {
		if err := d.DecideOrFallback(bgCtx, s, fb, items); err != nil || !d.Admitted {
			t.Fatal(err)
		}
	}
	before := mustPeek(t, s, check)[0].Remaining
	// The outage: 25 units admitted by the fallback (cost 5 each).
	items[0].Cost = 5
	for range 5 {
		if err := d.DecideOrFallback(bgCtx, brokenStore{}, fb, items); err == nil || !d.Admitted || d.Verdicts[0].Path != PathFallback {
			t.Fatalf("fallback: %v admitted=%v", err, d.Admitted)
		}
	}
	// Back: flush through a breaker, as the handler does.
	br := NewBreakerStore(s, BreakerOptions{})
	st, err := rec.Flush(bgCtx, br)
	if err != nil {
		t.Fatal(err)
	}
	after := mustPeek(t, s, check)[0].Remaining
	t.Logf("Redis remaining %d -> %d after flushing %+v", before, after, st)
	if st.Charged != 25 || after != before-25 {
		t.Fatalf("remaining %d -> %d, charged %d; want a drop of exactly 25", before, after, st.Charged)
	}
}

// TestRecorderFlushDropsRefused: one recorded bucket that the store refuses
// as invalid (a limit beyond MaxCount) is dropped and counted, and every
// other bucket is charged in the same flush: it cannot poison recovery.
func TestRecorderFlushDropsRefused(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	s := NewRedisStore(RedisOptions{Client: srv.Client(t), Timeout: testTimeout})
	clk := newManualClock(baseTime.Add(time.Second))
	s.now = func() int64 { return clk.Now().UnixMicro() }
	rec := NewRecorder(RecorderOptions{Clock: clk})
	good := Rate{Limit: 100, Window: time.Minute}
	bad := Rate{Limit: MaxCount + 1, Window: time.Minute}
	for _, tenant := range []string{"a", "b", "c"} {
		rec.Record(&Check{Algorithm: FixedWindow, Tenant: tenant, Policy: "api"}, good, 7)
	}
	rec.Record(&Check{Algorithm: FixedWindow, Tenant: "bb", Policy: "api"}, bad, 7)
	br := NewBreakerStore(s, BreakerOptions{})
	st, err := rec.Flush(bgCtx, br)
	if err != nil {
		t.Fatalf("flush: %v", err)
	}
	if st.Charged != 21 || st.Buckets != 3 || st.Refused != 1 || rec.Refused() != 1 {
		t.Fatalf("flush stats %+v, refused %d; want 3 buckets and 21 units charged, 1 refused", st, rec.Refused())
	}
	if rec.Pending() != 0 {
		t.Fatalf("pending %d after the flush, want 0: the refused bucket must not be retried", rec.Pending())
	}
	for _, tenant := range []string{"a", "b", "c"} {
		if got := mustPeek(t, s, Check{Algorithm: FixedWindow, Tenant: tenant, Policy: "api", Rate: good})[0].Remaining; got != 93 {
			t.Errorf("tenant %s: remaining %d, want 93", tenant, got)
		}
	}
	if br.Open() {
		t.Error("a refused entry counted as a store failure")
	}
}
