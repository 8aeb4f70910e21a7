package limiter

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestPenaltyValidate(t *testing.T) {
	for _, tc := range []struct {
		p  Penalty
		ok bool
	}{
		{Penalty{}, true},
		{Penalty{Duration: time.Minute, After: 1}, true},
		{Penalty{Duration: time.Minute, After: 0}, false},
		{Penalty{Duration: time.Microsecond, After: 1}, false},
		{Penalty{Duration: MaxPenalty + time.Second, After: 1}, false},
	} {
		if err := tc.p.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: err %v, want ok=%v", tc.p, err, tc.ok)
		}
	}
	p := &Policy{Name: "c", Algorithm: Concurrency, Limit: Limit{Rate: Rate{Limit: 2}}, Penalty: Penalty{Duration: time.Second, After: 1}}
	if err := p.Validate(); err == nil {
		t.Error("a concurrency policy with a penalty: no error")
	}
}

// TestPenaltyTableCount: the After-th denial within one window boxes the
// bucket; a window that ends starts the count again.
func TestPenaltyTableCount(t *testing.T) {
	tab := NewPenaltyTable(0)
	k := PenaltyKey{"api", "alice", ""}
	pen := Penalty{Duration: 10 * time.Second, After: 3}
	now := baseTime.UnixNano()
	sec := int64(time.Second)
	for i, at := range []int64{now, now + sec} {
		if _, boxed := tab.Count(k, pen, 5*time.Second, at); boxed {
			t.Fatalf("denial %d boxed", i+1)
		}
	}
	// The window (5s from the first denial) has ended: counting again.
	for i, at := range []int64{now + 5*sec, now + 6*sec} {
		if _, boxed := tab.Count(k, pen, 5*time.Second, at); boxed {
			t.Fatalf("denial %d of the second window boxed", i+1)
		}
	}
	until, boxed := tab.Count(k, pen, 5*time.Second, now+7*sec)
	if !boxed || until != now+17*sec {
		t.Fatalf("third denial in the window: boxed %v until %d, want until %d", boxed, until, now+17*sec)
	}
	for _, tc := range []struct {
		at   int64
		want bool
	}{{now + 7*sec, true}, {now + 17*sec - 1, true}, {now + 17*sec, false}} {
		if _, ok := tab.BoxedAt(k, tc.at); ok != tc.want {
			t.Errorf("boxed at +%v: %v, want %v", time.Duration(tc.at-now), ok, tc.want)
		}
	}
	if _, ok := tab.BoxedAt(PenaltyKey{"api", "bob", ""}, now+8*sec); ok {
		t.Error("another tenant is boxed")
	}
	if _, ok := tab.BoxedAt(PenaltyKey{"api", "alice", "x"}, now+8*sec); ok {
		t.Error("another partition key is boxed")
	}
}

// TestPenaltyTableBounded: hostile keys cannot grow the table past its
// bound; a full table evicts the box that ends first.
func TestPenaltyTableBounded(t *testing.T) {
	tab := NewPenaltyTable(8)
	now := baseTime.UnixNano()
	pen := Penalty{Duration: time.Minute, After: 2}
	for i := range 1000 {
		tab.Count(PenaltyKey{"api", fmt.Sprint("t", i), ""}, pen, time.Minute, now)
	}
	if n := len(tab.counts); n > 8 {
		t.Fatalf("counts: %d entries, bound 8", n)
	}
	for i := range 20 {
		tab.Box(PenaltyKey{"api", fmt.Sprint("b", i), ""}, now+int64(i+1)*int64(time.Second), now)
	}
	if n := len(tab.boxes); n != 8 {
		t.Fatalf("boxes: %d entries, want the bound 8", n)
	}
	// The 8 that end last are kept.
	for i := range 20 {
		_, ok := tab.BoxedAt(PenaltyKey{"api", fmt.Sprint("b", i), ""}, now)
		if want := i >= 12; ok != want {
			t.Errorf("b%d boxed %v, want %v", i, ok, want)
		}
	}
}

