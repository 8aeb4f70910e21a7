package limiter

import (
	"fmt"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
	"github.com/tollgate/caddy-tollgate/lua"
)

// slotClock is a clock two RedisStores share, standing for Redis TIME.
type slotClock struct{ at time.Time }

func (c *slotClock) now() int64              { return c.at.UnixMicro() }
func (c *slotClock) advance(d time.Duration) { c.at = c.at.Add(d) }

// decideAt decides items on s, failing the test on an error.
func decideAt(t *testing.T, s Store, items []Item) *Decision {
	t.Helper()
	d := new(Decision)
	if err := d.Decide(bgCtx, s, items); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestSlotsOfDeadInstanceReclaimed: an instance that dies holding
// concurrency slots gives them back RedisSlotLease after it last said its
// requests were running, even while other instances keep acquiring in the
// bucket (which sets the counter's TTL again on every acquire, so the
// counter alone would hold the dead slots for as long as traffic lasts).
// A late release of a reclaimed slot (an instance that was paused, not
// dead) gives nothing back a second time, and a request that keeps its
// slots alive keeps them. The two stores share Redis and a simulated
// clock (Redis TIME replaced), so the minute passes at once.
func TestSlotsOfDeadInstanceReclaimed(t *testing.T) {
	for _, functions := range []bool{false, true} {
		t.Run(fmt.Sprintf("functions=%v", functions), func(t *testing.T) {
			testSlotsOfDeadInstanceReclaimed(t, functions)
		})
	}
}

func testSlotsOfDeadInstanceReclaimed(t *testing.T, functions bool) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	clk := &slotClock{at: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)}
	dead := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout, Functions: functions})
	live := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout, Functions: functions})
	dead.now, live.now = clk.now, clk.now
	items := []Item{{Policy: slotsPolicy("c", 2), Tenant: "acme", Cost: 1}}

	// The dead instance takes both slots and is never heard of again.
	d1, d2 := decideAt(t, dead, items), decideAt(t, dead, items)
	if !d1.Admitted || !d2.Admitted {
		t.Fatalf("dead instance's acquires: %v %v, want both admitted", d1.Admitted, d2.Admitted)
	}
	// The live instance keeps asking, as traffic does.
	for _, after := range []time.Duration{time.Second, 30 * time.Second, RedisSlotLease - 2*time.Second} {
		clk.at = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC).Add(after)
		if d := decideAt(t, live, items); d.Admitted {
			t.Fatalf("%v after the dead instance's acquires: admitted, want denied (its slots are still leased)", after)
		}
	}
	if got := inFlight(t, client, "acme", "c"); got != 2 {
		t.Fatalf("in flight %d within the lease, want 2", got)
	}
	clk.at = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC).Add(RedisSlotLease + time.Millisecond)
	d3 := decideAt(t, live, items)
	if !d3.Admitted {
		t.Fatalf("%v after the dead instance's acquires: denied, want admitted (its slots reclaimed)", RedisSlotLease+time.Millisecond)
	}
	if got := inFlight(t, client, "acme", "c"); got != 1 {
		t.Fatalf("in flight %d after the reclaim and one acquire, want 1", got)
	}
	for _, d := range []*Decision{d1, d2} {
		if got := holdState(t, client, &d.checks[0]); got != "gone" {
			t.Fatalf("hold of a reclaimed slot %q, want gone", got)
		}
	}
	// The "dead" instance was only paused: its releases come late and
	// give nothing back a second time.
	if err := d1.Release(bgCtx, Fallback{}); err != nil {
		t.Fatal(err)
	}
	if err := dead.releaseLost(bgCtx, d2.checks); err != nil {
		t.Fatal(err)
	}
	if got := inFlight(t, client, "acme", "c"); got != 1 {
		t.Fatalf("in flight %d after the reclaimed slots' late releases, want 1 (the live request's)", got)
	}

	// A request that keeps its slot alive keeps it past the lease; once
	// it stops keeping it, the slot is reclaimed a lease after the last
	// keep.
	clk.advance(RedisSlotLease * 2 / 3)
	if err := live.keepSlots(bgCtx, d3.checks); err != nil {
		t.Fatal(err)
	}
	d4 := decideAt(t, live, items) // takes the second slot
	clk.advance(RedisSlotLease * 2 / 3)
	if err := live.keepSlots(bgCtx, d4.checks); err != nil {
		t.Fatal(err)
	}
	// d3 was last kept 2/3 of a lease ago, d4 just now: neither is
	// reclaimed, and the bucket is full.
	if d := decideAt(t, live, items); d.Admitted {
		t.Fatal("kept slots: admitted a third request, want denied")
	}
	clk.advance(RedisSlotLease/3 + time.Millisecond)
	// d3's lease is over (kept 1 lease + 1 ms ago), d4's is not.
	d5 := decideAt(t, live, items)
	if !d5.Admitted {
		t.Fatal("a lease after d3's last keep: denied, want admitted (d3's slot reclaimed)")
	}
	if got := inFlight(t, client, "acme", "c"); got != 2 {
		t.Fatalf("in flight %d, want 2 (d4 and d5)", got)
	}
	for _, d := range []*Decision{d3, d4, d5} {
		if err := d.Release(bgCtx, Fallback{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := inFlight(t, client, "acme", "c"); got != 0 {
		t.Fatalf("in flight %d after every release, want 0", got)
	}
	index := string(appendHeldKey(nil, DefaultPrefix, "acme", "c", ""))
	if n := client.ZCard(bgCtx, index).Val(); n != 0 {
		t.Fatalf("%d holds left in %s after every release, want 0", n, index)
	}
}

// TestSlotLeaseKeys: the index of a bucket's leased slots lives in the
// bucket's cluster slot with the counter's TTL, a reset deletes it with
// the bucket, and the lease is the same in Go and in the scripts.
func TestSlotLeaseKeys(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout})
	items := []Item{{Policy: slotsPolicy("c", 2), Tenant: "a{c}me", Cost: 1}}
	d := decideAt(t, s, items)
	if !d.Admitted {
		t.Fatal("denied")
	}
	bucket := AppendKey(nil, DefaultPrefix, Concurrency, "a{c}me", "c", "")
	index := appendHeldKey(nil, DefaultPrefix, "a{c}me", "c", "")
	if keySlot(bucket) != keySlot(index) {
		t.Fatalf("%s and %s in different cluster slots", bucket, index)
	}
	if ttl := client.PTTL(bgCtx, string(index)).Val(); ttl > RedisConcurrencyTTL || ttl < RedisConcurrencyTTL-time.Minute {
		t.Fatalf("index PTTL %v, want about %v", ttl, RedisConcurrencyTTL)
	}
	// A partitioned bucket's index goes with it too.
	parted := []Item{{Policy: slotsPolicy("c", 2), Tenant: "a{c}me", Part: "user:7", Cost: 1}}
	if d := decideAt(t, s, parted); !d.Admitted {
		t.Fatal("denied")
	}
	partIndex := appendHeldKey(nil, DefaultPrefix, "a{c}me", "c", "user:7")
	if n := client.ZCard(bgCtx, string(partIndex)).Val(); n != 1 {
		t.Fatalf("%s lists %d holds, want 1", partIndex, n)
	}
	if err := s.Reset(bgCtx, "a{c}me", []string{"c"}); err != nil {
		t.Fatal(err)
	}
	if n := client.Exists(bgCtx, string(bucket), string(index), string(partIndex)).Val(); n != 0 {
		t.Fatalf("%d of the buckets' indexes left after a reset, want 0", n)
	}
	for name, src := range map[string]string{"decide": lua.Decide, "keep": lua.Keep} {
		m := regexp.MustCompile(`local SLOT_LEASE_MS = (\d+)`).FindStringSubmatch(src)
		if m == nil {
			t.Fatalf("%s: no SLOT_LEASE_MS", name)
		}
		if ms, _ := strconv.ParseInt(m[1], 10, 64); time.Duration(ms)*time.Millisecond != RedisSlotLease {
			t.Fatalf("%s: SLOT_LEASE_MS %s, want %d (RedisSlotLease)", name, m[1], RedisSlotLease.Milliseconds())
		}
	}
}

