package tollgate

import (
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// backendUsers are the handlers attached to one shared Redis backend. A
// backend outlives any one handler (it is shared across sites and config
// reloads), so it must not keep the logger or the metrics choice of the
// handler that happened to create it: it logs through the newest attached
// handler's logger, and it records its redis_* metrics while at least one
// attached handler records metrics.
type backendUsers struct {
	mu    sync.Mutex
	users []*backendUser // in attach order
	// newest is the logger of the last user, read without the lock.
	newest atomic.Pointer[zap.Logger]
	// metrics counts the users that record metrics.
	metrics atomic.Int32
}

// backendUser is one handler's attachment.
type backendUser struct {
	logger  *zap.Logger
	metrics bool
}

// attach adds a user; detach it in the handler's Cleanup.
func (u *backendUsers) attach(logger *zap.Logger, metrics bool) *backendUser {
	bu := &backendUser{logger: logger, metrics: metrics}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.users = append(u.users, bu)
	u.newest.Store(logger)
	if metrics {
		u.metrics.Add(1)
	}
	return bu
}

// detach removes a user attached earlier.
func (u *backendUsers) detach(bu *backendUser) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for i, x := range u.users {
		if x != bu {
			continue
		}
		u.users = append(u.users[:i], u.users[i+1:]...)
		if bu.metrics {
			u.metrics.Add(-1)
		}
		if n := len(u.users); n > 0 {
			u.newest.Store(u.users[n-1].logger)
		}
		return
	}
}

// recordsMetrics reports whether any user records metrics.
func (u *backendUsers) recordsMetrics() bool { return u.metrics.Load() > 0 }

// logger returns a logger that writes through the newest user's logger at
// the time of each entry (fallback until anyone attached).
func (u *backendUsers) logger(fallback *zap.Logger) *zap.Logger {
	u.newest.CompareAndSwap(nil, fallback)
	return zap.New(&usersCore{users: u})
}

// usersCore is a zapcore.Core that forwards every entry to the core of the
// newest user's logger.
type usersCore struct {
	users  *backendUsers
	fields []zapcore.Field
}

func (c *usersCore) current() zapcore.Core { return c.users.newest.Load().Core() }

func (c *usersCore) Enabled(l zapcore.Level) bool { return c.current().Enabled(l) }

func (c *usersCore) With(fields []zapcore.Field) zapcore.Core {
	return &usersCore{users: c.users, fields: append(append([]zapcore.Field(nil), c.fields...), fields...)}
}

func (c *usersCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *usersCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	e.LoggerName = c.users.newest.Load().Name()
	core := c.current()
	if len(c.fields) > 0 {
		core = core.With(c.fields)
	}
	return core.Write(e, fields)
}

func (c *usersCore) Sync() error { return c.current().Sync() }
