package limiter

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/caddy-tollgate/lua"
)

// A batcher sends the script calls of concurrent requests bound for one
// Redis node as one pipeline: one write, one read. While a batch is on the
// wire, the calls that arrive queue; as soon as a flusher is free, the
// whole queue goes out as the next batch. There is no timer: a lone call
// is sent at once and waits for nobody. Under load, one round trip
// carries many decisions, which is what makes strict (unleased) limits
// fast: the syscalls and wake-ups of a round trip, not Redis, are most of
// a decision's cost.
//
// Each call keeps its own deadline: its caller waits for its result or its
// own context, whichever comes first (a call abandoned in flight may still
// run, as a call that times out without batching may). A batch is sent
// with the latest deadline of its calls, so no call is cut short by
// another's. Calls whose context is done before their batch is formed are
// not sent.
//
// Calls go out as EVALSHA, or, when the store was asked for functions
// (RedisOptions.Functions), as FCALL of the function library
// (lua.Library): Redis then finds the scripts' helpers built instead of
// building them on every call. A node that does
// not know the library (first call, a restart, FUNCTION FLUSH) answers
// "Function not found": the library is loaded and the calls retried at
// once, in one more pipeline. A node without functions (Redis 6) or whose
// ACL refuses them is called with EVALSHA from then on; NOSCRIPT replies
// (a restarted Redis, SCRIPT FLUSH) are retried at once with EVAL. In a
// cluster, a call answered MOVED or ASK (the slot moved since the batcher
// was chosen) is retried alone through the cluster client, which follows
// the redirect, with EVALSHA.
type batcher struct {
	// pipe makes a pipeline to the node; redirect, when set (cluster), runs
	// a single call that may need to follow a redirect.
	pipe     func() redis.Pipeliner
	redirect redis.Scripter

	// noFunctions is set once the node turned FCALL or FUNCTION LOAD
	// down: scripts only, from then on.
	noFunctions atomic.Bool

	mu       sync.Mutex
	queue    []*batchCall
	flushers int
	max      int // flushers at most: batches in flight at once
}

// maxBatchFlushers is how many batches one node may have in flight at once.
// One keeps the node's commands in one ordered stream and maximizes batch
// size; two let the next batch be written while the previous reply is
// read. Measured on loopback (BenchmarkRedisBatching), two was faster.
const maxBatchFlushers = 2

// maxBatchSize caps one pipeline; the rest waits for the next batch.
const maxBatchSize = 256

// batchCall is one script call waiting for its batch.
type batchCall struct {
	ctx      context.Context
	deadline time.Time // the call's own deadline, zero for ctx's alone
	script   *luaScript
	keys     []string
	args     []any

	cmd     *redis.Cmd
	done    chan struct{}
	val     any
	err     error
	noscipt bool // the first attempt was answered NOSCRIPT

	// Kept when the call is pooled, so a call allocates neither its
	// deadline's timer nor its command's arguments: timer ends the wait
	// at deadline, cmdArgs holds the FCALL or EVALSHA command.
	timer   *time.Timer
	cmdArgs []any
}

var batchCalls = sync.Pool{New: func() any { return &batchCall{done: make(chan struct{}, 1)} }}

func newBatcher(pipe func() redis.Pipeliner, redirect redis.Scripter, functions bool) *batcher {
	b := &batcher{pipe: pipe, redirect: redirect, max: maxBatchFlushers}
	b.noFunctions.Store(!functions)
	return b
}

// do runs script as part of the next batch and returns its reply. The
// call ends at deadline (when not zero) or when ctx ends, whichever comes
// first: a deadline given here costs no context. noscript reports that
// Redis first answered NOSCRIPT or "Function not found" (the call was
// retried after loading the script or the library). abandoned reports that
// the call ended while it was in a batch: the batch may still send the
// arguments, so the caller must not reuse them.
func (b *batcher) do(ctx context.Context, deadline time.Time, script *luaScript, keys []string, args []any) (val any, noscript, abandoned bool, err error) {
	c := batchCalls.Get().(*batchCall)
	c.ctx, c.deadline, c.script, c.keys, c.args = ctx, deadline, script, keys, args
	var expired <-chan time.Time
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		// ctx ends first: its Done says so.
		c.deadline = d
	} else if !deadline.IsZero() {
		wait := time.Until(deadline)
		if c.timer == nil {
			c.timer = time.NewTimer(wait)
		} else {
			c.timer.Reset(wait)
		}
		expired = c.timer.C
	}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	start := b.flushers < b.max
	if start {
		b.flushers++
	}
	b.mu.Unlock()
	if start {
		go b.flush()
	}
	select {
	case <-c.done:
		val, noscript, err = c.val, c.noscipt, c.err
		if expired != nil {
			c.timer.Stop()
		}
		clear(c.cmdArgs)
		*c = batchCall{done: c.done, timer: c.timer, cmdArgs: c.cmdArgs[:0]}
		batchCalls.Put(c)
		return val, noscript, false, err
	case <-ctx.Done():
		// The batch still holds c (and the caller's arguments): it is
		// dropped, not pooled, once the batch is done with it.
		if expired != nil {
			c.timer.Stop()
		}
		return nil, false, true, ctx.Err()
	case <-expired:
		return nil, false, true, context.DeadlineExceeded
	}
}

