package redistest

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterTimeout bounds StartCluster's and WaitOK's wait for a healthy cluster.
const clusterTimeout = 30 * time.Second

// Cluster is a Redis Cluster of masters and replicas on loopback. Every node
// listens on Port and has its cluster bus on Port+10000.
type Cluster struct {
	// Masters are the nodes that were masters when the cluster came up,
	// ordered by the first hash slot they own (Masters[0] owns slot 0).
	Masters []*Server
	// Replicas are the replica nodes, ordered like the masters they
	// replicated when the cluster came up.
	Replicas []*Server
	// Addrs are the addresses of all nodes, masters first.
	Addrs []string
}

// Nodes returns all nodes, masters first.
func (c *Cluster) Nodes() []*Server {
	return append(append([]*Server(nil), c.Masters...), c.Replicas...)
}

// StartCluster starts masters*(1+replicasPerMaster) cluster-enabled nodes,
// creates the cluster with `redis-cli --cluster create ... --cluster-yes`
// (slots split evenly between the masters) and waits until it is healthy
// (see WaitOK). masters must be at least 3, as redis-cli requires. All nodes
// are killed at the end of the test.
func StartCluster(t testing.TB, masters, replicasPerMaster int) *Cluster {
	t.Helper()
	if masters < 3 || replicasPerMaster < 0 {
		t.Fatalf("redistest: StartCluster(%d, %d): a cluster needs at least 3 masters and >= 0 replicas per master", masters, replicasPerMaster)
	}
	n := masters * (1 + replicasPerMaster)
	nodes := make([]*Server, n)
	addrs := make([]string, n)
	for i := range nodes {
		s := newServer(t)
		s.bus = true
		s.config = append(s.config,
			"cluster-enabled yes",
			"cluster-config-file "+quote(filepath.Join(s.Dir, "nodes.conf")),
			"cluster-node-timeout 2000",
			// CLUSTER SLOTS omits replicas whose replication offset is
			// still 0; a master's pings to its replicas advance it, every
			// second instead of every 10 s.
			"repl-ping-replica-period 1",
		)
		s.start(t)
		nodes[i] = s
		addrs[i] = s.Addr
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasPerMaster), "--cluster-yes")
	if out, err := runCLI(args...); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	c := &Cluster{}
	all := &Cluster{Masters: nodes}
	all.WaitOK(t)

	// redis-cli chooses which nodes become masters and pairs the replicas;
	// read the result back.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	probe := redis.NewClient(nodes[0].ClientOptions())
	defer probe.Close()
	//lint:ignore SA1019 go-redis itself reads the topology from CLUSTER SLOTS (Redis 7.0 has both)
	slots, err := probe.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatalf("redistest: CLUSTER SLOTS: %v", err)
	}
	byAddr := map[string]*Server{}
	for _, s := range nodes {
		byAddr[s.Addr] = s
	}
	firstSlot := map[*Server]int{}
	masterOf := map[*Server]*Server{}
	for _, r := range slots {
		if len(r.Nodes) == 0 {
			continue
		}
		m := byAddr[r.Nodes[0].Addr]
		if m == nil {
			t.Fatalf("redistest: CLUSTER SLOTS names unknown node %s", r.Nodes[0].Addr)
		}
		if first, ok := firstSlot[m]; !ok || r.Start < first {
			firstSlot[m] = r.Start
		}
		for _, rn := range r.Nodes[1:] {
			if rs := byAddr[rn.Addr]; rs != nil {
				masterOf[rs] = m
			}
		}
	}
	for _, s := range nodes {
		if _, ok := firstSlot[s]; ok {
			c.Masters = append(c.Masters, s)
		} else {
			c.Replicas = append(c.Replicas, s)
		}
	}
	if len(c.Masters) != masters || len(c.Replicas) != n-masters {
		t.Fatalf("redistest: cluster came up with %d masters and %d replicas, want %d and %d", len(c.Masters), len(c.Replicas), masters, n-masters)
	}
	sort.Slice(c.Masters, func(i, j int) bool { return firstSlot[c.Masters[i]] < firstSlot[c.Masters[j]] })
	sort.SliceStable(c.Replicas, func(i, j int) bool {
		return firstSlot[masterOf[c.Replicas[i]]] < firstSlot[masterOf[c.Replicas[j]]]
	})
	for _, s := range c.Nodes() {
		c.Addrs = append(c.Addrs, s.Addr)
	}
	return c
}

