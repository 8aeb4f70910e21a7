package llm

import (
	"math/bits"

	"github.com/tollgate/caddy-tollgate/internal/usage"
)

// Price is what one token costs, in a policy's units, by kind.
type Price struct {
	Input, Output, Cached int64
}

// Cost is the price of t: uncached input, cached input and output tokens
// at their weights, clamped to usage.MaxCost.
func (p Price) Cost(t Tokens) int64 {
	sum := uint64(0)
	for _, term := range [...][2]int64{{t.Input - t.Cached, p.Input}, {t.Cached, p.Cached}, {t.Output, p.Output}} {
		hi, lo := bits.Mul64(uint64(max(term[0], 0)), uint64(max(term[1], 0)))
		if hi != 0 || lo > usage.MaxCost {
			return usage.MaxCost
		}
		if sum += lo; sum > usage.MaxCost {
			return usage.MaxCost
		}
	}
	return int64(sum)
}

// Prices is a price table by model. A model gets the price of the entry
// of its exact name, else of the first glob that matches it ('*' any run
// of bytes, '/' included; '?' any one byte), else of the entry "*", the
// default.
type Prices struct {
	entries []PriceEntry
}

// PriceEntry is one line of a price table.
type PriceEntry struct {
	Model string // a name or a glob
	Price
}

// NewPrices returns the table of entries (in their order).
func NewPrices(entries []PriceEntry) *Prices {
	return &Prices{entries: entries}
}

// MaxModel is the longest model name a price table looks up: the APIs'
// names (fine-tuned ones included) are far shorter, and matching a
// client's megabyte-long name against every glob would cost the gateway
// milliseconds of CPU per request.
const MaxModel = 256

// Lookup returns the price of model; ok is false when no entry applies
// (or t is nil: no table), and for a model name longer than MaxModel.
func (t *Prices) Lookup(model string) (p Price, ok bool) {
	if t == nil || len(model) > MaxModel {
		return Price{}, false
	}
	for _, e := range t.entries {
		if e.Model == model {
			return e.Price, true
		}
	}
	var def *PriceEntry
	for i, e := range t.entries {
		if e.Model == "*" {
			def = &t.entries[i]
			continue
		}
		if glob(e.Model, model) {
			return e.Price, true
		}
	}
	if def != nil {
		return def.Price, true
	}
	return Price{}, false
}

// glob matches s against pattern: '*' any run of bytes, '?' one byte.
func glob(pattern, s string) bool {
	px, sx := 0, 0
	star, mark := -1, 0
	for sx < len(s) {
		switch {
		case px < len(pattern) && pattern[px] == '*': // first: a '*' in s too is no literal match
			star, mark = px, sx
			px++
		case px < len(pattern) && (pattern[px] == '?' || pattern[px] == s[sx]):
			px++
			sx++
		case star >= 0:
			px = star + 1
			mark++
			sx = mark
		default:
			return false
		}
	}
	for px < len(pattern) && pattern[px] == '*' {
		px++
	}
	return px == len(pattern)
}
