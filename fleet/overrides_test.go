package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// get returns the live override of (tenant, policy) in t.
func get(t *OverrideTable, tenant, policy string) (Override, bool) {
	for _, o := range t.List(tenant) {
		if o.Policy == policy {
			return o, true
		}
	}
	return Override{}, false
}

// writeOverrideLikeAdmin writes an override the way Store does (hash,
// index, version), without the pub/sub message.
func writeOverrideLikeAdmin(t *testing.T, c redis.UniversalClient, tenant, policy, value string) {
	t.Helper()
	ctx := context.Background()
	tag := overrideTag(tenant)
	for _, err := range []error{
		c.HSet(ctx, "rl:ovr:{"+tag+"}", policy, value).Err(),
		c.SAdd(ctx, "rl:ovr-index", tag).Err(),
		c.Incr(ctx, "rl:ovr-version").Err(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestOverridesConcurrentSetDelete: two instances set and delete two
// policies of one tenant at once; after each round the tenant is in the
// index exactly when its hash holds an override (a delete never drops
// the tenant of a concurrent set), and at the end both instances and a
// fresh one hold what Redis holds.
func TestOverridesConcurrentSetDelete(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	ctx := context.Background()
	c := srv.Client(t)
	newInstance := func() *OverrideSync {
		r := newOverrideSync(overrideSyncOptions{client: srv.Client(t), prefix: "rl", timeout: time.Second, logger: zap.NewNop(), id: "test"})
		t.Cleanup(r.close)
		return r
	}
	a, b := newInstance(), newInstance()
	const tenant = "race"
	// consistent: the tenant is indexed iff its hash is not empty. The
	// instances' reloads may be taking an empty hash out of the index
	// (SREM, HLEN, SADD back) right now: give them a moment.
	consistent := func() (bool, string) {
		deadline := time.Now().Add(time.Second)
		for {
			n := c.HLen(ctx, "rl:ovr:{race}").Val()
			in := c.SIsMember(ctx, "rl:ovr-index", tenant).Val()
			if in == (n > 0) {
				return true, ""
			}
			if time.Now().After(deadline) {
				return false, fmt.Sprintf("%d overrides in the hash, tenant in the index: %v", n, in)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	for round := range 400 {
		var wg sync.WaitGroup
		for i, inst := range []*OverrideSync{a, b} {
			policy := fmt.Sprintf("p%d", i)
			// Always set, then delete, and set again or not at the end.
			ops := 2 + rand.IntN(4)
			wg.Go(func() {
				for op := range ops {
					var o *Override
					if op%2 == 0 {
						o = &Override{Tenant: tenant, Policy: policy, MaxEvents: int64(round + 1)}
					}
					if _, _, err := inst.Store(ctx, tenant, policy, o, "test"); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		if ok, why := consistent(); !ok {
			t.Fatalf("round %d: %s", round, why)
		}
	}
	// Leave both policies set: every instance must end up with them.
	for i, inst := range []*OverrideSync{a, b} {
		p := fmt.Sprintf("p%d", i)
		if _, _, err := inst.Store(ctx, tenant, p, &Override{Tenant: tenant, Policy: p, MaxEvents: 1000}, "test"); err != nil {
			t.Fatal(err)
		}
	}
	want := c.HGetAll(ctx, "rl:ovr:{race}").Val()
	if len(want) != 2 {
		t.Fatalf("Redis holds %v, want both policies", want)
	}
	fresh := newInstance()
	for name, inst := range map[string]*OverrideSync{"a": a, "b": b, "fresh": fresh} {
		got := func() map[string]string {
			m := map[string]string{}
			for _, o := range inst.table.List(tenant) {
				m[o.Policy] = fmt.Sprintf(`{"tenant":"race","policy":"%s","max_events":%d}`, o.Policy, o.MaxEvents)
			}
			return m
		}
		deadline := time.Now().Add(3 * time.Second)
		for fmt.Sprint(got()) != fmt.Sprint(want) {
			if time.Now().After(deadline) {
				t.Fatalf("instance %s holds %v, Redis %v", name, got(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestOverridesExpiredDropped: a reload drops an expired override from
// Redis, and the tenant from the index once its hash is empty, but keeps
// a value put in place of the expired one.
func TestOverridesExpiredDropped(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	ctx := context.Background()
	c := srv.Client(t)
	past := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	writeOverrideLikeAdmin(t, c, "old", "api", `{"tenant":"old","policy":"api","max_events":1,"expires":"`+past+`"}`)
	writeOverrideLikeAdmin(t, c, "both", "api", `{"tenant":"both","policy":"api","max_events":1,"expires":"`+past+`"}`)
	writeOverrideLikeAdmin(t, c, "both", "web", `{"tenant":"both","policy":"web","max_events":2}`)
	// An empty index entry (a writer that died between HDEL and SREM).
	c.SAdd(ctx, "rl:ovr-index", "gone")
	r := newOverrideSync(overrideSyncOptions{client: srv.Client(t), prefix: "rl", timeout: time.Second, logger: zap.NewNop(), id: "test"})
	t.Cleanup(r.close)
	waitFor(t, func() bool {
		return fmt.Sprint(c.SMembers(ctx, "rl:ovr-index").Val()) == "[both]"
	})
	if h := c.HGetAll(ctx, "rl:ovr:{both}").Val(); len(h) != 1 || h["web"] == "" {
		t.Fatalf("hash of both: %v, want web only", h)
	}
	if l := r.table.List(""); len(l) != 1 || l[0].Tenant != "both" || l[0].Policy != "web" {
		t.Fatalf("table: %v", l)
	}

	// The conditional HDEL: a newer value is never dropped for an old one.
	newer := `{"tenant":"both","policy":"web","max_events":3}`
	c.HSet(ctx, "rl:ovr:{both}", "web", newer)
	if n, err := hdelIfScript.Run(ctx, c, []string{"rl:ovr:{both}"}, "web", `{"tenant":"both","policy":"web","max_events":2}`).Int(); err != nil || n != 0 {
		t.Fatalf("hdelIf of a replaced value: %d %v", n, err)
	}
	if v := c.HGet(ctx, "rl:ovr:{both}", "web").Val(); v != newer {
		t.Fatalf("replaced value dropped: %q", v)
	}
}

// TestOverridesCluster: on a 3-master Redis Cluster, where the index, the
// version and the tenants' hashes live on different nodes, overrides set
// on one instance (and one written without a message) reach another, the
// index empties with the last delete, and no node ever sees a SCAN.
func TestOverridesCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	ctx := context.Background()
	c := cl.Client(t)
	newInstance := func() *OverrideSync {
		r := newOverrideSync(overrideSyncOptions{client: cl.Client(t), prefix: "rl", timeout: time.Second, logger: zap.NewNop(), id: "test"})
		t.Cleanup(r.close)
		return r
	}
	a, b := newInstance(), newInstance()
	const n = 20
	for i := range n {
		tenant := fmt.Sprintf("t%d", i)
		if _, _, err := a.Store(ctx, tenant, "api", &Override{Tenant: tenant, Policy: "api", MaxEvents: int64(i + 1)}, "test"); err != nil {
			t.Fatal(err)
		}
	}
	// Written by hand, without a message: the version poll brings it.
	for _, err := range []error{
		c.HSet(ctx, "rl:ovr:{quiet}", "api", `{"tenant":"quiet","policy":"api","max_events":99}`).Err(),
		c.SAdd(ctx, "rl:ovr-index", "quiet").Err(),
		c.Incr(ctx, "rl:ovr-version").Err(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return len(b.table.List("")) == n+1 })
	if o, ok := get(b.table, "t7", "api"); !ok || o.MaxEvents != 8 {
		t.Fatalf("b: t7 = %+v %v", o, ok)
	}
	if o, ok := get(b.table, "quiet", "api"); !ok || o.MaxEvents != 99 {
		t.Fatalf("b: quiet = %+v %v", o, ok)
	}
	for i := range n {
		tenant := fmt.Sprintf("t%d", i)
		if _, _, err := b.Store(ctx, tenant, "api", nil, "test"); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return len(a.table.List("")) == 1 })
	if m := c.SMembers(ctx, "rl:ovr-index").Val(); fmt.Sprint(m) != "[quiet]" {
		t.Fatalf("index after the deletes: %v", m)
	}
	for _, node := range cl.Nodes() {
		info := node.CLI(t, "INFO", "commandstats")
		if strings.Contains(info, "cmdstat_scan:") {
			t.Errorf("node %s saw SCAN calls:\n%s", node.Addr, info)
		}
	}
}