// ClusterOptions returns a fresh go-redis cluster option set seeded with all
// node addresses.
func (c *Cluster) ClusterOptions() *redis.ClusterOptions {
	return &redis.ClusterOptions{Addrs: append([]string(nil), c.Addrs...)}
}

// Client returns a go-redis cluster client built from ClusterOptions, closed
// at the end of the test.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(c.ClusterOptions())
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// WaitOK waits (up to 30 s) until the running nodes form a healthy cluster
// and fails the test otherwise. Healthy means: every running node reports
// cluster_state:ok with all 16384 slots assigned and knows every node; it
// sees every other running node connected and without fail, fail?,
// handshake or noaddr flags; and every running replica's link to its master
// is up. Call it after restarting nodes or resuming paused ones.
func (c *Cluster) WaitOK(t testing.TB) {
	t.Helper()
	nodes := c.Nodes()
	byPort := map[int]*Server{}
	clients := map[*Server]*redis.Client{}
	for _, s := range nodes {
		byPort[s.Port] = s
		opt := s.ClientOptions()
		opt.Protocol = 2
		opt.DisableIdentity = true
		opt.MaxRetries = -1
		opt.DialTimeout = 500 * time.Millisecond
		opt.ReadTimeout = time.Second
		clients[s] = redis.NewClient(opt)
	}
	defer func() {
		for _, cl := range clients {
			_ = cl.Close()
		}
	}()
	waitFor(t, clusterTimeout, "a healthy cluster", func(ctx context.Context) error {
		for _, s := range nodes {
			if !s.Running() {
				continue
			}
			cl := clients[s]
			info, err := cl.ClusterInfo(ctx).Result()
			if err != nil {
				return fmt.Errorf("%s: CLUSTER INFO: %v", s.Addr, err)
			}
			for field, want := range map[string]string{
				"cluster_state":          "ok",
				"cluster_slots_assigned": "16384",
				"cluster_known_nodes":    strconv.Itoa(len(nodes)),
			} {
				if got := infoField(info, field); got != want {
					return fmt.Errorf("%s: %s is %q, want %q", s.Addr, field, got, want)
				}
			}
			view, err := cl.ClusterNodes(ctx).Result()
			if err != nil {
				return fmt.Errorf("%s: CLUSTER NODES: %v", s.Addr, err)
			}
			var replicas []string
			for _, line := range strings.Split(strings.TrimSpace(view), "\n") {
				f := strings.Fields(line)
				if len(f) < 8 {
					return fmt.Errorf("%s: short CLUSTER NODES line %q", s.Addr, line)
				}
				peer := byPort[nodePort(f[1])]
				if peer == nil || !peer.Running() {
					continue
				}
				for _, flag := range strings.Split(f[2], ",") {
					switch flag {
					case "fail", "fail?", "handshake", "noaddr":
						return fmt.Errorf("%s sees %s as %s", s.Addr, peer.Addr, f[2])
					}
				}
				if f[7] != "connected" && !strings.Contains(f[2], "myself") {
					return fmt.Errorf("%s: link to %s is %s", s.Addr, peer.Addr, f[7])
				}
				if strings.Contains(f[2], "slave") {
					replicas = append(replicas, peer.Addr)
				}
			}
			// Clients learn the topology from CLUSTER SLOTS.
			//lint:ignore SA1019 go-redis itself reads the topology from CLUSTER SLOTS (Redis 7.0 has both)
			slots, err := cl.ClusterSlots(ctx).Result()
			if err != nil {
				return fmt.Errorf("%s: CLUSTER SLOTS: %v", s.Addr, err)
			}
			listed := map[string]bool{}
			for _, r := range slots {
				for _, n := range r.Nodes {
					listed[n.Addr] = true
				}
			}
			for _, r := range replicas {
				if !listed[r] {
					return fmt.Errorf("%s: CLUSTER SLOTS does not list replica %s yet", s.Addr, r)
				}
			}
			repl, err := cl.Info(ctx, "replication").Result()
			if err != nil {
				return fmt.Errorf("%s: INFO replication: %v", s.Addr, err)
			}
			if infoField(repl, "role") == "slave" && infoField(repl, "master_link_status") != "up" {
				return fmt.Errorf("%s: replica link to master is %s", s.Addr, infoField(repl, "master_link_status"))
			}
		}
		return nil
	})
}

// nodePort extracts the client port from a CLUSTER NODES address field,
// "ip:port@cport[,hostname]".
func nodePort(field string) int {
	field, _, _ = strings.Cut(field, "@")
	i := strings.LastIndexByte(field, ':')
	p, _ := strconv.Atoi(field[i+1:])
	return p
}