// clusterStoreAt returns a store on a new 3-master Cluster whose Redis
// TIME is replaced by the clock it returns; observe, when not nil, is its
// RedisOptions.Observe.
func clusterStoreAt(t *testing.T, observe func(script, result string, d time.Duration)) (*RedisStore, *redis.ClusterClient, *slotClock) {
	cl := redistest.StartCluster(t, 3, 0)
	client := cl.Client(t)
	clk := &slotClock{at: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)}
	s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout, Observe: observe})
	s.now = clk.now
	return s, client, clk
}

// TestSlotLeaseCluster: the dead instance's slots are reclaimed on a
// Redis Cluster too, where the index must share the bucket's node.
func TestSlotLeaseCluster(t *testing.T) {
	s, client, clk := clusterStoreAt(t, nil)
	for i := range 6 {
		tenant := fmt.Sprintf("tenant-%d", i)
		items := []Item{{Policy: slotsPolicy("c", 1), Tenant: tenant, Cost: 1}}
		if d := decideAt(t, s, items); !d.Admitted {
			t.Fatalf("%s: denied", tenant)
		}
		clk.advance(RedisSlotLease + time.Millisecond)
		d := decideAt(t, s, items)
		if !d.Admitted {
			t.Fatalf("%s: denied after the lease, want admitted", tenant)
		}
		if err := d.Release(bgCtx, Fallback{}); err != nil {
			t.Fatal(err)
		}
		if got := inFlight(t, client, tenant, "c"); got != 0 {
			t.Fatalf("%s: in flight %d, want 0", tenant, got)
		}
	}
}

