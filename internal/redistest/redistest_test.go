//go:build unix

package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// timed logs how long a start took.
func timed[T any](t *testing.T, what string, f func() T) T {
	start := time.Now()
	v := f()
	t.Logf("%s took %v", what, time.Since(start).Round(time.Millisecond))
	return v
}

func TestStandalone(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s := timed(t, "StartStandalone", func() *Server { return StartStandalone(t, Options{}) })
	if s.Port == 0 || s.Addr != "127.0.0.1:"+strconv.Itoa(s.Port) {
		t.Fatalf("bad address %q / %d", s.Addr, s.Port)
	}
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET = %q, %v", got, err)
	}
	if got := s.CLI(t, "GET", "k"); got != "v" {
		t.Fatalf("redis-cli GET = %q", got)
	}
	if got := s.CLI(t, "CONFIG", "GET", "dir"); !strings.Contains(got, s.Dir) {
		t.Fatalf("dir = %q, want %s", got, s.Dir)
	}
	if _, err := os.Stat(s.LogFile); err != nil {
		t.Fatal(err)
	}
}

func TestStopKillIdempotent(t *testing.T) {
	t.Parallel()
	s := StartStandalone(t, Options{})
	pid := s.Pid()
	if pid == 0 || !s.Running() {
		t.Fatal("not running")
	}
	s.Stop()
	s.Stop()
	s.Kill()
	if s.Running() || s.Pid() != 0 {
		t.Fatal("still running after Stop")
	}
	// The process is gone (reaped), not a zombie.
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("pid %d still exists", pid)
	}
}

func TestPasswordAndACL(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s := StartStandalone(t, Options{
		Password: "s3cret",
		ACLUsers: []string{
			"user alice on >alicepw ~* +@all",
			"bob on >bobpw ~bob:* +get +set", // "user " prefix optional
		},
	})
	if err := s.Client(t).Ping(ctx).Err(); err != nil {
		t.Fatalf("default user with password: %v", err)
	}
	if got := s.CLI(t, "PING"); got != "PONG" {
		t.Fatalf("redis-cli PING = %q", got)
	}

	try := func(user, pass string) error {
		opt := s.ClientOptions()
		opt.Username, opt.Password = user, pass
		c := redis.NewClient(opt)
		defer c.Close()
		return c.Set(ctx, "bob:x", "1", 0).Err()
	}
	if err := try("alice", "alicepw"); err != nil {
		t.Fatalf("alice: %v", err)
	}
	if err := try("bob", "bobpw"); err != nil {
		t.Fatalf("bob: %v", err)
	}
	if err := try("alice", "wrong"); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("alice with a wrong password: %v, want WRONGPASS", err)
	}
	if err := try("", "wrong"); err == nil {
		t.Fatal("default user with a wrong password succeeded")
	}
	if err := try("", ""); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("no password: %v, want NOAUTH", err)
	}
}

