package admin

import (
	"cmp"
	"net/http"
	"slices"
	"time"

	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// Limits of GET /rate_limit/penalties.
const (
	defaultPenaltyCount = 100
	maxPenaltyCount     = 1000
)

// penaltyEntry is a box in GET and DELETE /rate_limit/penalties.
type penaltyEntry struct {
	Policy string `json:"policy"`
	Tenant string `json:"tenant"`
	// Key is the partition key of the bucket, when the policy has one.
	Key string `json:"key,omitempty"`
	// Until is when the box ends (RFC 3339), LeftSeconds how long that
	// is from now.
	Until       string  `json:"until"`
	LeftSeconds float64 `json:"left_seconds"`
}

// penalties answers /rate_limit/penalties:
//
//   - GET ?tenant=&policy=&count=N: the live penalty boxes (every tenant
//     and policy unless given), the ones that end first first;
//     fleet-wide for handlers on Redis.
//   - DELETE ?tenant=T[&policy=P]: lifts T's boxes (of P only, when
//     given), for the whole fleet; each lift goes to the audit stream.
func (adminAPI) penalties(w http.ResponseWriter, r *http.Request) error {
	if err := requireMethod(r, http.MethodGet, http.MethodDelete); err != nil {
		return err
	}
	q := r.URL.Query()
	// Boxes hold long tenants as a digest (limiter.BoundedValue).
	tenant, policy := q.Get("tenant"), q.Get("policy")
	if tenant != "" {
		tenant = limiter.BoundedValue(tenant)
	}
	if r.Method == http.MethodDelete && tenant == "" {
		return apiError(http.StatusBadRequest, "tenant: required to lift penalties, e.g. ?tenant=acme (&policy=P for one policy)")
	}
	count, err := countParam(r, defaultPenaltyCount, maxPenaltyCount)
	if err != nil {
		return err
	}
	hs, ps, err := selectPolicies(policy)
	if err != nil {
		return err
	}
	// Each store once, and only stores of handlers with a penalty.
	now := time.Now()
	out := []penaltyEntry{}
	var fleetErr error
	done := map[any]bool{}
	for i, h := range hs {
		if !anyPenalty(ps[i]) || done[h.Store.Scope()] {
			continue
		}
		done[h.Store.Scope()] = true
		var es []limiter.PenaltyEntry
		if r.Method == http.MethodDelete {
			es, err = h.Store.PenaltyLift(r.Context(), tenant, policy, r.RemoteAddr)
			if err != nil {
				return apiError(http.StatusServiceUnavailable, "lifting penalties: %v (this instance's boxes are lifted; retry for the fleet)", err)
			}
		} else {
			es, err = h.Store.PenaltyList(r.Context(), tenant, policy, count)
			if err != nil && fleetErr == nil {
				fleetErr = err
			}
		}
		for _, e := range es {
			out = append(out, penaltyEntry{
				Policy: e.Policy, Tenant: e.Tenant, Key: e.Part,
				Until:       time.Unix(0, e.Until).UTC().Format(time.RFC3339Nano),
				LeftSeconds: max(0, time.Duration(e.Until-now.UnixNano()).Seconds()),
			})
		}
	}
	slices.SortStableFunc(out, func(a, b penaltyEntry) int { return cmp.Compare(a.LeftSeconds, b.LeftSeconds) })
	if r.Method == http.MethodDelete {
		return writeJSON(w, map[string]any{"tenant": tenant, "policy": policy, "lifted": out})
	}
	res := map[string]any{"penalties": out[:min(count, len(out))]}
	if fleetErr != nil {
		// This instance's boxes are there; the fleet's could not be read.
		res["fleet_error"] = fleetErr.Error()
	}
	return writeJSON(w, res)
}

// anyPenalty reports whether one of ps has a penalty box.
func anyPenalty(ps []*gate.Policy) bool {
	for _, p := range ps {
		if p.Engine.Penalty.On() {
			return true
		}
	}
	return false
}
