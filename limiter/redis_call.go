package limiter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// eval runs script with EVALSHA and, when Redis does not know it
// (NOSCRIPT, after a restart or SCRIPT FLUSH), at once again with EVAL,
// which also caches it for the next EVALSHA. With batching the call shares
// a pipeline with the concurrent calls to the same node, and its Timeout
// starts when that pipeline is written (see batcher); if ctx ends while
// the call is in flight, sc is marked so it is not reused (the batch may
// still send its arguments). Without batching the Timeout bounds the whole
// call.
func (s *RedisStore) eval(ctx context.Context, sc *redisScratch, rs *redisScript, keys []string, args []any) ([]int64, error) {
	var v []int64
	var err error
	var took time.Duration
	if b := s.batcherFor(ctx, keys); b != nil {
		var timing callTiming
		var noscript, abandoned bool
		v, timing, noscript, abandoned, err = b.do(ctx, s.timeout, rs.script, keys, args)
		sc.inFlight = abandoned
		took = timing.Redis
		if noscript && s.observe != nil {
			s.observe(rs.name, "noscript", 0)
		}
		if s.observeQueue != nil {
			s.observeQueue(timing.Queued, err == ErrQueueTimeout)
		}
		if err == ErrQueueTimeout {
			// Never sent: no round trip to report, nothing Redis did.
			return nil, fmt.Errorf("limiter: redis %s: %w", rs.name, err)
		}
	} else {
		start := time.Now()
		tctx, cancel := context.WithTimeout(ctx, s.timeout)
		v, err = s.callDirect(tctx, argEvalSha, rs.script.shaArg, keys, args)
		if isNoScript(err) {
			if s.observe != nil {
				s.observe(rs.name, "noscript", time.Since(start))
				start = time.Now()
			}
			v, err = s.callDirect(tctx, argEval, rs.script.srcArg, keys, args)
		}
		cancel()
		took = time.Since(start)
	}
	if s.observe != nil && !callerCancelled(ctx, err) {
		s.observe(rs.name, callResult(err), took)
	}
	if err != nil {
		if s.cluster != nil && ctx.Err() != context.Canceled {
			// A dead master is only left for its promoted replica once
			// the client reloads the slot map, which go-redis does by
			// itself only on MOVED or every ClusterStateReloadInterval
			// (60s): ask for a reload now (asynchronous, at most one at
			// a time, 200ms apart).
			s.cluster.ReloadState(ctx)
		}
		return nil, fmt.Errorf("limiter: redis %s: %w", rs.name, err)
	}
	return v, nil
}

// callDirect runs a script on its own round trip, as name (EVALSHA or
// EVAL) of fn (its digest or source), its reply read as a list of integers.
func (s *RedisStore) callDirect(ctx context.Context, name, fn any, keys []string, args []any) ([]int64, error) {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, name, fn, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	cmd := redis.NewIntSliceCmd(ctx, append(a, args...)...)
	_ = s.client.Process(ctx, noRetry{cmd})
	return cmd.Result()
}

// noRetry is a script call go-redis must not send again: a cluster client
// retries a command whose connection broke after the write, or whose
// reply timed out, whatever MaxRetries says, unless the command refuses
// (and Redis may have run the first copy: see fleet/connection.go).
type noRetry struct{ *redis.IntSliceCmd }

// NoRetry implements redis.Cmder.
func (noRetry) NoRetry() bool { return true }

// batcherFor returns the batcher of the node keys live on, nil when the
// store does not batch (or the node is not known).
func (s *RedisStore) batcherFor(ctx context.Context, keys []string) *batcher {
	if s.noBatch {
		return nil
	}
	if s.cluster == nil {
		return s.batch
	}
	if len(keys) == 0 {
		return nil
	}
	// The slot map is in memory once loaded; loading it (the first call,
	// a reload after a failover) is I/O, bounded by the timeout too.
	lctx, cancel := context.WithTimeout(ctx, s.timeout)
	node, err := s.cluster.MasterForKey(lctx, keys[0])
	cancel()
	if err != nil {
		return nil // the direct call reports the error
	}
	if b, ok := s.nodeBatchers.Load(node); ok {
		return b.(*batcher)
	}
	b, _ := s.nodeBatchers.LoadOrStore(node, newBatcher(node.Pipeline, s.cluster, s.functions, s.queueTimeout))
	return b.(*batcher)
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// callerCancelled reports a call that failed because its caller cancelled
// it (a client that went away): that says nothing of Redis, so Observe
// does not hear of it. A call that ran out of its caller's own deadline (a
// recorder flush, the give-backs of Close) is still reported, as a
// timeout: Redis may be what made it late.
func callerCancelled(ctx context.Context, err error) bool {
	return err != nil && errors.Is(ctx.Err(), context.Canceled)
}

// callResult classifies the outcome of a call for Observe.
func callResult(err error) string {
	switch {
	case err == nil:
		return "ok"
	case IsTimeout(err):
		return "timeout"
	}
	return "error"
}

// IsTimeout reports whether err is a call that ran out of time: the store
// may still have executed it.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
