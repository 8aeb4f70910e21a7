package fleet

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// TestAnyBreakerOpen: the process-wide breaker state is that of the
// backends in use: a backend released while its breaker is open no
// longer counts (caddy_rate_limit_breaker_open stayed at 1 for good after
// a reload during an outage).
func TestAnyBreakerOpen(t *testing.T) {
	if AnyBreakerOpen() {
		t.Fatal("a breaker is open before any backend exists")
	}
	down, err := Acquire(BackendOptions{Connection: Connection{Addresses: []string{"127.0.0.1:1"}, Timeout: 100 * time.Millisecond},
		Prefix: "brk", BreakerFailures: 1, BreakerCooldown: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c := limiter.Check{Algorithm: limiter.TokenBucket, Tenant: "t", Policy: "p", Rate: limiter.Rate{Limit: 1, Window: time.Second}, Cost: 1}
	_, _ = down.Store().Decide(context.Background(), []limiter.Check{c}, make([]limiter.Result, 1))
	if !down.Store().Open() || !AnyBreakerOpen() {
		t.Fatalf("breaker open %v, any open %v after a failed call", down.Store().Open(), AnyBreakerOpen())
	}
	if err := down.Release(); err != nil {
		t.Log(err)
	}
	if AnyBreakerOpen() {
		t.Fatal("a released backend's open breaker still counts")
	}
}

// TestBackendProbesUntilReleased: an open breaker probes Redis by itself
// each cooldown, without requests, and stops once the backend is released
// (its timer would otherwise keep a released backend alive for good).
func TestBackendProbesUntilReleased(t *testing.T) {
	const cooldown = 30 * time.Millisecond
	down, err := Acquire(BackendOptions{Connection: Connection{Addresses: []string{"127.0.0.1:1"}, Timeout: 100 * time.Millisecond},
		Prefix: "probe", BreakerFailures: 1, BreakerCooldown: cooldown})
	if err != nil {
		t.Fatal(err)
	}
	c := limiter.Check{Algorithm: limiter.TokenBucket, Tenant: "t", Policy: "p", Rate: limiter.Rate{Limit: 1, Window: time.Second}, Cost: 1}
	_, _ = down.Store().Decide(context.Background(), []limiter.Check{c}, make([]limiter.Result, 1))
	if !down.Store().Open() {
		t.Fatal("breaker not open after a failed call")
	}
	waitFor(t, func() bool { return down.probes.Load() >= 2 })
	if err := down.Release(); err != nil {
		t.Log(err)
	}
	n := down.probes.Load()
	time.Sleep(10 * cooldown)
	if got := down.probes.Load(); got > n+1 { // one may have been due
		t.Fatalf("%d probes after Release, want none", got-n)
	}
}

// TestBackendClusterFunctions: with functions on a Redis Cluster, the
// backend's store sees the cluster client (not the shared client's
// wrapper), so it batches per master and loads the function library on
// each one: decisions of tenants spread over every master run as FCALL
// there.
func TestBackendClusterFunctions(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	var addrs []string
	for _, n := range cl.Nodes() {
		addrs = append(addrs, n.Addr)
	}
	b, err := Acquire(BackendOptions{Connection: Connection{Addresses: addrs, Cluster: true, Timeout: 2 * time.Second}, Prefix: "fn", Functions: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	p := &limiter.Policy{Name: "p", Algorithm: limiter.TokenBucket, Limit: limiter.Limit{Rate: limiter.Rate{Limit: 100, Window: time.Minute}}}
	for i := range 60 {
		var d limiter.Decision
		if err := d.Decide(context.Background(), b.Store(), []limiter.Item{{Policy: p, Tenant: fmt.Sprint("tenant-", i), Cost: 1}}); err != nil || !d.Admitted {
			t.Fatal(d.Admitted, err)
		}
	}
	for _, n := range cl.Nodes() {
		c := n.Client(t)
		info, err := c.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		var calls, failed int
		for _, line := range strings.Split(info, "\r\n") {
			rest, ok := strings.CutPrefix(line, "cmdstat_fcall:")
			if !ok {
				continue
			}
			for _, kv := range strings.Split(rest, ",") {
				k, v, _ := strings.Cut(kv, "=")
				switch k {
				case "calls":
					calls, _ = strconv.Atoi(v)
				case "failed_calls":
					failed, _ = strconv.Atoi(v)
				}
			}
		}
		// 60 tenants over 3 masters: each holds some of them.
		if calls-failed < 5 {
			t.Errorf("master %s: %d FCALL calls (%d failed), want its share of the 60 decisions", n.Addr, calls, failed)
		}
	}
	// The instance heartbeat is a function too: after two more beats, no
	// master has run a script.
	last := b.reg.LastHeartbeat()
	for beats, deadline := 0, time.Now().Add(10*time.Second); beats < 2; {
		if time.Now().After(deadline) {
			t.Fatal("no heartbeat for 10s")
		}
		if l := b.reg.LastHeartbeat(); l.After(last) {
			last, beats = l, beats+1
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, n := range cl.Nodes() {
		info := n.Client(t).Info(context.Background(), "commandstats").Val()
		if strings.Contains(info, "cmdstat_evalsha:") || strings.Contains(info, "cmdstat_eval:") {
			t.Errorf("master %s ran a script: %s", n.Addr, info)
		}
	}
}
