package redistest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMasterName is the name under which StartSentinel's sentinel
// monitors the master.
const SentinelMasterName = "mymaster"

// sentinelTimeout bounds the waits of StartSentinel and WaitMasterAddr.
const sentinelTimeout = 30 * time.Second

// Sentinel is a master, one replica of it and one sentinel monitoring them
// with quorum 1, down-after-milliseconds 1000 and failover-timeout 5000, so a
// killed master is failed over within a few seconds.
type Sentinel struct {
	// MasterName is the monitored master's name, SentinelMasterName.
	MasterName string
	// Master and Replica are the data nodes in their initial roles; after a
	// failover the roles are swapped (ask MasterAddr).
	Master, Replica *Server
	// Sentinel is the sentinel process (redis-server --sentinel).
	Sentinel *Server
	// SentinelAddrs are the sentinel addresses, for go-redis' FailoverOptions.
	SentinelAddrs []string
}

// StartSentinel starts a master, a replica and a sentinel and waits until the
// replica is in sync and the sentinel has discovered it. Everything is killed
// at the end of the test.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	master := StartStandalone(t, Options{})

	replica := newServer(t)
	replica.config = append(replica.config, fmt.Sprintf("replicaof 127.0.0.1 %d", master.Port))
	replica.start(t)

	sent := newServer(t)
	sent.sentinel = true
	sent.config = append(sent.config,
		fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1", SentinelMasterName, master.Port),
		"sentinel down-after-milliseconds "+SentinelMasterName+" 1000",
		"sentinel failover-timeout "+SentinelMasterName+" 5000",
		"sentinel parallel-syncs "+SentinelMasterName+" 1",
	)
	sent.start(t)

	s := &Sentinel{
		MasterName:    SentinelMasterName,
		Master:        master,
		Replica:       replica,
		Sentinel:      sent,
		SentinelAddrs: []string{sent.Addr},
	}

	rc := redis.NewClient(replica.ClientOptions())
	defer rc.Close()
	sc := redis.NewSentinelClient(sent.ClientOptions())
	defer sc.Close()
	waitFor(t, sentinelTimeout, "replica in sync and known to the sentinel", func(ctx context.Context) error {
		info, err := rc.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if st := infoField(info, "master_link_status"); st != "up" {
			return fmt.Errorf("replica master_link_status is %q", st)
		}
		m, err := sc.Master(ctx, SentinelMasterName).Result()
		if err != nil {
			return err
		}
		if m["flags"] != "master" || m["port"] != strconv.Itoa(master.Port) {
			return fmt.Errorf("sentinel sees master as %v", m)
		}
		reps, err := sc.Replicas(ctx, SentinelMasterName).Result()
		if err != nil {
			return err
		}
		for _, r := range reps {
			if r["port"] == strconv.Itoa(replica.Port) && r["flags"] == "slave" && r["master-link-status"] == "ok" {
				return nil
			}
		}
		return fmt.Errorf("sentinel does not list the replica yet: %v", reps)
	})
	return s
}

// FailoverOptions returns a fresh go-redis failover option set for this
// setup.
func (s *Sentinel) FailoverOptions() *redis.FailoverOptions {
	return &redis.FailoverOptions{
		MasterName:    s.MasterName,
		SentinelAddrs: append([]string(nil), s.SentinelAddrs...),
	}
}

// FailoverClient returns a go-redis client that finds the master through the
// sentinel (redis.NewFailoverClient), closed at the end of the test.
func (s *Sentinel) FailoverClient(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewFailoverClient(s.FailoverOptions())
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// MasterAddr returns the master address the sentinel currently reports.
func (s *Sentinel) MasterAddr(t testing.TB) string {
	t.Helper()
	addr, err := s.masterAddr(context.Background())
	if err != nil {
		t.Fatalf("redistest: SENTINEL GET-MASTER-ADDR-BY-NAME: %v", err)
	}
	return addr
}

func (s *Sentinel) masterAddr(ctx context.Context) (string, error) {
	sc := redis.NewSentinelClient(s.Sentinel.ClientOptions())
	defer sc.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	r, err := sc.GetMasterAddrByName(ctx, s.MasterName).Result()
	if err != nil {
		return "", err
	}
	if len(r) != 2 {
		return "", fmt.Errorf("unexpected reply %q", r)
	}
	return net.JoinHostPort(r[0], r[1]), nil
}

// WaitMasterAddr waits (up to 30 s) until the sentinel reports addr as the
// master, e.g. s.Replica.Addr after killing s.Master, and fails the test
// otherwise.
func (s *Sentinel) WaitMasterAddr(t testing.TB, addr string) {
	t.Helper()
	waitFor(t, sentinelTimeout, "sentinel to report master "+addr, func(ctx context.Context) error {
		got, err := s.masterAddr(ctx)
		if err != nil {
			return err
		}
		if got != addr {
			return fmt.Errorf("master is %s", got)
		}
		return nil
	})
}

// waitFor polls cond until it returns nil, failing the test with the last
// error after timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func(ctx context.Context) error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := cond(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: waiting for %s: %v after %v", what, err, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
