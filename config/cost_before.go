package config

import (
	"strings"

	"github.com/tollgate/caddy-tollgate/internal/usage"
)

// CostBeforeConfig takes a metered request's up-front cost from its JSON
// request body, so that a tenant cannot start many expensive answers on
// an almost empty bucket: e.g. the max_tokens it asks for. The settlement
// corrects it both ways once the answer reports its real cost.
type CostBeforeConfig struct {
	// Dot-separated paths of object keys of the request body whose
	// numbers are summed (like cost_after json), joined with `+`, e.g.
	// `max_tokens` or `max_tokens+n`. The term `prompt_estimate` adds the
	// request body's length / 4 (about a token per 4 bytes of prompt).
	// With cost_after openai|anthropic and prices, the paths count as
	// output tokens and prompt_estimate as input tokens, at the request's
	// model's prices. A request without any of the values costs `cost`.
	JSON string `json:"json,omitempty"`
}

// promptEstimate is the cost_before term for the body's length / 4.
const promptEstimate = "prompt_estimate"

// CostBefore is a compiled cost_before: Paths (nil when only
// prompt_estimate is given) and whether PromptEstimate is added.
type CostBefore struct {
	Paths          *usage.Paths
	PromptEstimate bool
}

// costBeforeForm is the syntax of cost_before.
const costBeforeForm = "cost_before json <path>[+<path>...] (a path may be prompt_estimate)"

// compileCostBefore checks the cost_before of the policy at path, metered
// by m.
func compileCostBefore(path []string, cb *CostBeforeConfig, m *Meter) (*CostBefore, error) {
	if cb == nil {
		return nil, nil
	}
	where := sub(path, "cost_before")
	if m == nil {
		return nil, at(where, "needs cost_after: the up-front cost of a request that is settled afterwards")
	}
	if strings.TrimSpace(cb.JSON) == "" {
		return nil, at(sub(where, "json"), "empty: want %s", costBeforeForm)
	}
	out := &CostBefore{}
	var rest []string
	for _, term := range strings.Split(cb.JSON, "+") {
		if strings.TrimSpace(term) == promptEstimate {
			if out.PromptEstimate {
				return nil, at(sub(where, "json"), "%q: prompt_estimate given twice", cb.JSON)
			}
			out.PromptEstimate = true
			continue
		}
		rest = append(rest, term)
	}
	if len(rest) > 0 {
		p, err := usage.ParsePaths(strings.Join(rest, "+"))
		if err != nil {
			return nil, at(sub(where, "json"), "%q: %v", cb.JSON, err)
		}
		out.Paths = &p
	}
	return out, nil
}

// costBefore reads `cost_before json <path>[+<path>...]`.
func (p cfParser) costBefore() (*CostBeforeConfig, error) {
	args, err := p.args(2, -1)
	if err != nil {
		return nil, err
	}
	if args[0] != "json" {
		return nil, p.dirErr("%q: unknown source (allowed: json); usage: %s", args[0], costBeforeForm)
	}
	return &CostBeforeConfig{JSON: strings.Join(args[1:], " ")}, nil
}

// CostBefore compiles the cost_before of the policy named name (validated
// with it); nil when it has none.
func (pc *PolicyConfig) CostBefore(name string, m *Meter) (*CostBefore, error) {
	return compileCostBefore([]string{"rate_limits", name}, pc.CostBeforeConfig, m)
}