func TestPenaltyTableLiftList(t *testing.T) {
	tab := NewPenaltyTable(0)
	now := baseTime.UnixNano()
	sec := int64(time.Second)
	tab.Box(PenaltyKey{"api", "alice", ""}, now+3*sec, now)
	tab.Box(PenaltyKey{"login", "alice", "1.2.3.4"}, now+2*sec, now)
	tab.Box(PenaltyKey{"api", "bob", ""}, now+1*sec, now)
	got := tab.List("", "", now, 10)
	if len(got) != 3 || got[0].Tenant != "bob" || got[2].Policy != "api" || got[2].Tenant != "alice" {
		t.Fatalf("list: %+v", got)
	}
	if got := tab.List("alice", "login", now, 10); len(got) != 1 || got[0].Part != "1.2.3.4" {
		t.Fatalf("list alice/login: %+v", got)
	}
	if got := tab.List("", "", now+1*sec, 10); len(got) != 2 {
		t.Fatalf("list after bob's box ended: %+v", got)
	}
	lifted := tab.Lift("alice", "api", now)
	if len(lifted) != 1 || lifted[0].Policy != "api" {
		t.Fatalf("lift alice/api: %+v", lifted)
	}
	if _, ok := tab.BoxedAt(PenaltyKey{"login", "alice", "1.2.3.4"}, now); !ok {
		t.Error("lifting alice/api lifted alice/login")
	}
	if lifted := tab.Lift("alice", "", now); len(lifted) != 1 {
		t.Fatalf("lift alice: %+v", lifted)
	}
	if got := tab.List("", "", now, 10); len(got) != 0 {
		t.Fatalf("left after lifts: %+v", got)
	}
}

// TestDecidePenalty: a bucket its store denied After times is refused by
// the box, without a store call, for exactly the duration; the other
// items of a boxed request are skipped (nothing charged); a shadow box
// refuses nothing.
func TestDecidePenalty(t *testing.T) {
	store, clk := newTestStore(t, MemoryOptions{})
	pens := &LocalPenalties{PenaltyTable: NewPenaltyTable(0), Now: clk.Now}
	api := &Policy{Name: "api", Algorithm: FixedWindow, Limit: Limit{Rate: Rate{Limit: 2, Window: 10 * time.Second}},
		Penalty: Penalty{Duration: 30 * time.Second, After: 2}}
	other := &Policy{Name: "other", Algorithm: FixedWindow, Limit: Limit{Rate: Rate{Limit: 100, Window: time.Hour}}}
	counting := &countingStore{Store: store}
	decide := func(tenant string) *Decision {
		t.Helper()
		d := &Decision{Penalties: pens}
		items := []Item{{Policy: api, Tenant: tenant, Cost: 1}, {Policy: other, Tenant: tenant, Cost: 1}}
		if err := d.Decide(context.Background(), counting, items); err != nil {
			t.Fatal(err)
		}
		return d
	}
	for i := range 2 {
		if d := decide("alice"); !d.Admitted {
			t.Fatalf("request %d denied", i+1)
		}
	}
	for i := range 2 {
		d := decide("alice")
		if d.Admitted || d.Verdicts[0].Path != PathStore {
			t.Fatalf("denial %d: admitted %v, path %v", i+1, d.Admitted, d.Verdicts[0].Path)
		}
	}
	calls := counting.decides
	clk.Advance(20 * time.Second) // the window has room again, but the box holds
	for range 5 {
		d := decide("alice")
		v := d.Verdicts[0]
		if d.Admitted || v.Path != PathPenalty || v.Result.RetryAfter != 10*time.Second || !v.Enforced() {
			t.Fatalf("boxed: admitted %v, path %v, retry %v", d.Admitted, v.Path, v.Result.RetryAfter)
		}
		if o := d.Verdicts[1]; o.Path != PathSkipped || o.Counted() || o.Enforced() {
			t.Fatalf("other item of a boxed request: %+v", o)
		}
	}
	if counting.decides != calls {
		t.Fatalf("boxed requests made %d store calls", counting.decides-calls)
	}
	if d := decide("bob"); !d.Admitted {
		t.Fatal("another tenant is refused")
	}
	clk.Advance(10*time.Second - 1)
	if d := decide("alice"); d.Admitted || d.Verdicts[0].Result.RetryAfter != 1 {
		t.Fatalf("1ns before the end: admitted %v, retry %v", d.Admitted, d.Verdicts[0].Result.RetryAfter)
	}
	clk.Advance(1)
	if d := decide("alice"); !d.Admitted {
		t.Fatalf("after the box: denied (%+v)", d.Verdicts[0])
	}
	// The other policy was charged only by alice's admitted requests (2
	// before the box, 1 after): the denied ones, by the store or the box,
	// charged nothing, all or nothing.
	res := make([]Result, 1)
	if err := store.Peek(context.Background(), []Check{{Algorithm: FixedWindow, Tenant: "alice", Policy: "other", Rate: other.Limit.Rate, Cost: 1}}, res); err != nil {
		t.Fatal(err)
	}
	if res[0].Remaining != 100-3 {
		t.Errorf("other: remaining %d, want %d", res[0].Remaining, 100-3)
	}

	// A shadow box refuses nothing: the request goes on to the store.
	shadow := &Policy{Name: "shadowed", Algorithm: FixedWindow, Limit: Limit{Rate: Rate{Limit: 1, Window: time.Hour}, Shadow: true},
		Penalty: Penalty{Duration: time.Hour, After: 1}}
	d := &Decision{Penalties: pens}
	for i := range 3 {
		if err := d.Decide(context.Background(), store, []Item{{Policy: shadow, Tenant: "carol", Cost: 1}}); err != nil {
			t.Fatal(err)
		}
		if !d.Admitted {
			t.Fatalf("shadow request %d refused", i+1)
		}
		if want := map[int]Path{0: PathStore, 1: PathStore, 2: PathPenalty}[i]; d.Verdicts[0].Path != want || (i > 0) != d.Verdicts[0].ShadowDenied() {
			t.Fatalf("shadow request %d: path %v, shadow denied %v", i+1, d.Verdicts[0].Path, d.Verdicts[0].ShadowDenied())
		}
	}
}

