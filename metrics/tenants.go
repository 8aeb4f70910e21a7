package metrics

import (
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/caddy-tollgate/internal/topk"
)

const (
	// otherTenant labels the requests of every tenant outside the top n.
	otherTenant = "_other"

	// maxTenantLabel bounds tenant label values, in bytes.
	maxTenantLabel = 64
)

// tenantLabel makes a tenant a label value: valid UTF-8, at most
// maxTenantLabel bytes, cut at a character boundary.
func tenantLabel(s string) string {
	if len(s) <= maxTenantLabel && utf8.ValidString(s) {
		return s
	}
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= maxTenantLabel {
		return s
	}
	i := maxTenantLabel
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i]
}

// tenantTrackers holds one tracker per (n, policy names): the handlers of
// one config generation and the next share it, so tenant series continue
// across reloads, and series are deleted when the last user goes.
var tenantTrackers = caddy.NewUsagePool()

// tenantTracker gives per-tenant series to the n busiest tenants of its
// policies and counts every other tenant as _other. A tenant that drops
// out of the top n loses its series.
type tenantTracker struct {
	policies []string
	top      *topk.TopK[tenantSeries]
	// other holds the _other children per policy, resolved on first use;
	// guarded by top's lock.
	other [][numTenantSeries]prometheus.Counter
}

// tenantNear is the index, beside the decisions, of a tenant's series in
// caddy_rate_limit_tenant_near_limit_total.
const (
	tenantNear      = numDecisions
	numTenantSeries = numDecisions + 1
)

// tenantSeries are a member tenant's children, per policy and decision
// (and tenantNear), resolved on first use; guarded by the top-k's lock.
type tenantSeries struct {
	counters [][numTenantSeries]prometheus.Counter
}

func loadTenantTracker(n int, policies []string) (*tenantTracker, string, error) {
	key := "tenants/n=" + strconv.Itoa(n) + "/policies=" + strings.Join(policies, ",")
	v, _, err := tenantTrackers.LoadOrNew(key, func() (caddy.Destructor, error) {
		return newTenantTracker(n, policies), nil
	})
	if err != nil {
		return nil, "", err
	}
	return v.(*tenantTracker), key, nil
}

func newTenantTracker(n int, policies []string) *tenantTracker {
	t := &tenantTracker{
		policies: append([]string(nil), policies...),
		other:    make([][numTenantSeries]prometheus.Counter, len(policies)),
	}
	t.top = topk.New(n, 4*n+128, t.release)
	return t
}

// counter returns the child a decision of tenant in policy (by index) is
// counted in, and counts the tenant's traffic towards the top n.
func (t *tenantTracker) counter(policy int, tenant string, d decisionLabel) prometheus.Counter {
	c, _ := t.counters(policy, tenant, d, false)
	return c
}

// counters is counter, and with near also the tenant's near-limit child
// (nil without near).
func (t *tenantTracker) counters(policy int, tenant string, d decisionLabel, near bool) (c, nc prometheus.Counter) {
	t.top.Observe(tenantLabel(tenant), func(key string, s *tenantSeries) {
		var cells *[numTenantSeries]prometheus.Counter
		if s == nil {
			cells, key = &t.other[policy], otherTenant
		} else {
			if s.counters == nil {
				s.counters = make([][numTenantSeries]prometheus.Counter, len(t.policies))
			}
			cells = &s.counters[policy]
		}
		if cells[d] == nil {
			cells[d] = acquireTenantCounter(t.policies[policy], key, d)
		}
		c = cells[d]
		if near {
			if cells[tenantNear] == nil {
				cells[tenantNear] = acquireTenantCounter(t.policies[policy], key, tenantNear)
			}
			nc = cells[tenantNear]
		}
	})
	return c, nc
}

// release deletes the series of a tenant that left the top n; it runs
// under the top-k's lock.
func (t *tenantTracker) release(tenant string, s *tenantSeries) {
	for p := range s.counters {
		for d := range s.counters[p] {
			if s.counters[p][d] != nil {
				releaseTenantCounter(t.policies[p], tenant, decisionLabel(d))
			}
		}
	}
	s.counters = nil
}

// Destruct implements caddy.Destructor: the last handler is gone, its
// tenant series go too.
func (t *tenantTracker) Destruct() error {
	t.top.Reset()
	t.top.WithLock(func() { t.releaseOther() })
	return nil
}

// releaseOther deletes the _other series; with the top-k's lock held.
func (t *tenantTracker) releaseOther() {
	for p := range t.other {
		for d := range t.other[p] {
			if t.other[p][d] != nil {
				releaseTenantCounter(t.policies[p], otherTenant, decisionLabel(d))
				t.other[p][d] = nil
			}
		}
	}
}

// tenantSeriesRefs counts the trackers using each tenant series: trackers
// whose policy names overlap share series, and one must not delete what
// another still counts in.
var tenantSeriesRefs = struct {
	sync.Mutex
	n map[tenantSeriesKey]int
}{n: make(map[tenantSeriesKey]int)}

type tenantSeriesKey struct {
	policy, tenant string
	decision       decisionLabel
}

func acquireTenantCounter(policy, tenant string, d decisionLabel) prometheus.Counter {
	tenantSeriesRefs.Lock()
	defer tenantSeriesRefs.Unlock()
	tenantSeriesRefs.n[tenantSeriesKey{policy, tenant, d}]++
	if d == tenantNear {
		return collectors.tenantNear.WithLabelValues(policy, tenant)
	}
	return collectors.tenantRequests.WithLabelValues(policy, tenant, decisionNames[d])
}

func releaseTenantCounter(policy, tenant string, d decisionLabel) {
	tenantSeriesRefs.Lock()
	defer tenantSeriesRefs.Unlock()
	k := tenantSeriesKey{policy, tenant, d}
	if tenantSeriesRefs.n[k]--; tenantSeriesRefs.n[k] > 0 {
		return
	}
	delete(tenantSeriesRefs.n, k)
	if d == tenantNear {
		collectors.tenantNear.DeleteLabelValues(policy, tenant)
		return
	}
	collectors.tenantRequests.DeleteLabelValues(policy, tenant, decisionNames[d])
}
