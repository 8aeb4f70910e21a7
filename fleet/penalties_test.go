package fleet

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// TestPenaltySyncFleet: two backends on one prefix (two instances) count
// one bucket's denials together; the one whose denial reaches the count
// boxes the bucket in Redis with the box's exact TTL, indexes it and
// tells the other, which refuses it too without a call; a lift through
// either clears the box everywhere. Also on a 3-master Cluster, where
// the marker and the index live on different nodes.
func TestPenaltySyncFleet(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		srv := redistest.StartStandalone(t, redistest.Options{})
		testPenaltySyncFleet(t, []string{srv.Addr})
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3, 0)
		var addrs []string
		for _, n := range cl.Nodes() {
			addrs = append(addrs, n.Addr)
		}
		testPenaltySyncFleet(t, addrs)
	})
}

func testPenaltySyncFleet(t *testing.T, addrs []string) {
	n := 0
	open := func() *Backend {
		// Distinct connection settings: distinct backends, as processes.
		n++
		b, err := Acquire(BackendOptions{Connection: Connection{Addresses: addrs, Cluster: len(addrs) > 1, Timeout: time.Second + time.Duration(n)*time.Millisecond}, Prefix: "pen"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Release() })
		return b
	}
	a, b := open(), open()
	// Each box is told once for the fleet: by the backend that made it.
	var toldMu sync.Mutex
	var told []string
	for name, be := range map[string]*Backend{"a": a, "b": b} {
		stop := be.Penalties().WatchBoxes(func(box limiter.Box) bool {
			toldMu.Lock()
			defer toldMu.Unlock()
			told = append(told, name+" "+box.Tenant)
			return true
		})
		defer stop()
	}
	k := limiter.PenaltyKey{Policy: "api", Tenant: "mallory", Part: "1.2.3.4"}
	pen := limiter.Penalty{Duration: 3 * time.Second, After: 3}
	a.Penalties().Denied(k, pen, limiter.Limit{Rate: limiter.Rate{Window: time.Minute}})
	b.Penalties().Denied(k, pen, limiter.Limit{Rate: limiter.Rate{Window: time.Minute}})
	time.Sleep(100 * time.Millisecond)
	for _, be := range []*Backend{a, b} {
		if _, ok := be.Penalties().Boxed(k); ok {
			t.Fatal("boxed after 2 denials of 3")
		}
	}
	start := time.Now()
	a.Penalties().Denied(k, pen, limiter.Limit{Rate: limiter.Rate{Window: time.Minute}})
	waitFor(t, func() bool { _, ok := b.Penalties().Boxed(k); return ok })
	for _, be := range []*Backend{a, b} {
		left, ok := be.Penalties().Boxed(k)
		if !ok || left > 3*time.Second || left < 3*time.Second-time.Since(start)-50*time.Millisecond {
			t.Fatalf("boxed %v, %v left", ok, left)
		}
	}
	time.Sleep(100 * time.Millisecond) // anything told twice would be by now
	toldMu.Lock()
	if got := strings.Join(told, "|"); got != "a mallory" {
		t.Errorf("boxes told: %q, want the maker a's, once", got)
	}
	toldMu.Unlock()
	// The marker's TTL is the box's.
	c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: addrs, IsClusterMode: len(addrs) > 1})
	defer c.Close()
	ctx := context.Background()
	marker := a.Penalties().markerKey(k)
	if ttl, err := c.PTTL(ctx, marker).Result(); err != nil || ttl <= 2*time.Second || ttl > 3*time.Second {
		t.Fatalf("marker %s: TTL %v, %v", marker, ttl, err)
	}
	if n, _ := c.Exists(ctx, a.Penalties().countKey(k)).Result(); n != 0 {
		t.Error("the count outlives the box's start")
	}
	// Listed fleet-wide, through either backend.
	for _, be := range []*Backend{a, b} {
		es, err := be.Penalties().List(ctx, "mallory", "", 10)
		if err != nil || len(es) != 1 || es[0].PenaltyKey != k {
			t.Fatalf("list: %+v, %v", es, err)
		}
	}
	// A third instance started now learns of it from the index.
	c3 := open()
	waitFor(t, func() bool { _, ok := c3.Penalties().Boxed(k); return ok })

	var audited []string
	lifted, err := b.Penalties().Lift(ctx, "mallory", "api", "test", func(_ context.Context, action, _, _, _, _, _ string) {
		audited = append(audited, action)
	})
	if err != nil || len(lifted) != 1 || len(audited) != 1 {
		t.Fatalf("lift: %+v, %v, audit %v", lifted, err, audited)
	}
	for _, be := range []*Backend{a, b, c3} {
		waitFor(t, func() bool { _, ok := be.Penalties().Boxed(k); return !ok })
	}
	if n, _ := c.Exists(ctx, marker).Result(); n != 0 {
		t.Error("marker left after the lift")
	}
	if es, _ := a.Penalties().List(ctx, "", "", 10); len(es) != 0 {
		t.Errorf("listed after the lift: %+v", es)
	}
}
