package config

import (
	"strconv"

	"github.com/tollgate/caddy-tollgate/internal/llm"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// PriceConfig is one line of a metered policy's price table: what a token
// of a model costs in the policy's units (e.g. micro-dollars), so that a
// policy limits money across models. A request is charged
// (input - cached) x input + cached x cached + output x output.
type PriceConfig struct {
	// The model, as the request body's "model" names it: an exact name,
	// or a glob ('*' any run of characters, '?' one). An exact name wins,
	// then the first glob that matches; "*" is the default for every
	// other model. Without "*", a request for a model not in the table is
	// refused with 400.
	Model string `json:"model"`

	// Units per input (prompt) token.
	Input int64 `json:"input"`

	// Units per output (completion) token.
	Output int64 `json:"output"`

	// Units per cached input token (read from the provider's prompt
	// cache). Absent: the input price.
	Cached *int64 `json:"cached,omitempty"`
}

// priceForm is the syntax of a price line.
const priceForm = "price <model-glob> input <n> output <n> [cached <n>]"

// compilePrices checks the price table of the policy at path, metered by
// m, and compiles it into m.
func compilePrices(path []string, prices []PriceConfig, m *Meter) error {
	if len(prices) == 0 {
		return nil
	}
	if m == nil || m.Preset == 0 {
		return at(sub(path, "prices"), "needs cost_after openai or cost_after anthropic: prices turn a preset's token counts into units")
	}
	entries := make([]llm.PriceEntry, 0, len(prices))
	seen := map[string]bool{}
	for i, pc := range prices {
		where := sub(path, "prices["+strconv.Itoa(i)+"]")
		if pc.Model == "" {
			return at(sub(where, "model"), "empty: want a model name or glob (\"*\": every other model)")
		}
		if seen[pc.Model] {
			return at(sub(where, "model"), "%q: priced twice", pc.Model)
		}
		seen[pc.Model] = true
		cached := pc.Input
		if pc.Cached != nil {
			cached = *pc.Cached
		}
		for _, w := range []struct {
			field string
			v     int64
		}{{"input", pc.Input}, {"output", pc.Output}, {"cached", cached}} {
			if w.v < 0 || w.v > limiter.MaxCount {
				return at(sub(where, w.field), "%d is out of range (allowed: 0 to %d)", w.v, int64(limiter.MaxCount))
			}
		}
		entries = append(entries, llm.PriceEntry{Model: pc.Model, Price: llm.Price{Input: pc.Input, Output: pc.Output, Cached: cached}})
	}
	m.Prices = llm.NewPrices(entries)
	return nil
}

// price reads `price <model-glob> input <n> output <n> [cached <n>]`.
func (p cfParser) price() (PriceConfig, error) {
	args, err := p.args(5, 7)
	if err != nil {
		return PriceConfig{}, err
	}
	pc := PriceConfig{Model: args[0]}
	got := map[string]bool{}
	for i := 1; i+1 < len(args); i += 2 {
		n, err := p.parseInt(args[i+1], "a non-negative integer (units per token)")
		if err != nil {
			return PriceConfig{}, err
		}
		if got[args[i]] {
			return PriceConfig{}, p.dirErr("%s given twice; usage: %s", args[i], priceForm)
		}
		got[args[i]] = true
		switch args[i] {
		case "input":
			pc.Input = n
		case "output":
			pc.Output = n
		case "cached":
			pc.Cached = &n
		default:
			return PriceConfig{}, p.dirErr("%q: unknown price (allowed: input, output, cached); usage: %s", args[i], priceForm)
		}
	}
	if len(args)%2 == 0 || !got["input"] || !got["output"] {
		return PriceConfig{}, p.dirErr("want input and output prices; usage: %s", priceForm)
	}
	return pc, nil
}
