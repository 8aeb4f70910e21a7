package surface

import (
	"errors"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// policyRuntime is a provisioned policy: the engine's Policy plus what the
// Caddy layer needs to map a request onto it.
type policyRuntime struct {
	*gate.Policy
	matchers caddyhttp.MatcherSets
	// key is the placeholder template of the partition key, or of the
	// tenant when the handler sets no tenant template.
	key template
	// cost is the constant cost, or -1 when costTemplate must be resolved.
	cost         int64
	costTemplate template
	ipv4Prefix   int
	ipv6Prefix   int
	// Header values of the policy's own limit, rendered once.
	ownPolicyHeader string
	ownLimitHeader  string
	// index is the policy's index in the handler's policies (and its
	// metrics); compat holds its children of caddy-ratelimit's families.
	index int
	// calendarHeader caches the RateLimit-Policy value of a calendar
	// policy's own limit for the current period.
	calendarHeader calendarHeaderCache
	// meter reads the real cost from the response (cost_after); nil when
	// the policy is not metered. costBefore reads its up-front cost from
	// the request body; nil without cost_before.
	meter      *config.Meter
	costBefore *config.CostBefore
	// outcome says which response statuses keep the request's units
	// (count_status, refund_status); nil keeps them whatever the status.
	outcome *config.Outcome
	// notify is the policy's webhooks (its own notify block, else the
	// handler's); nil without one.
	notify *notifyRuntime
}

// requestState is the per-request scratch space, pooled so a decision
// allocates nothing of its own.
type requestState struct {
	items    []limiter.Item
	policies []*policyRuntime
	// gates are the policies' gate.Policy, for compat.ChargeZones.
	gates    []*gate.Policy
	decision limiter.Decision
	shadow   []string
	// near flags the verdicts that left their tenant near its limit
	// (markNearLimit).
	near []bool
	// wait is how long the admitted request waits for its turn (report).
	wait time.Duration
	// timer times the wait; kept with the state, so a request that waits
	// allocates none.
	timer *time.Timer
	// meters has the cost_after of each item's policy (nil when not
	// metered); metered is set when any is. real and the writer are the
	// settlement's scratch (see serveMetered).
	meters  []*config.Meter
	metered bool
	real    []int64
	writer  meteredWriter
	// model is the request body's model, bodyLen its length (-1:
	// unknown), strip: include_usage was set for the client (see
	// readLLMRequest).
	model   string
	bodyLen int64
	strip   bool
	// readBody: a policy needs the request body (a preset, cost_before);
	// body is what was read of it (nil when it was not, or is too large).
	readBody bool
	body     []byte
	// noBody: a preset's request had no body (GET /v1/models): it asks
	// for no tokens, and its answer reports none.
	noBody bool
	// llmHeld is the bytes of the body counted in llmBodies (see
	// maxLLMBodies), given back when the request ends.
	llmHeld int64
	// outcomes: a policy keeps or gives back units by response status
	// (count_status, refund_status); status records that status, back
	// which verdicts give their units back (see giveBack).
	outcomes bool
	status   statusWriter
	// upstream records the status protect gives its slot back with (the
	// outcome writer above may wrap it).
	upstream statusWriter
	back     []bool
}

var requestStates = sync.Pool{New: func() any { return new(requestState) }}

func getRequestState() *requestState {
	s := requestStates.Get().(*requestState)
	s.items = s.items[:0]
	s.policies = s.policies[:0]
	s.gates = s.gates[:0]
	s.shadow = s.shadow[:0]
	s.near = s.near[:0]
	s.meters = s.meters[:0]
	s.metered, s.outcomes = false, false
	s.wait = 0
	s.model, s.bodyLen, s.strip, s.readBody, s.body, s.noBody = "", -1, false, false, nil, false
	return s
}

// startTimer returns the state's timer, started to fire after d.
func (s *requestState) startTimer(d time.Duration) *time.Timer {
	if s.timer == nil {
		s.timer = time.NewTimer(d)
	} else {
		// A stopped or fired timer: since Go 1.23 Reset leaves no stale
		// value in its channel.
		s.timer.Reset(d)
	}
	return s.timer
}

func putRequestState(s *requestState) {
	// Drop references to request data before pooling.
	clear(s.items)
	clear(s.meters)
	s.body = nil
	if s.llmHeld != 0 {
		llmBodies.Add(-s.llmHeld)
		s.llmHeld = 0
	}
	s.decision.Reset()
	requestStates.Put(s)
}

// matches reports whether the policy covers r.
func (p *policyRuntime) matches(r *http.Request) (bool, error) {
	if len(p.matchers) == 0 {
		return true, nil
	}
	return p.matchers.AnyMatchWithError(r)
}

// requestCost resolves the cost of r in this policy. A placeholder that
// does not resolve to an integer, or resolves to a negative one, costs 1;
// so does one that resolves to 0 in a metered policy (cost_after).
// A number beyond limiter.MaxCount (even one too large for an int64) is
// returned as math.MaxInt64: such a request can never be admitted, and the
// engine denies it without any fail mode (a client cannot buy its way
// past a limit by overflowing a store).
func (p *policyRuntime) requestCost(repl *caddy.Replacer, r *http.Request) int64 {
	if p.cost >= 0 {
		return p.cost
	}
	n, err := strconv.ParseInt(strings.TrimSpace(p.costTemplate.expand(repl, r)), 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange) && n > 0, err == nil && n > limiter.MaxCount:
		return math.MaxInt64
	case err != nil || n < 0:
		return 1
	case n == 0 && p.meter != nil:
		// A metered request is charged at least 1 unit up front: at 0 it
		// would be a peek, admitted even by a bucket in debt.
		return 1
	}
	return n
}

// resolveKey expands the policy key and, when it is an IP address and a
// prefix is configured for its family, replaces it by its network.
func (p *policyRuntime) resolveKey(repl *caddy.Replacer, r *http.Request) string {
	v := p.key.expand(repl, r)
	if p.ipv4Prefix == 0 && p.ipv6Prefix == 0 {
		return v
	}
	return applyNetworkPrefix(v, p.ipv4Prefix, p.ipv6Prefix)
}

// applyNetworkPrefix masks an IP address to its network of bits length for
// its family (0: leave it). Non-IP values are returned unchanged.
func applyNetworkPrefix(v string, ipv4Prefix, ipv6Prefix int) string {
	addr, err := netip.ParseAddr(v)
	if err != nil {
		return v
	}
	addr = addr.Unmap().WithZone("")
	bits := ipv6Prefix
	if addr.Is4() {
		bits = ipv4Prefix
	}
	if bits == 0 {
		return v
	}
	prefix, err := addr.Prefix(bits)
	if err != nil {
		return v
	}
	return prefix.String()
}
