package tollgate

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// This file holds what makes a caddy-ratelimit zone a Tollgate policy:
// the internal name of a zone whose name is not a valid policy name, the
// display forms of a name for headers and metric labels, and how a denied
// request charges zones.
//
// caddy-ratelimit takes any string as a zone name ("api:v1", "per user",
// a 100-character name). Policy names become part of Redis keys and of the
// engine's bucket identity, where limiter.ValidName keeps them free of key
// separators and hash-tag braces; so a zone whose name is not a valid
// policy name is known to the engine (keys, the admin API) by an internal
// name, and to everything a user reads (placeholders, logs, events, metric
// labels, headers) by the name as configured.

// internalPrefix starts the internal name of a zone whose name is not a
// valid policy name.
const internalPrefix = "zone-"

// internalName is the engine's name of the zone or policy configured as
// name: the name itself when it is a valid policy name, else "zone-", up
// to 32 bytes of the name with every byte a policy name cannot hold
// replaced by '_', a '.', and 24 hex digits of SHA-256(name). Distinct
// odd names get distinct internal names (96 bits of digest); an internal
// name could only equal a configured valid name if that name were written
// out digest and all, and two handlers sharing a name share its buckets
// anyway (policies are named buckets), which warnSharedPolicies reports.
func internalName(name string) string {
	if limiter.ValidName(name) {
		return name
	}
	var b strings.Builder
	b.WriteString(internalPrefix)
	for i := 0; i < len(name) && i < 32; i++ {
		c := name[i]
		if limiter.ValidName(string(c)) {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	sum := sha256.Sum256([]byte(name))
	b.WriteByte('.')
	b.WriteString(hex.EncodeToString(sum[:12]))
	return b.String()
}

// metricLabel is a policy name as a Prometheus label value: valid UTF-8
// (the client library refuses anything else).
func metricLabel(name string) string {
	if utf8.ValidString(name) {
		return name
	}
	return strings.ToValidUTF8(name, "\uFFFD")
}

// headerName is a policy name as the inside of a structured-field string
// (RFC 9651), for RateLimit-Policy and RateLimit: printable ASCII, with
// '"' and '\' escaped; any other byte is percent-encoded, as is '%'. Valid
// policy names come out unchanged.
func headerName(name string) string {
	clean := true
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '%' {
			clean = false
			break
		}
	}
	if clean {
		return name
	}
	const hexDigits = "0123456789ABCDEF"
	b := make([]byte, 0, len(name)+8)
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e || c == '%':
			b = append(b, '%', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return string(b)
}

// zoneCharge is the scratch space of chargeZones, pooled: a flood of
// denials must not allocate per request.
type zoneCharge struct {
	order    []int
	items    []limiter.Item
	decision limiter.Decision
}

var zoneCharges = sync.Pool{New: func() any { return new(zoneCharge) }}

// chargeZones charges, after the all-or-nothing decision d denied the
// request, what caddy-ratelimit would have charged: it takes its zones
// from the most permissive (most events per unit of window) to the least,
// charging each one that admits the request until one denies it. Only
// policies without all_or_nothing take part (caddy-ratelimit's zones);
// shadow verdicts never charge a denied request, nor do concurrency slots
// (they would never be released), nor turns of a delay. The charge is a second store call at a
// later instant, so a concurrent request may have taken what this one
// would have: then, like a zone that denies, nothing more is charged.
func (h *Handler) chargeZones(ctx context.Context, st *requestState) {
	d := &st.decision
	zc := zoneCharges.Get().(*zoneCharge)
	defer func() {
		clear(zc.items)
		zc.order, zc.items = zc.order[:0], zc.items[:0]
		zc.decision.Reset()
		zoneCharges.Put(zc)
	}()
	for i := range st.items {
		if !st.policies[i].allOrNothing && d.Verdicts[i].Enforced() {
			zc.order = append(zc.order, i)
		}
	}
	slices.SortStableFunc(zc.order, func(a, b int) int {
		return cmp.Compare(permissiveness(&d.Verdicts[b]), permissiveness(&d.Verdicts[a]))
	})
	for _, i := range zc.order {
		if !d.Verdicts[i].Result.Allowed {
			break
		}
		if st.items[i].Policy.Algorithm != limiter.Concurrency {
			zc.items = append(zc.items, st.items[i])
		}
	}
	if len(zc.items) == 0 {
		return
	}
	cd := &zc.decision
	cd.Overrides = h.overrides
	// The request is denied: a zone that could only admit it later (a
	// delay) must not take a turn nobody will use.
	cd.NoDelay = true
	var err error
	if h.Redis == nil {
		err = cd.Decide(ctx, h.store, zc.items)
	} else {
		err = h.stack.Decide(ctx, cd, zc.items)
	}
	if err != nil && !errors.Is(err, limiter.ErrInvalidCheck) {
		h.storeFailed(err)
	}
}

// permissiveness orders zones as caddy-ratelimit does: events per unit of
// window, of the limit in force.
func permissiveness(v *limiter.Verdict) float64 {
	if v.Limit.Window <= 0 {
		return math.Inf(1)
	}
	return float64(v.Limit.Limit) / float64(v.Limit.Window)
}