func TestACLDefaultUserOff(t *testing.T) {
	t.Parallel()
	// The readiness check cannot authenticate here; it must still work.
	s := StartStandalone(t, Options{ACLUsers: []string{"user default off", "user carol on >pw ~* +@all"}})
	opt := s.ClientOptions()
	opt.Username, opt.Password = "carol", "pw"
	c := redis.NewClient(opt)
	defer c.Close()
	if err := c.Ping(ctxT(t)).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestTLS(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s := timed(t, "StartStandalone(TLS)", func() *Server { return StartStandalone(t, Options{TLS: true, Password: "pw"}) })
	for _, f := range []string{s.TLS.CA, s.TLS.ServerCert, s.TLS.ServerKey, s.TLS.ClientCert, s.TLS.ClientKey} {
		if _, err := os.Stat(f); err != nil {
			t.Fatal(err)
		}
	}
	c := s.Client(t)
	if err := c.Set(ctx, "k", "tls", 0).Err(); err != nil {
		t.Fatalf("TLS client: %v", err)
	}
	if got := s.CLI(t, "GET", "k"); got != "tls" {
		t.Fatalf("redis-cli --tls GET = %q", got)
	}

	plain := redis.NewClient(&redis.Options{
		Addr: s.Addr, Password: "pw", MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
	})
	defer plain.Close()
	if err := plain.Ping(ctx).Err(); err == nil {
		t.Fatal("plain TCP client to the TLS port succeeded")
	}

	// Client certificates are required by default.
	opt := s.ClientOptions()
	opt.TLSConfig.Certificates = nil
	opt.MaxRetries = -1
	nocert := redis.NewClient(opt)
	defer nocert.Close()
	if err := nocert.Ping(ctx).Err(); err == nil {
		t.Fatal("TLS client without a certificate succeeded")
	}
}

func TestTLSOptionalClientCert(t *testing.T) {
	t.Parallel()
	s := StartStandalone(t, Options{TLS: true, TLSAuthClients: "optional"})
	opt := s.ClientOptions()
	opt.TLSConfig.Certificates = nil
	c := redis.NewClient(opt)
	defer c.Close()
	if err := c.Ping(ctxT(t)).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestArgs(t *testing.T) {
	t.Parallel()
	s := StartStandalone(t, Options{Args: []string{"--maxmemory", "12mb"}})
	if got := s.CLI(t, "CONFIG", "GET", "maxmemory"); !strings.HasSuffix(got, strconv.Itoa(12<<20)) {
		t.Fatalf("maxmemory = %q", got)
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	c := timed(t, "StartCluster(3,0)", func() *Cluster { return StartCluster(t, 3, 0) })
	if len(c.Masters) != 3 || len(c.Replicas) != 0 || len(c.Addrs) != 3 {
		t.Fatalf("got %d masters, %d replicas, %d addrs", len(c.Masters), len(c.Replicas), len(c.Addrs))
	}
	for _, m := range c.Masters {
		if info := m.CLI(t, "CLUSTER", "INFO"); !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_assigned:16384") {
			t.Fatalf("%s: %s", m.Addr, info)
		}
	}
	// Every slot is covered by exactly one range.
	//lint:ignore SA1019 go-redis itself reads the topology from CLUSTER SLOTS (Redis 7.0 has both)
	slots, err := c.Masters[0].Client(t).ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	covered := make([]bool, 16384)
	for _, r := range slots {
		for i := r.Start; i <= r.End; i++ {
			if covered[i] {
				t.Fatalf("slot %d covered twice", i)
			}
			covered[i] = true
		}
	}
	for i, ok := range covered {
		if !ok {
			t.Fatalf("slot %d not covered", i)
		}
	}
	if first := c.Masters[0].CLI(t, "CLUSTER", "KEYSLOT", "{tenant-a}:x"); first != c.Masters[0].CLI(t, "CLUSTER", "KEYSLOT", "{tenant-a}:y") {
		t.Fatal("keys with the same hash tag are in different slots")
	}

	cc := c.Client(t)
	seen := map[int64]bool{}
	for i := 0; i < 20; i++ {
		k := fmt.Sprintf("key-%d", i)
		slot, err := cc.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		seen[slot] = true
		if err := cc.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	if len(seen) < 2 {
		t.Fatal("keys all in one slot")
	}
	for i := 0; i < 20; i++ {
		if got, err := cc.Get(ctx, fmt.Sprintf("key-%d", i)).Int(); err != nil || got != i {
			t.Fatalf("GET key-%d = %d, %v", i, got, err)
		}
	}
	// Masters[0] owns slot 0.
	if owner := slots[0]; owner.Start == 0 && owner.Nodes[0].Addr != c.Masters[0].Addr {
		t.Fatalf("slot 0 is owned by %s, not Masters[0] %s", owner.Nodes[0].Addr, c.Masters[0].Addr)
	}
}

func TestClusterWithReplicas(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	c := timed(t, "StartCluster(3,1)", func() *Cluster { return StartCluster(t, 3, 1) })
	if len(c.Masters) != 3 || len(c.Replicas) != 3 || len(c.Addrs) != 6 {
		t.Fatalf("got %d masters, %d replicas, %d addrs", len(c.Masters), len(c.Replicas), len(c.Addrs))
	}
	for i, r := range c.Replicas {
		role := r.CLI(t, "ROLE")
		if !strings.HasPrefix(role, "slave") {
			t.Fatalf("replica %d %s: ROLE = %q", i, r.Addr, role)
		}
		// Replicas are ordered like their masters.
		if !strings.Contains(role, strconv.Itoa(c.Masters[i].Port)) {
			t.Fatalf("replica %d replicates %q, want master %s", i, role, c.Masters[i].Addr)
		}
	}
	cc := c.Client(t)
	if err := cc.Set(ctx, "{t}:a", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := cc.Get(ctx, "{t}:a").Result(); err != nil || got != "1" {
		t.Fatalf("GET = %q, %v", got, err)
	}
}

func TestSentinel(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s := timed(t, "StartSentinel", func() *Sentinel { return StartSentinel(t) })
	if got := s.MasterAddr(t); got != s.Master.Addr {
		t.Fatalf("master = %s, want %s", got, s.Master.Addr)
	}
	fc := s.FailoverClient(t)
	if err := fc.Set(ctx, "k", "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := fc.Get(ctx, "k").Result(); err != nil || got != "before" {
		t.Fatalf("GET = %q, %v", got, err)
	}
	// Let the write reach the replica before the master dies.
	waitFor(t, 5*time.Second, "replication", func(ctx context.Context) error {
		if got := s.Replica.CLI(t, "GET", "k"); got != "before" {
			return fmt.Errorf("replica has %q", got)
		}
		return nil
	})

	start := time.Now()
	s.Master.Kill()
	s.WaitMasterAddr(t, s.Replica.Addr)
	t.Logf("failover took %v", time.Since(start).Round(time.Millisecond))

	waitFor(t, 20*time.Second, "failover client to write to the new master", func(ctx context.Context) error {
		return fc.Set(ctx, "k2", "after", 0).Err()
	})
	t.Logf("failover client recovered after %v", time.Since(start).Round(time.Millisecond))
	if got, err := fc.Get(ctx, "k").Result(); err != nil || got != "before" {
		t.Fatalf("GET k after failover = %q, %v", got, err)
	}
	if got := s.Replica.CLI(t, "GET", "k2"); got != "after" {
		t.Fatalf("new master has k2 = %q", got)
	}
	if role := s.Replica.CLI(t, "ROLE"); !strings.HasPrefix(role, "master") {
		t.Fatalf("replica ROLE = %q", role)
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := StartStandalone(t, Options{})
	opt := s.ClientOptions()
	opt.ReadTimeout = 200 * time.Millisecond
	opt.MaxRetries = -1
	c := redis.NewClient(opt)
	defer c.Close()
	ctx := ctxT(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	s.Pause()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING answered by a paused server")
	}
	s.Resume()
	waitFor(t, 5*time.Second, "PING after Resume", func(ctx context.Context) error { return c.Ping(ctx).Err() })
}

func TestPausedServerIsCleanedUp(t *testing.T) {
	RequireBinaries(t)
	t.Parallel()
	var pid int
	t.Run("inner", func(t *testing.T) {
		s := StartStandalone(t, Options{})
		pid = s.Pid()
		s.Pause()
	})
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("paused server pid %d survived its test's cleanup", pid)
	}
}

func TestRestart(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s := StartStandalone(t, Options{Password: "pw"})
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	port, pid := s.Port, s.Pid()
	start := time.Now()
	s.Restart(t)
	t.Logf("Restart took %v", time.Since(start).Round(time.Millisecond))
	if s.Port != port || s.Pid() == pid || s.Pid() == 0 {
		t.Fatalf("port %d->%d pid %d->%d", port, s.Port, pid, s.Pid())
	}
	// Same client, same address: it reconnects; data is gone (no persistence).
	waitFor(t, 5*time.Second, "client to reconnect", func(ctx context.Context) error { return c.Ping(ctx).Err() })
	if err := c.Get(ctx, "k").Err(); err != redis.Nil {
		t.Fatalf("GET after restart: %v, want redis.Nil", err)
	}

	// Restart after Kill works too.
	s.Kill()
	s.Restart(t)
	if got := s.CLI(t, "PING"); got != "PONG" {
		t.Fatal(got)
	}
}

func TestRestartWithPersistence(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s := StartStandalone(t, Options{Args: []string{"--appendonly", "yes", "--appendfsync", "always"}})
	c := s.Client(t)
	if err := c.Set(ctx, "k", "kept", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Restart(t)
	waitFor(t, 5*time.Second, "data after restart", func(ctx context.Context) error {
		got, err := c.Get(ctx, "k").Result()
		if err == nil && got != "kept" {
			return fmt.Errorf("got %q", got)
		}
		return err
	})
}

func TestCLIErrorFails(t *testing.T) {
	t.Parallel()
	s := StartStandalone(t, Options{})
	ft := &fakeTB{TB: t}
	func() {
		defer func() { _ = recover() }()
		s.CLI(ft, "NOSUCHCOMMAND")
	}()
	if !ft.fatal {
		t.Fatal("CLI did not fail on an error reply")
	}
}

func TestBadConfigFailsWithLog(t *testing.T) {
	t.Parallel()
	ft := &fakeTB{TB: t}
	start := time.Now()
	func() {
		defer func() { _ = recover() }()
		StartStandalone(ft, Options{Args: []string{"--no-such-directive", "1"}})
	}()
	if !ft.fatal {
		t.Fatal("StartStandalone with a bad directive did not fail")
	}
	if !strings.Contains(ft.msg, "no-such-directive") {
		t.Fatalf("failure message does not show redis' complaint:\n%s", ft.msg)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("failing took %v", d)
	}
}

// fakeTB records Fatalf instead of failing the real test.
type fakeTB struct {
	testing.TB
	fatal bool
	msg   string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatal = true
	f.msg = fmt.Sprintf(format, args...)
	panic("fatal")
}

func TestPortTakenRetries(t *testing.T) {
	t.Parallel()
	// A foreign listener on the chosen port: redis-server fails to bind
	// and the start is retried on another port.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port
	s := newServer(t)
	s.firstPort = taken
	s.start(t)
	if s.Port == taken {
		t.Fatal("started on a taken port")
	}
	if got := s.CLI(t, "PING"); got != "PONG" {
		t.Fatal(got)
	}

	// A foreign redis-server on the chosen port answers PING, but must not
	// be mistaken for the new one.
	other := StartStandalone(t, Options{})
	s2 := newServer(t)
	s2.firstPort = other.Port
	s2.start(t)
	if s2.Port == other.Port || s2.Pid() == other.Pid() {
		t.Fatalf("new server %s (pid %d) is the foreign one %s (pid %d)", s2.Addr, s2.Pid(), other.Addr, other.Pid())
	}

	// Same for a cluster node whose bus port is taken.
	bus, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer bus.Close()
	busPort := bus.Addr().(*net.TCPAddr).Port
	if busPort > clusterBusOffset {
		s3 := newServer(t)
		s3.bus = true
		s3.config = append(s3.config, "cluster-enabled yes", "cluster-config-file nodes.conf")
		s3.firstPort = busPort - clusterBusOffset
		s3.start(t)
		if s3.Port == busPort-clusterBusOffset {
			t.Fatal("cluster node started although its bus port is taken")
		}
		if info := s3.CLI(t, "CLUSTER", "INFO"); !strings.Contains(info, "cluster_known_nodes:1") {
			t.Fatal(info)
		}
	}
}

func TestFreePortCluster(t *testing.T) {
	t.Parallel()
	seen := map[int]bool{}
	for i := 0; i < 50; i++ {
		p := freePort(t, true)
		if p > maxClusterPort || seen[p] || seen[p+clusterBusOffset] {
			t.Fatalf("bad port %d", p)
		}
		seen[p], seen[p+clusterBusOffset] = true, true
	}
}
