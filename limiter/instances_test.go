package limiter

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// waitCount polls until r.Count() == want, failing after timeout; it
// returns how long that took.
func waitCount(t *testing.T, r *Registry, want int, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for r.Count() != want {
		if time.Since(start) > timeout {
			t.Fatalf("registry %s: Count %d after %v, want %d", r.ID(), r.Count(), timeout, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

func TestRegistry(t *testing.T) {
	checkLeaks(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	const interval = 100 * time.Millisecond
	opts := RegistryOptions{Client: client, Prefix: "tg", Interval: interval}

	a := NewRegistry(opts)
	if a.Count() != 1 {
		t.Fatalf("Count before the first heartbeat = %d, want 1", a.Count())
	}
	if !strings.Contains(a.ID(), "-") || a.Key() != "tg:instances" {
		t.Errorf("ID %q, Key %q", a.ID(), a.Key())
	}
	b := NewRegistry(opts)
	if a.ID() == b.ID() {
		t.Fatal("two registries share an ID")
	}
	da := waitCount(t, a, 2, 2*interval+time.Second)
	db := waitCount(t, b, 2, 2*interval+time.Second)
	t.Logf("both count 2 after %v / %v (interval %v)", da, db, interval)
	if a.LastHeartbeat().IsZero() {
		t.Error("LastHeartbeat is zero after heartbeats")
	}
	// Scores are Redis TIME in ms; the key has a TTL.
	zs, err := client.ZRangeWithScores(bgCtx, "tg:instances", 0, -1).Result()
	if err != nil || len(zs) != 2 {
		t.Fatalf("ZRANGE: %v %v", zs, err)
	}
	if d := time.Since(time.UnixMilli(int64(zs[0].Score))); d < -time.Second || d > time.Second {
		t.Errorf("score %v is not now in ms", zs[0].Score)
	}
	if ttl := client.PTTL(bgCtx, "tg:instances").Val(); ttl <= 0 || ttl > 6*interval {
		t.Errorf("PTTL %v, want in (0, %v]", ttl, 6*interval)
	}

	// Close removes the member at once: the other counts 1 at its next
	// heartbeat.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	d := waitCount(t, a, 1, 2*interval+time.Second)
	t.Logf("Close seen after %v", d)

	// An instance that dies without Close ages out after 3 intervals.
	c := NewRegistry(opts)
	waitCount(t, a, 2, 2*interval+time.Second)
	c.stop() // heartbeats stop, the member stays
	stopped := time.Now()
	waitCount(t, a, 1, 5*interval+time.Second)
	aged := time.Since(stopped)
	t.Logf("killed instance aged out after %v (3 intervals = %v)", aged, 3*interval)
	if aged < 2*interval {
		t.Errorf("aged out after %v, before 3 intervals", aged)
	}
	c.cancel() // c's resources: the goroutine is already gone

	// Redis down: Count keeps the last known value, never 0.
	srv.Kill()
	time.Sleep(3 * interval)
	if a.Count() != 1 {
		t.Errorf("Count with Redis down = %d, want the last known 1", a.Count())
	}
	if err := a.Close(); err == nil {
		t.Error("Close with Redis down reported no error")
	}
}

// TestRegistryNeverZero: a fresh registry on an unreachable Redis counts 1.
func TestRegistryNeverZero(t *testing.T) {
	checkLeaks(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	srv.Kill()
	r := NewRegistry(RegistryOptions{Client: client, Interval: 20 * time.Millisecond})
	time.Sleep(100 * time.Millisecond)
	if r.Count() != 1 || !r.LastHeartbeat().IsZero() {
		t.Fatalf("Count %d, LastHeartbeat %v", r.Count(), r.LastHeartbeat())
	}
	r.Close()
}

// waitBeats waits for n more successful heartbeats of r, failing after
// timeout.
func waitBeats(t *testing.T, r *Registry, n int, timeout time.Duration) {
	t.Helper()
	start, deadline := r.LastHeartbeat(), time.Now().Add(timeout)
	for n > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("registry %s: fewer heartbeats than wanted in %v", r.ID(), timeout)
		}
		if last := r.LastHeartbeat(); last.After(start) {
			start, n = last, n-1
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRegistryFunctions: with functions, heartbeats are FCALLs of the
// library (loaded by the registry itself where the node lacks it, again
// after FUNCTION FLUSH), and no script runs; without, they are EVALSHAs.
func TestRegistryFunctions(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	calls := func(cmd string) int {
		t.Helper()
		stats := client.Info(bgCtx, "commandstats").Val()
		m := regexp.MustCompile(`cmdstat_` + cmd + `:calls=(\d+)`).FindStringSubmatch(stats)
		if m == nil {
			return 0
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	beats := func(functions bool) {
		t.Helper()
		r := NewRegistry(RegistryOptions{Client: client, Prefix: fmt.Sprint("fn", functions), Interval: 20 * time.Millisecond, Functions: functions})
		defer r.Close()
		waitBeats(t, r, 3, 5*time.Second)
	}

	client.ConfigResetStat(bgCtx)
	beats(true)
	client.FunctionFlush(bgCtx)
	beats(true)
	if f, s := calls("fcall"), calls("evalsha")+calls("eval"); f < 6 || s != 0 {
		t.Errorf("with functions: %d FCALLs, %d script calls; want >= 6 and 0", f, s)
	}
	if l := calls("function\\|load"); l != 2 {
		t.Errorf("FUNCTION LOAD %d times, want 2 (first call, after the flush)", l)
	}

	client.ConfigResetStat(bgCtx)
	beats(false)
	if f, s := calls("fcall"), calls("evalsha"); f != 0 || s < 3 {
		t.Errorf("without functions: %d FCALLs, %d EVALSHAs; want 0 and >= 3", f, s)
	}
}

// TestRegistryFunctionsCluster: on a cluster, the registry loads the
// library on the master of its key itself (FUNCTION LOAD has no key, so
// the cluster client would send it to any master), and no master runs a
// script.
func TestRegistryFunctionsCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	r := NewRegistry(RegistryOptions{Client: cl.Client(t), Prefix: "fnc", Interval: 20 * time.Millisecond, Functions: true})
	defer r.Close()
	waitBeats(t, r, 3, 10*time.Second)
	fcalls := 0
	for _, n := range cl.Nodes() {
		stats := n.Client(t).Info(bgCtx, "commandstats").Val()
		if strings.Contains(stats, "cmdstat_evalsha:") || strings.Contains(stats, "cmdstat_eval:") {
			t.Errorf("master %s ran a script", n.Addr)
		}
		if strings.Contains(stats, "cmdstat_fcall:") {
			fcalls++
		}
	}
	if fcalls != 1 {
		t.Errorf("%d masters ran FCALLs, want 1 (the key's)", fcalls)
	}
}