// TestKeepSlotsTogether: one renewal renews every slot a request holds,
// in one call per Cluster slot their keys hash to: one for one tenant's
// slots, one per tenant for two tenants' (on a Cluster, acme and globex
// hash to different slots).
func TestKeepSlotsTogether(t *testing.T) {
	var calls atomic.Int64
	s, client, clk := clusterStoreAt(t, func(script, result string, _ time.Duration) {
		if script == "keep" && result != "noscript" { // then sent again as EVAL
			calls.Add(1)
		}
	})
	if keySlot([]byte("{acme}")) == keySlot([]byte("{globex}")) {
		t.Fatal("acme and globex share a Cluster slot: pick other tenants")
	}
	for _, shape := range []struct {
		tenants []string
		calls   int64
	}{
		{[]string{"acme", "acme"}, 1},
		{[]string{"acme", "globex"}, 2},
		{[]string{"acme", "globex", "acme"}, 2},
	} {
		var items []Item
		for i, tenant := range shape.tenants {
			items = append(items, Item{Policy: slotsPolicy(fmt.Sprintf("p%d", i), 1), Tenant: tenant, Cost: 1})
		}
		d := decideAt(t, s, items)
		if !d.Admitted {
			t.Fatalf("%v: denied", shape.tenants)
		}
		clk.advance(RedisSlotLease / 2)
		calls.Store(0)
		if err := s.keepSlots(bgCtx, d.checks); err != nil {
			t.Fatal(err)
		}
		if got := calls.Load(); got != shape.calls {
			t.Errorf("%v: %d renewal calls, want %d (one per Cluster slot)", shape.tenants, got, shape.calls)
		}
		want := float64(clk.at.Add(RedisSlotLease).UnixMilli())
		for i := range d.checks {
			c := &d.checks[i]
			index := string(appendHeldKey(nil, DefaultPrefix, c.Tenant, c.Policy, ""))
			member := string(appendHeldMember(nil, DefaultPrefix, c))
			if got := client.ZScore(bgCtx, index, member).Val(); got != want {
				t.Fatalf("%v: lease of %s ends at %v after the renewal, want %v", shape.tenants, c.Policy, got, want)
			}
		}
		if err := d.Release(bgCtx, Fallback{}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHeldIndexLivesWithItsCounter: the held index gets its counter's TTL
// on every acquire, so it cannot expire first and take a dead instance's
// lease with it. (It used to be set again only when less than half of it
// was left: an acquire 30 s after a dead instance's left the index 9m30s
// against the counter's 10 minutes, and once the index expired, later
// acquires kept the counter alive with the dead slot in it for good.)
// Redis's TTLs are aged by hand, as the stores' clock is simulated.
func TestHeldIndexLivesWithItsCounter(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	clk := &slotClock{at: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)}
	dead := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout})
	live := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout})
	dead.now, live.now = clk.now, clk.now
	items := []Item{{Policy: slotsPolicy("c", 3), Tenant: "acme", Cost: 1}}
	counter := string(AppendKey(nil, DefaultPrefix, Concurrency, "acme", "c", ""))
	index := string(appendHeldKey(nil, DefaultPrefix, "acme", "c", ""))
	age := func(d time.Duration) {
		t.Helper()
		clk.advance(d)
		for _, k := range []string{counter, index} {
			p := client.PTTL(bgCtx, k).Val()
			switch {
			case p < 0:
			case p <= d:
				client.Del(bgCtx, k)
			default:
				client.PExpire(bgCtx, k, p-d)
			}
		}
	}
	short := func() {
		t.Helper()
		d := decideAt(t, live, items)
		if !d.Admitted {
			t.Fatal("a short request was denied")
		}
		if err := d.Release(bgCtx, Fallback{}); err != nil {
			t.Fatal(err)
		}
	}

	if d := decideAt(t, dead, items); !d.Admitted { // and never renewed
		t.Fatal("denied")
	}
	age(30 * time.Second)
	short()
	if c, i := client.PTTL(bgCtx, counter).Val(), client.PTTL(bgCtx, index).Val(); c-i > 50*time.Millisecond || i-c > 50*time.Millisecond {
		t.Errorf("after an acquire: counter PTTL %v, held index PTTL %v, want the same", c, i)
	}
	// Quiet until after the first TTL would have ended, then busy again.
	age(9*time.Minute + 40*time.Second)
	for range 20 {
		short()
		age(5 * time.Minute)
	}
	if got := inFlight(t, client, "acme", "c"); got != 0 {
		t.Fatalf("nothing in flight 100 minutes on: the counter says %d, want 0 (the dead instance's slot was never given back)", got)
	}
}