// flush sends batches while calls are queued, then ends.
func (b *batcher) flush() {
	var batch []*batchCall
	for {
		b.mu.Lock()
		n := min(len(b.queue), maxBatchSize)
		if n == 0 {
			b.flushers--
			b.mu.Unlock()
			return
		}
		batch = append(batch[:0], b.queue[:n]...)
		rest := copy(b.queue, b.queue[n:])
		clear(b.queue[rest:])
		b.queue = b.queue[:rest]
		b.mu.Unlock()
		b.send(batch)
		clear(batch)
	}
}

// send runs one batch and hands every call its result.
func (b *batcher) send(batch []*batchCall) {
	live := batch[:0]
	var deadline time.Time
	now := time.Now()
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			b.finish(c, nil, err)
			continue
		}
		if !c.deadline.IsZero() && !now.Before(c.deadline) {
			b.finish(c, nil, context.DeadlineExceeded)
			continue
		}
		if c.deadline.After(deadline) {
			deadline = c.deadline
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	ctx := context.Background()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	fcall := !b.noFunctions.Load()
	mode := execEvalSha
	if fcall {
		mode = execFCall
	}
	b.exec(ctx, live, mode)
	var retry []*batchCall
	for _, c := range live {
		switch err := c.cmd.Err(); {
		case fcall && isFunctionMissing(err):
			c.noscipt = true
			retry = append(retry, c)
		case fcall && isFunctionRefused(err):
			b.noFunctions.Store(true)
			retry = append(retry, c)
		case isNoScript(err):
			c.noscipt = true
			retry = append(retry, c)
		}
	}
	switch {
	case len(retry) == 0:
	case fcall && !b.noFunctions.Load():
		// Load the library and call again, in one pipeline; a node that
		// refuses the library is called with scripts.
		if !b.exec(ctx, retry, execLoadFCall) || isFunctionMissing(retry[0].cmd.Err()) {
			// Refused, or loaded where the calls do not go (a client
			// that routes by key, seen as one node): scripts only.
			b.noFunctions.Store(true)
			b.exec(ctx, retry, execEval)
		}
	default:
		b.exec(ctx, retry, execEval)
	}
	for _, c := range live {
		val, err := c.cmd.Result()
		if b.redirect != nil && isRedirect(err) {
			val, err = c.script.EvalSha(c.ctx, b.redirect, c.keys, c.args...).Result()
			if isNoScript(err) {
				val, err = c.script.Eval(c.ctx, b.redirect, c.keys, c.args...).Result()
			}
		}
		b.finish(c, val, err)
	}
}

// How exec sends its calls.
const (
	execFCall     = iota // FCALL of the library function
	execLoadFCall        // FUNCTION LOAD REPLACE of the library, then FCALL
	execEvalSha
	execEval
)

// exec sends calls as one pipeline, as mode says. It reports false when
// the library was to be loaded and the node refused it (the calls then
// hold that pipeline's replies, not to be used).
func (b *batcher) exec(ctx context.Context, calls []*batchCall, mode int) bool {
	p := b.pipe()
	var load *redis.StringCmd
	if mode == execLoadFCall {
		load = p.FunctionLoadReplace(ctx, lua.Library)
	}
	for _, c := range calls {
		switch mode {
		case execFCall, execLoadFCall:
			c.cmd = c.command(ctx, p, argFCall, c.script.fnArg)
		case execEval:
			c.cmd = c.script.Eval(ctx, p, c.keys, c.args...)
		default:
			c.cmd = c.command(ctx, p, argEvalSha, c.script.shaArg)
		}
	}
	// Errors are per command (a failed connection fails them all).
	_, _ = p.Exec(ctx)
	if load != nil {
		if err := load.Err(); err != nil && !isConnError(err) {
			return false
		}
	}
	return true
}

// The command names, boxed once.
var (
	argFCall   any = "fcall"
	argEvalSha any = "evalsha"
)

// command queues c on p as name (FCALL or EVALSHA) of fn (the function or
// the script's digest), with arguments built in c.cmdArgs rather than by
// go-redis's helpers, which box every key and the name on each call: keys
// go as pointers into the caller's key slice, which outlives the call
// (see do).
func (c *batchCall) command(ctx context.Context, p redis.Pipeliner, name, fn any) *redis.Cmd {
	a := append(c.cmdArgs[:0], name, fn, len(c.keys))
	for i := range c.keys {
		a = append(a, &c.keys[i])
	}
	a = append(a, c.args...)
	c.cmdArgs = a
	cmd := redis.NewCmd(ctx, a...)
	_ = p.Process(ctx, cmd)
	return cmd
}

// isFunctionMissing reports a node that does not hold the library.
func isFunctionMissing(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Function not found")
}

// isFunctionRefused reports a node that cannot or may not run functions:
// a Redis before 7, or an ACL without FCALL.
func isFunctionRefused(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "NOPERM") || strings.Contains(err.Error(), "unknown command"))
}

// isConnError reports an error of the connection rather than a reply.
func isConnError(err error) bool {
	var rerr redis.Error
	return !errors.As(err, &rerr)
}

// finish hands c its result.
func (b *batcher) finish(c *batchCall, val any, err error) {
	c.val, c.err = val, err
	c.done <- struct{}{}
}

// isRedirect reports a cluster redirect (the slot lives elsewhere now).
func isRedirect(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK"))
}
