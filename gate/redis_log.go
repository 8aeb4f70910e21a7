package gate

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
)

func init() {
	// go-redis logs through the standard library to stderr by default;
	// route it through Caddy's logger (JSON, levels) instead.
	redis.SetLogger(redisLogger{})
}

// redisLogInterval is the least time between two go-redis lines of the
// same kind: during an outage it would log every failed dial.
const redisLogInterval = 10 * time.Second

// redisLogger writes go-redis's log lines as WARN entries of the logger
// "redis" (under Caddy's default logger, so it follows the logging
// config), at most one per format string every redisLogInterval.
type redisLogger struct{}

var redisLogLast sync.Map // format -> time.Time of its last line

// Printf implements go-redis's internal.Logging.
func (redisLogger) Printf(_ context.Context, format string, v ...any) {
	now := time.Now()
	if last, ok := redisLogLast.Load(format); ok && now.Sub(last.(time.Time)) < redisLogInterval {
		return
	}
	redisLogLast.Store(format, now)
	caddy.Log().Named("redis").Warn(strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: "))
}

// ClearRedisLogThrottle forgets when each kind of go-redis line was last
// logged, so the next one is (tests).
func ClearRedisLogThrottle() { redisLogLast.Clear() }
