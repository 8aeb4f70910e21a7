package fleet

import (
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Observer receives what a Backend measures, for metrics. Calls are made
// on request paths and background goroutines: keep them cheap and safe for
// concurrent use.
type Observer interface {
	// RedisCall is one Redis script round trip: the script, how it ended
	// ("ok", "error", "timeout", "noscript") and how long it took.
	RedisCall(script, result string, d time.Duration)
	// RedisQueued is the time one call waited in this instance before
	// it was written to Redis, and whether it was shed (not sent) for
	// waiting longer than the store's queue limit.
	RedisQueued(wait time.Duration, shed bool)
	// DenialsDropped counts denials that did not reach the denial stream,
	// by reason (see DropReasons).
	DenialsDropped(reason string, n int)
}

// Hooks is how one user of a Backend (a handler) reports: its logger and
// its metrics observer (nil: it records no metrics).
type Hooks struct {
	Logger   *zap.Logger
	Observer Observer
	// OnBreaker hears the backend's circuit breaker open and close (the
	// fail_mode events of notify). It runs under the breaker's lock: it
	// must not block. Only the newest user that sets it hears it.
	OnBreaker func(open bool)
}

// Attachment is one user's Hooks on a Backend; Detach it when the user
// goes.
type Attachment struct {
	b     *Backend
	hooks Hooks
}

// Detach removes the attachment.
func (a *Attachment) Detach() { a.b.users.detach(a) }

// users are the attachments of a Backend. A backend outlives any one user
// (it is shared across sites and config reloads), so it must not keep the
// hooks of the user that happened to create it: it logs through the newest
// attachment's logger, and reports to the newest attachment that has an
// Observer, so metrics stay on while any user records them.
type users struct {
	mu   sync.Mutex
	list []*Attachment // in attach order
	// logger and observer are the newest ones, read without the lock.
	logger   atomic.Pointer[zap.Logger]
	observer atomic.Pointer[Observer]
}

func (u *users) attach(a *Attachment) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.list = append(u.list, a)
	u.refresh()
}

func (u *users) detach(a *Attachment) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for i, x := range u.list {
		if x == a {
			u.list = append(u.list[:i], u.list[i+1:]...)
			break
		}
	}
	u.refresh()
}

// refresh recomputes the newest logger and observer; with u.mu held.
func (u *users) refresh() {
	var obs *Observer
	for i := len(u.list) - 1; i >= 0; i-- {
		if o := u.list[i].hooks.Observer; o != nil {
			obs = &o
			break
		}
	}
	u.observer.Store(obs)
	for i := len(u.list) - 1; i >= 0; i-- {
		if l := u.list[i].hooks.Logger; l != nil {
			u.logger.Store(l)
			return
		}
	}
	// Nobody left: keep the last logger for the final flush's lines.
}

// onBreaker tells the newest user that listens that the breaker opened
// or closed.
func (u *users) onBreaker(open bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for i := len(u.list) - 1; i >= 0; i-- {
		if f := u.list[i].hooks.OnBreaker; f != nil {
			f(open)
			return
		}
	}
}

// observe returns the observer to report to, or nil.
func (u *users) observe() Observer {
	if o := u.observer.Load(); o != nil {
		return *o
	}
	return nil
}

// newLogger returns a logger that writes through the newest user's logger
// at the time of each entry (fallback until anyone attached).
func (u *users) newLogger(fallback *zap.Logger) *zap.Logger {
	u.logger.Store(fallback)
	return zap.New(&usersCore{users: u})
}

// usersCore is a zapcore.Core that forwards every entry to the core of the
// newest user's logger, under that logger's name.
type usersCore struct {
	users  *users
	fields []zapcore.Field
}

func (c *usersCore) current() *zap.Logger { return c.users.logger.Load() }

func (c *usersCore) Enabled(l zapcore.Level) bool { return c.current().Core().Enabled(l) }

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
	l := c.current()
	e.LoggerName = l.Name()
	core := l.Core()
	if len(c.fields) > 0 {
		core = core.With(c.fields)
	}
	return core.Write(e, fields)
}

func (c *usersCore) Sync() error { return c.current().Sync() }
