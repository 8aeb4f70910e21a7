package limiter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tollgate/caddy-tollgate/lua"
)

// DefaultHeartbeatInterval is the default RegistryOptions.Interval.
const DefaultHeartbeatInterval = time.Second

// registryStaleBeats is how many heartbeat intervals a member may miss
// before it no longer counts as live.
const registryStaleBeats = 3

// RegistryOptions configures NewRegistry.
type RegistryOptions struct {
	// Client talks to Redis (standalone, Sentinel or cluster). The registry
	// does not close it.
	Client redis.UniversalClient
	// Prefix starts the key <prefix>:instances; "" means "rl".
	Prefix string
	// Interval is the time between two heartbeats; 0 means 1s. Every
	// instance of a fleet should use the same interval: a member counts as
	// live for 3 intervals of the instance that counts.
	Interval time.Duration
	// Timeout is the deadline of one heartbeat; 0 means Interval/2.
	Timeout time.Duration
	// ID names this instance in the set; "" means a fresh
	// <hostname>-<pid>-<random hex>.
	ID string
	// Functions runs the heartbeat as a function of lua.Library (FCALL),
	// loading the library where the node lacks it, as the store's calls
	// do (RedisOptions.Functions); a node without functions or whose ACL
	// refuses them gets the script (EVALSHA) from then on.
	Functions bool
}

// Registry keeps this instance registered as live in the sorted set
// <prefix>:instances and counts the live instances, for the fallback
// share of fail_mode local (limit x 0.7 / live instances) and lease sizing
// (LeaseStore).
//
// Every Interval a goroutine runs one script (lua.Heartbeat): ZADD of the
// instance's id with Redis TIME in ms as the score, ZREMRANGEBYSCORE of the
// members older than 3 intervals, PEXPIRE of the set (6 intervals) and
// ZCARD. An instance that dies without Close so drops out of the count
// after 3 intervals. In a cluster the key lives in one slot, on one master.
//
// Count is the last count a heartbeat returned: 1 before the first
// successful heartbeat, and kept as it is while heartbeats fail (Redis
// down), so the fallback share stays what it was before the outage.
type Registry struct {
	client   redis.UniversalClient
	key      string
	id       string
	interval time.Duration
	timeout  time.Duration
	stale    int64 // ms

	// functions: heartbeats are FCALLs, until noFunctions is set (the
	// node refused functions, or the library).
	functions   bool
	noFunctions atomic.Bool

	count atomic.Int64
	last  atomic.Int64 // Unix ns of the last successful heartbeat, 0 = none

	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

var (
	heartbeatScript   = redis.NewScript(lua.Heartbeat)
	heartbeatFunction = lua.Function("heartbeat")
)

// NewRegistry registers the instance and starts heartbeating at once, in a
// goroutine that Close stops.
func NewRegistry(opts RegistryOptions) *Registry {
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultHeartbeatInterval
	}
	if opts.Timeout <= 0 {
		opts.Timeout = opts.Interval / 2
	}
	if opts.ID == "" {
		opts.ID = NewInstanceID()
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Registry{
		client:    opts.Client,
		key:       opts.Prefix + ":instances",
		id:        opts.ID,
		interval:  opts.Interval,
		timeout:   opts.Timeout,
		stale:     max(1, int64(registryStaleBeats*opts.Interval/time.Millisecond)),
		functions: opts.Functions,
		cancel:    cancel,
		done:      make(chan struct{}),
	}
	r.count.Store(1)
	go r.run(ctx)
	return r
}

// NewInstanceID returns <hostname>-<pid>-<8 random hex digits>.
func NewInstanceID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// ID returns the instance's member name in the set.
func (r *Registry) ID() string { return r.id }

// Key returns the sorted set's key, <prefix>:instances.
func (r *Registry) Key() string { return r.key }

// Count returns the number of live instances seen by the last successful
// heartbeat, this one included; 1 before the first. Never less than 1.
func (r *Registry) Count() int { return int(r.count.Load()) }

// LastHeartbeat returns when the last successful heartbeat ended; the
// zero time before the first.
func (r *Registry) LastHeartbeat() time.Time {
	if ns := r.last.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

func (r *Registry) run(ctx context.Context) {
	defer close(r.done)
	r.beat(ctx)
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.beat(ctx)
		}
	}
}

// beat sends one heartbeat; a failure keeps the last count.
func (r *Registry) beat(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	n, err := r.call(ctx, 0).Int64()
	if err != nil {
		return
	}
	r.count.Store(max(1, n))
	r.last.Store(time.Now().UnixNano())
}

// call runs lua.Heartbeat once (remove: 1 to leave the set): as the
// library's function when the registry uses functions (fcall), else, or
// when that cannot be done, as a script.
func (r *Registry) call(ctx context.Context, remove int) *redis.Cmd {
	if r.functions && !r.noFunctions.Load() {
		if cmd := r.fcall(ctx, remove); cmd != nil {
			return cmd
		}
	}
	return heartbeatScript.Run(ctx, r.client, []string{r.key}, r.id, r.stale, remove)
}

// fcall runs the heartbeat function on the master of the registry's key
// (FUNCTION LOAD has no key: through a cluster client it would reach any
// master), loading the library once when the node answers "Function not
// found". It returns nil when the call must go as a script: for good once
// the node refused functions or the library, or still misses the library
// right after loading it; for this call only when the slot moved or the
// load failed otherwise (a failover's READONLY or LOADING).
func (r *Registry) fcall(ctx context.Context, remove int) *redis.Cmd {
	c := redis.Cmdable(r.client)
	if cc, ok := r.client.(*redis.ClusterClient); ok {
		m, err := cc.MasterForKey(ctx, r.key)
		if err != nil {
			return nil
		}
		c = m
	}
	keys := []string{r.key}
	cmd := c.FCall(ctx, heartbeatFunction, keys, r.id, r.stale, remove)
	if isFunctionMissing(cmd.Err()) {
		if err := c.FunctionLoadReplace(ctx, lua.Library).Err(); err != nil {
			if isFunctionRefused(err) {
				r.noFunctions.Store(true)
			}
			return nil
		}
		cmd = c.FCall(ctx, heartbeatFunction, keys, r.id, r.stale, remove)
	}
	switch err := cmd.Err(); {
	case isFunctionRefused(err), isFunctionMissing(err):
		r.noFunctions.Store(true)
		return nil
	case isRedirect(err):
		// The cluster client follows the move (and reloads its slots).
		return nil
	}
	return cmd
}

// Close stops the heartbeats and removes the instance from the set (with
// the heartbeat timeout), so the others count it out at their next
// heartbeat. It returns the error of that removal; the member then ages
// out after 3 intervals. Calling Close again does nothing.
func (r *Registry) Close() error {
	r.closeOnce.Do(func() {
		r.stop()
		ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
		defer cancel()
		r.closeErr = r.call(ctx, 1).Err()
		if r.closeErr != nil {
			r.closeErr = fmt.Errorf("limiter: removing instance %s from %s: %w", r.id, r.key, r.closeErr)
		}
	})
	return r.closeErr
}

// stop ends the heartbeat goroutine and waits for it.
func (r *Registry) stop() {
	r.cancel()
	<-r.done
}
