package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// FailureCause names why a Redis call failed, in the words an operator
// searches for: "connection refused" (nothing listens: Redis down or a
// wrong address), "timeout" (Redis slow, stalled or unreachable), and so on.
func FailureCause(err error) string {
	var redisErr redis.Error
	switch {
	case err == nil:
		return ""
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "connection reset"
	case limiter.IsTimeout(err):
		return "timeout"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed by Redis"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "host unreachable"
	case errors.As(err, &redisErr):
		// An error reply: NOAUTH, WRONGPASS, READONLY, OOM, CLUSTERDOWN...
		msg, _, _ := strings.Cut(redisErr.Error(), " ")
		return "Redis replied " + msg
	case strings.Contains(err.Error(), "no such host"):
		return "unknown host"
	}
	return "error"
}

// causeField is the structured field of FailureCause.
func causeField(err error) zap.Field { return zap.String("cause", FailureCause(err)) }

// dialErrors is a go-redis hook that remembers the client's last failed
// dial: a call that runs out of time while go-redis retries dialing
// returns "context deadline exceeded", when the cause an operator needs
// is the dial's "connection refused".
type dialErrors struct {
	last atomic.Pointer[dialError]
}

type dialError struct {
	err error
	at  time.Time
}

var _ redis.Hook = (*dialErrors)(nil)

// DialHook records failed dials.
func (d *dialErrors) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			d.last.Store(&dialError{err, time.Now()})
		}
		return c, err
	}
}

// ProcessHook passes commands through.
func (d *dialErrors) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

// ProcessPipelineHook passes pipelines through.
func (d *dialErrors) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// explain returns err, or for a timeout while dials failed within the
// last window, err with the dial's error: what the timeout was made of.
func (d *dialErrors) explain(err error, window time.Duration) error {
	if d == nil || !limiter.IsTimeout(err) {
		return err
	}
	if de := d.last.Load(); de != nil && time.Since(de.at) <= window {
		return fmt.Errorf("%w (dialing: %w)", err, de.err)
	}
	return err
}
