package fleet

import (
	"context"
	"fmt"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// TestNearLimitBoard: newest first, bounded per policy (the tenant seen
// least recently goes first), a tenant seen again is refreshed, entries
// older than a day are dropped.
func TestNearLimitBoard(t *testing.T) {
	b := NewNearLimitBoard()
	now := time.Unix(1_700_000_000, 0)
	b.now = func() time.Time { return now }
	for i := range NearLimitPerPolicy + 44 {
		now = now.Add(time.Second)
		b.Note("api", fmt.Sprint("t", i), "", int64(i), 1000, time.Minute)
		if i == 10 {
			b.Note("other", "x", "k", 1, 5, time.Hour)
		}
	}
	// t44..t299 remain; seeing t50 again makes it the newest.
	now = now.Add(time.Second)
	b.Note("api", "t50", "", 3, 1000, 2*time.Minute)
	got := b.Recent("api", 1000)
	if len(got) != NearLimitPerPolicy {
		t.Fatalf("%d entries, want %d", len(got), NearLimitPerPolicy)
	}
	if got[0].Tenant != "t50" || got[0].Remaining != 3 || got[0].ResetAt != now.Add(2*time.Minute).UnixNano() || got[1].Tenant != "t299" {
		t.Fatalf("newest: %+v, %+v", got[0], got[1])
	}
	if last := got[len(got)-1]; last.Tenant != "t44" {
		t.Fatalf("oldest kept: %+v, want t44 (t0..t43 evicted)", last)
	}
	if all := b.Recent("", 3); len(all) != 3 || all[0].Tenant != "t50" {
		t.Fatalf("all policies: %+v", all)
	}
	if o := b.Recent("other", 10); len(o) != 1 || o[0].Key != "k" || o[0].Limit != 5 {
		t.Fatalf("other policy: %+v", o)
	}
	// A day later: t293..t299 and t50 were seen within the last day.
	now = now.Add(nearMaxAge - 7*time.Second)
	if got := b.Recent("api", 1000); len(got) != 8 || got[0].Tenant != "t50" || got[7].Tenant != "t293" {
		t.Fatalf("after a day: %d entries (%+v), want the 8 seen in the last day", len(got), got)
	}
}

// commandCalls reads INFO commandstats: calls per command.
func commandCalls(t *testing.T, srv *redistest.Server) map[string]int {
	t.Helper()
	out := map[string]int{}
	re := regexp.MustCompile(`cmdstat_([a-z|]+):calls=(\d+)`)
	for _, m := range re.FindAllStringSubmatch(srv.CLI(t, "INFO", "commandstats"), -1) {
		n, _ := strconv.Atoi(m[2])
		out[m[1]] = n
	}
	return out
}

// TestNearLimitFleet: two instances (backends) on one Redis prefix; each
// sees the other's near-limit tenants once published, the newest
// sighting of a tenant wins, a publication is one round trip of four
// commands and only happens when something changed, and with Redis down
// an instance still lists its own.
func TestNearLimitFleet(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	acquire := func(host string) *Backend {
		b, err := Acquire(BackendOptions{Connection: Connection{Addresses: []string{strings.Replace(srv.Addr, "127.0.0.1", host, 1)}, Timeout: time.Second}, Prefix: "nl"})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b := acquire("127.0.0.1"), acquire("localhost")
	defer a.Release()
	defer b.Release()
	if a == b {
		t.Fatal("one backend for both")
	}
	ctx := context.Background()
	a.NearLimit().Note("api", "acme", "", 5, 100, time.Minute)
	b.NearLimit().Note("api", "acme", "", 3, 100, time.Minute)
	b.NearLimit().Note("api", "bigco", "", 10, 100, time.Minute)
	b.NearLimit().Note("search", "acme", "", 0, 10, time.Second)

	// Nothing published yet: each instance sees its own.
	if es, err := a.NearLimitFleet(ctx, "", 10); err != nil || len(es) != 1 || es[0].Instance != a.reg.ID() {
		t.Fatalf("a before publishing: %+v %v", es, err)
	}
	// Both instances' heartbeats (a script a second) also run ZADD,
	// ZREMRANGEBYSCORE and PEXPIRE, and a's own publisher may publish: a
	// window in which anything else ran is measured again (a publication
	// that really sent more than one of each fails every attempt).
	pubCmds := []string{"set", "zadd", "zremrangebyscore", "pexpire"}
	var before, after map[string]int
	for attempt := 0; attempt < 10; attempt++ {
		before = commandCalls(t, srv)
		if err := b.nearPub.publish(); err != nil {
			t.Fatal(err)
		}
		after = commandCalls(t, srv)
		alone := after["evalsha"]+after["eval"]+after["fcall"] == before["evalsha"]+before["eval"]+before["fcall"]
		for _, cmd := range pubCmds {
			alone = alone && after[cmd]-before[cmd] == 1
		}
		if alone {
			break
		}
		b.nearPub.board.dirty.Store(true) // publish the same snapshot again
	}
	for _, cmd := range pubCmds {
		if after[cmd]-before[cmd] != 1 {
			t.Errorf("%s: %d calls for one publication, want 1", cmd, after[cmd]-before[cmd])
		}
	}
	if err := b.nearPub.publish(); err != nil || commandCalls(t, srv)["set"] != after["set"] {
		t.Errorf("a publication without changes wrote to Redis (err %v)", err)
	}

	es, err := a.NearLimitFleet(ctx, "api", 10)
	if err != nil || len(es) != 2 {
		t.Fatalf("a's fleet view of api: %+v %v", es, err)
	}
	if es[0].Tenant != "bigco" || es[1].Tenant != "acme" {
		t.Fatalf("fleet view: %+v, want bigco then acme (newest first)", es)
	}
	for _, e := range es {
		if e.Tenant == "acme" && (e.Remaining != 3 || e.Instance != b.reg.ID()) {
			t.Fatalf("acme: %+v, want b's newer sighting (3 left)", e)
		}
	}
	if es, _ := a.NearLimitFleet(ctx, "", 10); len(es) != 3 {
		t.Fatalf("all policies: %+v", es)
	}
	if es, _ := a.NearLimitFleet(ctx, "", 1); len(es) != 1 || es[0].Policy != "search" {
		t.Fatalf("count 1: %+v", es)
	}
	// a newer sighting on a is newer than b's published one.
	a.NearLimit().Note("api", "acme", "", 1, 100, time.Minute)
	if es, _ := a.NearLimitFleet(ctx, "api", 1); es[0].Remaining != 1 || es[0].Instance != a.reg.ID() {
		t.Fatalf("after a's newer sighting: %+v", es)
	}

	// An instance whose Redis is down lists its own tenants.
	down, err := Acquire(BackendOptions{Connection: Connection{Addresses: []string{"127.0.0.1:1"}, Timeout: 100 * time.Millisecond}, Prefix: "nl"})
	if err != nil {
		t.Fatal(err)
	}
	down.NearLimit().Note("api", "acme", "", 1, 100, time.Minute)
	es, err = down.NearLimitFleet(ctx, "api", 10)
	down.Release()
	if err == nil || len(es) != 1 || es[0].Tenant != "acme" {
		t.Fatalf("Redis down: %+v %v, want its own entry and an error", es, err)
	}
	// go-redis retries the dead address in a goroutine that sleeps a
	// second between dials and ends at its next wake-up once the pool is
	// closed: wait for it, or TestMain's leak check fails when this test
	// runs last.
	waitFor(t, func() bool {
		buf := make([]byte, 1<<20)
		return !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "(*ConnPool).tryDial")
	})
}

// TestNearLimitFleetCluster: the snapshots of a cluster's instances live
// in several slots; reading them is still one pipelined round trip.
func TestNearLimitFleetCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	var addrs []string
	for _, n := range cl.Nodes() {
		addrs = append(addrs, n.Addr)
	}
	var bs []*Backend
	for i := range 3 {
		b, err := Acquire(BackendOptions{Connection: Connection{Addresses: addrs[i:], Cluster: true, Timeout: time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Release()
		b.NearLimit().Note("api", fmt.Sprint("tenant-", i), "", int64(i), 10, time.Minute)
		if err := b.nearPub.publish(); err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	es, err := bs[0].NearLimitFleet(context.Background(), "api", 10)
	if err != nil || len(es) != 3 {
		t.Fatalf("%+v %v", es, err)
	}
}
