package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// chargeLog is a Charger that records what it was asked to charge, and
// the id of each call, and fails when told to.
type chargeLog struct {
	mu     sync.Mutex
	calls  int
	ids    []string
	units  map[string]int64
	rates  map[string]Rate
	failAt int // call number (1-based) that fails; 0 never
}

func (c *chargeLog) Charge(_ context.Context, id string, checks []Check, charged []int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	c.ids = append(c.ids, id)
	if c.units == nil {
		c.units, c.rates = map[string]int64{}, map[string]Rate{}
	}
	if c.calls == c.failAt {
		for i := range checks {
			charged[i] = ChargeFailed
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
	if want := debtRate(SlidingWindow, recRate); cl.rates["a/p/"] != want {
		t.Errorf("rate %+v, want the unscaled rate with room for debt %+v", cl.rates["a/p/"], want)
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

// TestRecorderFlushFailure: a call that fails, and the calls after it, are
// kept with their ids and sent again with the same ids, before the calls
// of what was recorded meanwhile; units are never merged into a call
// that may have run.
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
	if st.Buckets != 2 || st.Charged != 1+2 || st.Calls != 1 {
		t.Fatalf("stats %+v, want the first call (tenants 0, 1)", st)
	}
	if r.Pending() != 2 {
		t.Fatalf("Pending %d, want the 2 calls kept", r.Pending())
	}
	failed := cl.ids[1]
	r.Record(recCheck("5"), recRate, 10) // meanwhile
	cl2 := chargeLog{}
	if _, err := r.Flush(bgCtx, &cl2); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"2/p/": 3, "3/p/": 4, "4/p/": 5, "5/p/": 16}
	if fmt.Sprint(cl2.units) != fmt.Sprint(want) {
		t.Fatalf("second flush charged %v, want %v", cl2.units, want)
	}
	if len(cl2.ids) != 3 || cl2.ids[0] != failed || cl2.ids[2] == failed || cl2.ids[2] == cl2.ids[1] {
		t.Fatalf("second flush ids %q, want the failed call's %q first, then a new id for the new units", cl2.ids, failed)
	}
	if r.Pending() != 0 {
		t.Fatalf("Pending %d after a flush that succeeded", r.Pending())
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
	if r, want := cl.rates["acme/local/"], debtRate(FixedWindow, local.Limit.Rate); r != want {
		t.Errorf("charged against %+v, want the unscaled rate with room for debt %+v", r, want)
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
			if err := s.Charge(bgCtx, "", []Check{f}, charged); err != nil {
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
			if err := s.Charge(bgCtx, "", []Check{f}, charged); err != nil {
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

// TestStillOwed: what still counts of units charged some time ago: a
// token bucket or GCRA bucket refills capacity + units before they stop
// counting; window and log units count until their windows have passed.
func TestStillOwed(t *testing.T) {
	r := Rate{Limit: 100, Window: time.Minute} // 100 a minute, capacity 100
	for _, c := range []struct {
		algo  Algorithm
		rate  Rate
		units int64
		age   time.Duration
		want  int64
	}{
		{TokenBucket, r, 500, 0, 500},
		{TokenBucket, r, 500, time.Minute, 500},     // refilled 100 = its capacity
		{TokenBucket, r, 500, 2 * time.Minute, 400}, // 100 more
		{TokenBucket, r, 500, 6 * time.Minute, 0},   // 600 = capacity + units
		{GCRA, r, 30, 90 * time.Second, 0},          // 150 > 130
		{GCRA, r, 30, 66 * time.Second, 20},         // 110: 20 left
		{TokenBucket, Rate{Limit: 100, Window: time.Minute, Burst: 1000}, 50, 10 * time.Minute, 50},
		{FixedWindow, r, 7, 59 * time.Second, 7},
		{FixedWindow, r, 7, time.Minute, 0},
		{SlidingWindow, r, 7, 119 * time.Second, 7}, // weighs on the next window
		{SlidingWindow, r, 7, 2 * time.Minute, 0},
		{SlidingLog, Rate{Limit: 5, Window: time.Second, MinInterval: time.Minute}, 3, 30 * time.Second, 3},
		{Concurrency, r, 3, time.Second, 0},
		{TokenBucket, r, -5, 0, 0},
	} {
		if got := stillOwed(c.algo, c.rate, c.units, int64(c.age)); got != c.want {
			t.Errorf("%s %+v: %d units %v ago: %d still count, want %d", c.algo, c.rate, c.units, c.age, got, c.want)
		}
	}
}

// TestRecorderDebt: recorded units are charged into debt (debtRate): what
// a tenant used during an outage is owed whatever the bucket holds then. A
// token bucket's units count for what it has not refilled since; negative
// units take recorded ones back.
func TestRecorderDebt(t *testing.T) {
	clk := newManualClock(baseTime)
	r := NewRecorder(RecorderOptions{Clock: clk})
	rate := Rate{Limit: 100, Window: time.Minute}
	tb := &Check{Algorithm: TokenBucket, Tenant: "a", Policy: "tokens"}
	fw := &Check{Algorithm: FixedWindow, Tenant: "a", Policy: "day"}
	r.Record(tb, rate, 600)  // a settlement
	r.Record(tb, rate, -100) // a lower real cost of another request
	r.Record(fw, rate, 250)
	clk.Advance(2 * time.Minute) // the token bucket refilled 200: 100 beyond its capacity
	var got []Check
	charger := chargeFunc(func(_ string, checks []Check, charged []int64) error {
		got = append(got, checks...)
		for i := range checks {
			charged[i] = checks[i].Cost
		}
		return nil
	})
	if _, err := r.Flush(bgCtx, charger); err != nil {
		t.Fatal(err)
	}
	want := Check{Algorithm: TokenBucket, Tenant: "a", Policy: "tokens", Rate: debtRate(TokenBucket, rate), Cost: 400}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("flushed %+v, want %+v alone (the day's units are more than a window old)", got, want)
	}
}

// chargeFunc is a Charger from a function.
type chargeFunc func(id string, checks []Check, charged []int64) error

func (f chargeFunc) Charge(_ context.Context, id string, checks []Check, charged []int64) error {
	return f(id, checks, charged)
}

// TestRecorderRetry: a call kept by Retry is sent with its own id until the
// store answers, with what still counts of its units (into debt for a
// settlement); a give-back kept by RetryGiveBack is sent as a retry of its
// lease call.
func TestRecorderRetry(t *testing.T) {
	clk := newManualClock(baseTime)
	r := NewRecorder(RecorderOptions{Clock: clk})
	rate := Rate{Limit: 100, Window: time.Minute}
	settle := []Check{
		{Algorithm: TokenBucket, Tenant: "a", Policy: "tokens", Rate: rate, Cost: 300},
		{Algorithm: GCRA, Tenant: "a", Policy: "g", Rate: rate, Cost: -4},
		{Algorithm: Concurrency, Tenant: "a", Policy: "c", Rate: Rate{Limit: 3}, Cost: 1}, // never kept
	}
	r.Retry("settle-1", settle)
	r.RetryGiveBack(&LeaseRequest{Checks: settle[:1], Want: 7, GiveBack: 3, GiveBackAt: 42, ID: "lease-1"})
	r.RetryGiveBack(&LeaseRequest{Checks: settle[:1], GiveBack: 3}) // no id: nothing to retry safely
	if r.Pending() != 2 {
		t.Fatalf("Pending %d, want 2 calls", r.Pending())
	}
	clk.Advance(2 * time.Minute) // 100 of the 300 refilled beyond capacity
	var ids []string
	var sent [][]Check
	fail := true
	store := &leaseChargeLog{charge: func(id string, checks []Check, charged []int64) error {
		ids = append(ids, id)
		sent = append(sent, slices.Clone(checks))
		if fail {
			return errDown
		}
		for i := range checks {
			charged[i] = checks[i].Cost
		}
		return nil
	}}
	if _, err := r.Flush(bgCtx, store); !errors.Is(err, errDown) || r.Pending() != 2 || len(store.leases) != 0 {
		t.Fatalf("failed flush: %v, Pending %d, %d give-backs sent; want both kept, the give-back not sent yet", err, r.Pending(), len(store.leases))
	}
	fail = false
	st, err := r.Flush(bgCtx, store)
	if err != nil || r.Pending() != 0 || st.Calls != 2 {
		t.Fatalf("flush: %v %+v, Pending %d", err, st, r.Pending())
	}
	if len(ids) != 2 || ids[0] != "settle-1" || ids[1] != "settle-1" {
		t.Fatalf("charge ids %q, want settle-1 twice", ids)
	}
	wantDebt := Check{Algorithm: TokenBucket, Tenant: "a", Policy: "tokens", Rate: debtRate(TokenBucket, rate), Cost: 200}
	if len(sent[1]) != 2 || sent[1][0] != wantDebt || sent[1][1] != settle[1] {
		t.Fatalf("sent %+v, want %+v and the give-back %+v", sent[1], wantDebt, settle[1])
	}
	if len(store.leases) != 1 {
		t.Fatalf("%d give-backs sent, want 1", len(store.leases))
	}
	if g := store.leases[0]; g.ID != "lease-1" || !g.Retry || g.Want != 0 || g.GiveBack != 3 || g.GiveBackAt != 42 {
		t.Fatalf("give-back sent as %+v, want a retry of lease-1 giving 3 back", g)
	}
}

// leaseChargeLog is a Charger and LeaseTaker for recorder tests.
type leaseChargeLog struct {
	charge func(id string, checks []Check, charged []int64) error
	leases []LeaseRequest
}

func (l *leaseChargeLog) Charge(_ context.Context, id string, checks []Check, charged []int64) error {
	return l.charge(id, checks, charged)
}

func (l *leaseChargeLog) Lease(_ context.Context, req *LeaseRequest, _ []Result) (LeaseGrant, error) {
	l.leases = append(l.leases, *req)
	return LeaseGrant{}, nil
}
