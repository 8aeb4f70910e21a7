package admin

import (
	"cmp"
	"net/http"
	"slices"
	"time"

	"github.com/tollgate/caddy-tollgate/fleet"
)

// Limits of GET /rate_limit/near_limit.
const (
	defaultNearLimitCount = 100
	maxNearLimitCount     = 1000
)

// nearLimitEntry is an entry of GET /rate_limit/near_limit.
type nearLimitEntry struct {
	Policy    string `json:"policy"`
	Tenant    string `json:"tenant"`
	Key       string `json:"key,omitempty"`
	Remaining int64  `json:"remaining"`
	Limit     int64  `json:"limit"`
	// NearLimit is the policy's threshold (near_limit).
	NearLimit float64 `json:"near_limit"`
	// At is when the tenant was last seen near its limit; ResetAt when
	// its bucket was to have more quota then (RFC 3339).
	At       string `json:"at"`
	ResetAt  string `json:"reset_at"`
	Instance string `json:"instance,omitempty"`
}

// nearLimit answers GET /rate_limit/near_limit?policy=P&count=N: the
// tenants seen near their limit most recently, newest first, with the
// quota they had left; fleet-wide for handlers on Redis.
func (adminAPI) nearLimit(w http.ResponseWriter, r *http.Request) error {
	if err := requireMethod(r, http.MethodGet); err != nil {
		return err
	}
	q := r.URL.Query()
	policy := q.Get("policy")
	count, err := countParam(r, defaultNearLimitCount, maxNearLimitCount)
	if err != nil {
		return err
	}
	hs, ps, err := selectPolicies(policy)
	if err != nil {
		return err
	}
	// The policies to list, with their thresholds, and the boards that
	// hold them (each once).
	thresholds := map[string]float64{}
	var all []fleet.NearLimitEntry
	var fleetErr error
	seen := map[any]bool{}
	for i, h := range hs {
		for _, p := range ps[i] {
			if _, ok := thresholds[p.Engine.Name]; !ok {
				thresholds[p.Engine.Name] = p.Near
			}
		}
		if len(ps[i]) == 0 || seen[h.Store.NearLimit()] {
			continue
		}
		seen[h.Store.NearLimit()] = true
		es, err := h.Store.NearLimitRecent(r.Context(), policy, maxNearLimitCount)
		if err != nil && fleetErr == nil {
			fleetErr = err
		}
		all = append(all, es...)
	}
	slices.SortStableFunc(all, func(a, b fleet.NearLimitEntry) int { return cmp.Compare(b.At, a.At) })
	out := []nearLimitEntry{}
	for _, e := range all {
		if len(out) == count {
			break
		}
		f, ok := thresholds[e.Policy]
		if !ok {
			continue // a policy of no live handler (an old config's)
		}
		out = append(out, nearLimitEntry{
			Policy: e.Policy, Tenant: e.Tenant, Key: e.Key, Remaining: e.Remaining, Limit: e.Limit, NearLimit: f,
			At:       time.Unix(0, e.At).UTC().Format(time.RFC3339Nano),
			ResetAt:  time.Unix(0, e.ResetAt).UTC().Format(time.RFC3339),
			Instance: e.Instance,
		})
	}
	res := map[string]any{"tenants": out}
	if policy != "" {
		res["policy"] = policy
	}
	if fleetErr != nil {
		// This instance's own entries are there; the other instances'
		// could not be read.
		res["fleet_error"] = fleetErr.Error()
	}
	return writeJSON(w, res)
}
