package config

import (
	"net/http"
	"strings"

	"github.com/tollgate/caddy-tollgate/internal/llm"
	"github.com/tollgate/caddy-tollgate/internal/usage"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// CostAfterConfig says where a metered policy reads a request's real cost
// from its response. Exactly one of preset, header and json is set.
type CostAfterConfig struct {
	// An LLM API shape: "openai" (OpenAI-compatible chat completions,
	// completions and the Responses API) or "anthropic" (Messages). The
	// cost is the answer's input plus output tokens, or their price (see
	// prices); the request body is read for its model, and a streamed
	// OpenAI-style chat or completions request is made to report its
	// usage (stream_options.include_usage), which is then removed from
	// what the client receives when it did not ask for it.
	Preset string `json:"preset,omitempty"`

	// The response header, or trailer, that carries the real cost: a
	// non-negative integer, e.g. `X-Tokens-Used`. A trailer wins over a
	// header of the same name.
	Header string `json:"header,omitempty"`

	// The JSON numbers of the response body whose sum is the real cost:
	// dot-separated paths of object keys from the top-level object,
	// joined with `+`, e.g. `usage.total_tokens` or
	// `usage.prompt_tokens+usage.completion_tokens`. Read from an
	// application/json (or +json) body, or from each `data:` event of a
	// text/event-stream body, the last value seen for each path counting.
	// Fractions are rounded up. A body compressed with gzip, br or zstd
	// is read through a decoder on the side (the client gets it as the
	// upstream compressed it); a body of another type or encoding is not
	// read, and its cost is missing (see cost_missing).
	JSON string `json:"json,omitempty"`
}

// costAfterForms is what the error messages offer.
const costAfterForms = "cost_after openai | cost_after anthropic | cost_after header <Name> | cost_after json <path>[+<path>...]"

// checkCostAfter checks the cost_after of a policy at path, whose
// algorithm is alg and up-front cost c, and compiles it.
func checkCostAfter(path []string, ca *CostAfterConfig, alg limiter.Algorithm, c Cost) (*Meter, error) {
	if ca == nil {
		return nil, nil
	}
	set := 0
	for _, s := range []string{ca.Preset, ca.Header, ca.JSON} {
		if s != "" {
			set++
		}
	}
	switch {
	case set == 0:
		return nil, at(path, "set preset, header or json (%s)", costAfterForms)
	case set > 1:
		return nil, at(path, "preset, header and json exclude each other (%s)", costAfterForms)
	case alg == limiter.Concurrency:
		return nil, at(path, "not with algorithm concurrency, which counts requests in flight, not units (allowed: %s)", meteredAlgorithms)
	}
	if n, ok := c.Constant(); ok && n == 0 {
		return nil, at(sub(path[:len(path)-1], "cost"), "0 with cost_after: a request must be charged at least 1 unit up front, or a tenant in debt is never refused")
	}
	if ca.Preset != "" {
		p, ok := llm.ParseProvider(ca.Preset)
		if !ok {
			return nil, at(sub(path, "preset"), "%q: unknown preset (allowed: openai, anthropic)", ca.Preset)
		}
		return &Meter{Preset: p, Paths: p.Paths()}, nil
	}
	if ca.Header != "" {
		if !validHeaderName(ca.Header) {
			return nil, at(sub(path, "header"), "%q: not a header name (letters, digits and !#$%%&'*+-.^_`|~)", ca.Header)
		}
		return &Meter{Header: http.CanonicalHeaderKey(ca.Header)}, nil
	}
	paths, err := usage.ParsePaths(ca.JSON)
	if err != nil {
		return nil, at(sub(path, "json"), "%q: %v", ca.JSON, err)
	}
	return &Meter{Paths: &paths}, nil
}

// meteredAlgorithms lists the algorithms cost_after works with.
const meteredAlgorithms = "token_bucket, gcra, sliding_window, fixed_window, sliding_log"

// validHeaderName reports whether s is an HTTP field name (RFC 9110 token).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// Meter is a compiled cost_after: Header is the canonical header name,
// or Paths the JSON paths; Missing is what a response without a cost is
// charged.
type Meter struct {
	Header string
	Paths  *usage.Paths
	// Preset is the LLM API of cost_after openai|anthropic (Paths are
	// its usage paths), 0 for the other forms.
	Preset llm.Provider
	// Prices turn a preset's tokens into units; nil: a token is a unit.
	Prices *llm.Prices
	// Missing is MissingUpFront, MissingEstimate or a number of units.
	Missing int64
}

// Meter.Missing values that are not a number of units.
const (
	MissingUpFront  = -1 // charge the up-front cost only
	MissingEstimate = -2 // charge an estimate
)

// Meter compiles the cost_after of the policy named name (validated with
// it: see Validate); nil when the policy is not metered.
func (pc *PolicyConfig) Meter(name string, alg limiter.Algorithm) (*Meter, error) {
	return pc.compileMeter([]string{"rate_limits", name}, alg)
}

// compileMeter checks and compiles cost_after and cost_missing of the
// policy at path.
func (pc *PolicyConfig) compileMeter(path []string, alg limiter.Algorithm) (*Meter, error) {
	m, err := checkCostAfter(sub(path, "cost_after"), pc.CostAfter, alg, pc.Cost)
	if err != nil {
		return nil, err
	}
	if err := compilePrices(path, pc.Prices, m); err != nil {
		return nil, err
	}
	if pc.CostMissing == "" {
		switch {
		case m != nil && m.Preset != 0:
			m.Missing = MissingEstimate // a token budget a client cannot dodge
		case m != nil:
			m.Missing = MissingUpFront
		}
		return m, nil
	}
	at2 := sub(path, "cost_missing")
	if m == nil {
		return nil, at(at2, "needs cost_after: only a metered policy can miss a cost")
	}
	if pc.CostMissing == "estimate" {
		m.Missing = MissingEstimate
		return m, nil
	}
	n, ok := pc.CostMissing.Constant()
	if !ok || n < 0 || n > limiter.MaxCount {
		return nil, at(at2, "%q: want estimate or an integer from 0 to %d", string(pc.CostMissing), int64(limiter.MaxCount))
	}
	m.Missing = n
	return m, nil
}

// parseCostAfter reads `cost_after header <Name>` or `cost_after json
// <path>[+<path>...]`.
func (p cfParser) costAfter() (*CostAfterConfig, error) {
	args, err := p.args(1, -1)
	if err != nil {
		return nil, err
	}
	if len(args) == 1 && args[0] != "openai" && args[0] != "anthropic" && args[0] != "header" && args[0] != "json" {
		return nil, p.dirErr("%q: unknown source (allowed: openai, anthropic, header, json); usage: %s", args[0], costAfterForms)
	}
	if len(args) == 1 && (args[0] == "header" || args[0] == "json") {
		return nil, p.dirErr("wrong number of arguments (1); usage: %s", costAfterForms)
	}
	switch {
	case args[0] == "header" && len(args) == 2:
		return &CostAfterConfig{Header: args[1]}, nil
	case (args[0] == "openai" || args[0] == "anthropic") && len(args) == 1:
		return &CostAfterConfig{Preset: args[0]}, nil
	case args[0] == "json":
		// "usage.a + usage.b" arrives as three arguments.
		return &CostAfterConfig{JSON: strings.Join(args[1:], " ")}, nil
	case args[0] == "header", args[0] == "openai", args[0] == "anthropic":
		return nil, p.dirErr("wrong number of arguments (%d); usage: %s", len(args), costAfterForms)
	}
	return nil, p.dirErr("%q: unknown source (allowed: openai, anthropic, header, json); usage: %s", args[0], costAfterForms)
}
