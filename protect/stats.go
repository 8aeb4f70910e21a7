package protect

import (
	"cmp"
	"slices"
	"time"
)

// Stats is a Limiter's state.
type Stats struct {
	Limit    int
	InFlight int
	Queued   int
	// Tenants is the number of tenants with queued requests.
	Tenants  int
	Baseline time.Duration
}

// Stats returns the limiter's state now.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Stats{Limit: int(l.limit), InFlight: l.inflight, Queued: l.queued, Tenants: len(l.ready), Baseline: l.baseline}
}

// TenantQueue is one tenant's waiting requests.
type TenantQueue struct {
	Tenant string
	Queued int
	Weight float64
}

// Queues returns up to n tenants with waiting requests, most waiting
// first.
func (l *Limiter) Queues(n int) []TenantQueue {
	l.mu.Lock()
	out := make([]TenantQueue, 0, len(l.ready))
	for _, q := range l.ready {
		out = append(out, TenantQueue{Tenant: q.name, Queued: q.n, Weight: q.weight})
	}
	l.mu.Unlock()
	slices.SortFunc(out, func(a, b TenantQueue) int {
		return cmp.Or(cmp.Compare(b.Queued, a.Queued), cmp.Compare(a.Tenant, b.Tenant))
	})
	return out[:min(n, len(out))]
}
