package gate

import (
	"context"
	"os"
	"time"

	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// Memory is the Store of a handler without a redis block: the
// process-wide embedded store of its settings (shared by every handler
// with them and across reloads), or a store over it (caddy-ratelimit's
// distributed mode, see Use).
type Memory struct {
	mem      *limiter.MemoryStore
	store    limiter.Store // what decides: mem, or a store over it
	key      string        // mem's name in embeddedStores
	history  *fleet.History
	notifier *fleet.Notifier
}

var _ Store = (*Memory)(nil)

// MemoryOptions configures OpenMemory.
type MemoryOptions struct {
	// Sweep and MaxMemory configure the embedded store (0: defaults).
	Sweep     time.Duration
	MaxMemory int64
	// History, when set, keeps the handler's usage history (in the
	// process's map).
	History *fleet.HistoryOptions
	// Notify, when set, sends the handler's webhooks (once per period
	// for this process).
	Notify *fleet.NotifyOptions
}

// OpenMemory returns the Store on the embedded store of o's settings,
// creating that store on first use.
func OpenMemory(o MemoryOptions) (*Memory, error) {
	sweep, maxMemory := o.Sweep, o.MaxMemory
	if sweep <= 0 {
		sweep = limiter.DefaultSweepInterval
	}
	s, key, err := loadEmbeddedStore(sweep, maxMemory)
	if err != nil {
		return nil, err
	}
	mem := s.(*limiter.MemoryStore)
	m := &Memory{mem: mem, store: mem, key: key}
	if o.History != nil {
		m.history = fleet.NewMemoryHistory(*o.History)
	}
	if o.Notify != nil {
		n := *o.Notify
		if n.Instance == "" {
			n.Instance, _ = os.Hostname()
		}
		n.Fired = embeddedFired // what the config before this one sent
		m.notifier = fleet.NewNotifier(n)
	}
	return m, nil
}

// MemoryStore is the embedded store underneath.
func (m *Memory) MemoryStore() *limiter.MemoryStore { return m.mem }

// Use makes s, a store over MemoryStore (a limiter.PeerStore), decide
// from now on. Call it before the first request.
func (m *Memory) Use(s limiter.Store) { m.store = s }

// Decide implements Store. The embedded store fails only on invalid
// input.
func (m *Memory) Decide(ctx context.Context, d *limiter.Decision, items []limiter.Item) error {
	return d.Decide(ctx, m.store, items)
}

// Settle implements Store.
func (m *Memory) Settle(ctx context.Context, d *limiter.Decision, real []int64) error {
	return d.Settle(ctx, limiter.Fallback{}, real)
}

// Cancel implements Store.
func (m *Memory) Cancel(ctx context.Context, d *limiter.Decision) error {
	return d.Cancel(ctx, limiter.Fallback{})
}

// Release implements Store.
func (m *Memory) Release(ctx context.Context, d *limiter.Decision) error {
	return d.Release(ctx, limiter.Fallback{})
}

// GiveBack implements Store.
func (m *Memory) GiveBack(ctx context.Context, d *limiter.Decision, back []bool) error {
	return d.GiveBack(ctx, limiter.Fallback{}, back)
}

// Peek implements Store.
func (m *Memory) Peek(ctx context.Context, checks []limiter.Check, results []limiter.Result) error {
	return m.store.Peek(ctx, checks, results)
}

// Reset implements Store.
func (m *Memory) Reset(ctx context.Context, tenant string, policies []string, _ string) error {
	return m.store.Reset(ctx, tenant, policies)
}

// Overrides implements Store: the process's table.
func (m *Memory) Overrides() Overrides { return memoryOverrideStore{} }

// NearLimit implements Store: the process's board.
func (m *Memory) NearLimit() *fleet.NearLimitBoard { return memoryNearLimit }

// NearLimitRecent implements Store.
func (m *Memory) NearLimitRecent(_ context.Context, policy string, n int) ([]fleet.NearLimitEntry, error) {
	return memoryNearLimit.Recent(policy, n), nil
}

// Denials implements Store: none without Redis.
func (m *Memory) Denials() *fleet.DenialStream { return nil }

// History implements Store.
func (m *Memory) History() *fleet.History { return m.history }

// Notifier implements Store.
func (m *Memory) Notifier() *fleet.Notifier { return m.notifier }

// Penalties implements Store: the process's table, which counts denials
// itself.
func (m *Memory) Penalties() limiter.Penalties { return memoryPenalties }

// PenaltyList implements Store.
func (m *Memory) PenaltyList(_ context.Context, tenant, policy string, n int) ([]limiter.PenaltyEntry, error) {
	return memoryPenalties.List(tenant, policy, time.Now().UnixNano(), n), nil
}

// PenaltyLift implements Store.
func (m *Memory) PenaltyLift(_ context.Context, tenant, policy, _ string) ([]limiter.PenaltyEntry, error) {
	return memoryPenalties.Lift(tenant, policy, time.Now().UnixNano()), nil
}

// Status implements Store.
func (m *Memory) Status() Status { return Status{Kind: "memory", Instances: 1} }

// Scope implements Store: handlers on one embedded store share it.
func (m *Memory) Scope() any { return m.mem }

// Close implements Store: the last handler closes the embedded store.
func (m *Memory) Close() error {
	if m.key == "" {
		return nil
	}
	if m.history != nil {
		m.history.Close()
	}
	if m.notifier != nil {
		m.notifier.Close()
	}
	_, err := embeddedStores.Delete(m.key)
	m.key = ""
	return err
}

// memoryOverrideStore is the process's runtime overrides as Overrides.
type memoryOverrideStore struct{}

func (memoryOverrideStore) Table() *fleet.OverrideTable { return memoryOverrides }

func (memoryOverrideStore) Store(_ context.Context, tenant, policy string, o *fleet.Override, _ string) (fleet.Override, bool, error) {
	old, had := memoryOverrides.Set(tenant, policy, o)
	return old, had, nil
}