// TestUnsureReleaseOfLongRequest: a request held longer than its hold
// record lives (24 hours, renewed all along) whose own release fails and
// is sent again unsure still gives its slot back: its lease is listed,
// so its acquire ran and the slot is counted. (It gave nothing back and
// took the lease out of the index, so no acquire could reclaim it.)
func TestUnsureReleaseOfLongRequest(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	clk := &slotClock{at: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)}
	s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout})
	s.now = clk.now
	items := []Item{{Policy: slotsPolicy("c", 2), Tenant: "acme", Cost: 1}}
	d := decideAt(t, s, items)
	clk.advance(24*time.Hour + time.Minute)
	if err := s.keepSlots(bgCtx, d.checks); err != nil {
		t.Fatal(err)
	}
	client.Del(bgCtx, string(appendOnceKey(nil, DefaultPrefix, "acme", d.checks[0].Hold))) // expired
	if err := s.releaseLost(bgCtx, d.checks); err != nil {
		t.Fatal(err)
	}
	if got := inFlight(t, client, "acme", "c"); got != 0 {
		t.Errorf("after the unsure release of the only slot: the counter says %d, want 0", got)
	}
	if got := holdState(t, client, &d.checks[0]); got != "gone" {
		t.Errorf("hold %q after an unsure release, want gone", got)
	}
	// Its own release, late, after all: nothing more.
	other := decideAt(t, s, items)
	if err := d.Release(bgCtx, Fallback{}); err != nil {
		t.Fatal(err)
	}
	if got := inFlight(t, client, "acme", "c"); got != 1 {
		t.Errorf("a late sure release after the unsure one: the counter says %d, want 1 (the other request's)", got)
	}
	if err := other.Release(bgCtx, Fallback{}); err != nil {
		t.Fatal(err)
	}
}

// TestReleaseAfterReset: a slot taken before a reset is not in the
// counter made since, so its release gives nothing back there. (It took
// a unit off the new counter: a bucket of limit 1 ran two requests.)
func TestReleaseAfterReset(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout})
	items := []Item{{Policy: slotsPolicy("c", 1), Tenant: "acme", Cost: 1}}
	a := decideAt(t, s, items)
	if err := s.Reset(bgCtx, "acme", []string{"c"}); err != nil {
		t.Fatal(err)
	}
	b := decideAt(t, s, items)
	if !a.Admitted || !b.Admitted {
		t.Fatalf("a admitted %v, b (after the reset) %v, want both", a.Admitted, b.Admitted)
	}
	if err := a.Release(bgCtx, Fallback{}); err != nil {
		t.Fatal(err)
	}
	if got := inFlight(t, client, "acme", "c"); got != 1 {
		t.Errorf("b running, a released after the reset: the counter says %d, want 1", got)
	}
	if c := decideAt(t, s, items); c.Admitted {
		t.Error("a second request admitted in a bucket of limit 1 while b runs")
	}
	if err := b.Release(bgCtx, Fallback{}); err != nil {
		t.Fatal(err)
	}
	if got := inFlight(t, client, "acme", "c"); got != 0 {
		t.Errorf("nothing running: the counter says %d, want 0", got)
	}
}