// countingStore counts Decide calls.
type countingStore struct {
	Store
	decides int
}

func (s *countingStore) Decide(ctx context.Context, checks []Check, results []Result) (bool, error) {
	s.decides++
	return s.Store.Decide(ctx, checks, results)
}

// TestPenaltyKeyBounded: a long tenant is held as a digest (bounded
// memory, and still its own bucket); no value passes for another's digest.
func TestPenaltyKeyBounded(t *testing.T) {
	long := strings.Repeat("x", 100000)
	k := NewPenaltyKey("api", long, long+"y")
	if len(k.Tenant) != 66 || len(k.Part) != 66 || k.Tenant == k.Part {
		t.Fatalf("bounded key: %d and %d bytes", len(k.Tenant), len(k.Part))
	}
	if NewPenaltyKey("api", long, "") != NewPenaltyKey("api", strings.Clone(long), "") {
		t.Fatal("the same long tenant gives two keys")
	}
	forged := NewPenaltyKey("api", k.Tenant, "")
	if forged.Tenant == k.Tenant {
		t.Fatal("a tenant spelled as a digest passes for the long tenant")
	}
	if short := NewPenaltyKey("api", "alice", "1.2.3.4"); short.Tenant != "alice" || short.Part != "1.2.3.4" {
		t.Fatalf("short values changed: %+v", short)
	}
	tab := &LocalPenalties{PenaltyTable: NewPenaltyTable(0)}
	tab.Denied(k, Penalty{Duration: time.Hour, After: 1}, Limit{Rate: Rate{Window: time.Minute}})
	if _, ok := tab.Boxed(NewPenaltyKey("api", long, long+"y")); !ok {
		t.Fatal("the long tenant is not boxed")
	}
	if _, ok := tab.Boxed(forged); ok {
		t.Fatal("the forged digest tenant is boxed")
	}
}

// TestBoxWatchers: a box made by LocalPenalties is told once, to the
// newest watcher first, and to older ones only while no newer one takes
// it; a stopped watcher is not told; a denial of a bucket boxed already
// (After 1, two requests denied together) makes no second box.
func TestBoxWatchers(t *testing.T) {
	tab := &LocalPenalties{PenaltyTable: NewPenaltyTable(0), Now: func() time.Time { return baseTime }}
	var told []string
	watch := func(name string, take bool) func() {
		return tab.WatchBoxes(func(b Box) bool {
			told = append(told, fmt.Sprintf("%s %s/%s until +%v limit %d", name, b.Policy, b.Tenant, time.Duration(b.Until-baseTime.UnixNano()), b.Limit.Limit))
			return take
		})
	}
	stopOld := watch("old", true)
	stopNew := watch("new", false)
	pen := Penalty{Duration: time.Minute, After: 2}
	lim := Limit{Rate: Rate{Limit: 5, Window: time.Second}}
	k := PenaltyKey{"api", "alice", ""}
	tab.Denied(k, pen, lim)
	if len(told) != 0 {
		t.Fatalf("told %q after 1 denial of 2", told)
	}
	tab.Denied(k, pen, lim)
	if want := "new api/alice until +1m0s limit 5|old api/alice until +1m0s limit 5"; strings.Join(told, "|") != want {
		t.Fatalf("told %q, want %q", told, want)
	}
	told = nil
	stopOld()
	once := Penalty{Duration: time.Minute, After: 1}
	k2 := PenaltyKey{"api", "bob", ""}
	tab.Denied(k2, once, lim)
	tab.Denied(k2, once, lim) // boxed already: no new box
	if want := "new api/bob until +1m0s limit 5"; strings.Join(told, "|") != want {
		t.Fatalf("told %q, want %q", told, want)
	}
	told = nil
	stopNew()
	tab.Denied(PenaltyKey{"api", "carol", ""}, once, lim)
	if len(told) != 0 {
		t.Fatalf("stopped watchers told %q", told)
	}
}
