// Package llm knows the shapes of the LLM APIs metered by the cost_after
// presets: where OpenAI-compatible and Anthropic responses report their
// token usage, how a streamed OpenAI-style request is made to report it
// (stream_options.include_usage), how what that request caused is removed
// again from the stream the client receives, and how token counts become
// a price. It knows nothing of HTTP handlers or stores.
package llm

import (
	"strings"

	"github.com/tollgate/caddy-tollgate/internal/usage"
)

// Provider is an API shape.
type Provider uint8

// The providers of the cost_after presets.
const (
	OpenAI Provider = iota + 1
	Anthropic
)

// ParseProvider returns the provider named s ("openai", "anthropic").
func ParseProvider(s string) (Provider, bool) {
	switch s {
	case "openai":
		return OpenAI, true
	case "anthropic":
		return Anthropic, true
	}
	return 0, false
}

// String returns the preset's name.
func (p Provider) String() string {
	switch p {
	case OpenAI:
		return "openai"
	case Anthropic:
		return "anthropic"
	}
	return ""
}

// Paths of the usage numbers of each provider, in the order Tokens reads
// them. OpenAI: chat completions and completions (usage.prompt_tokens,
// usage.completion_tokens, cached in usage.prompt_tokens_details), the
// Responses API (usage.input_tokens...; streamed inside the
// response.completed event's response object). Anthropic Messages:
// usage.* (a JSON answer; message_delta events, cumulative) and
// message.usage.* (the message_start event); input_tokens there excludes
// the cache reads and writes, which are counted apart.
var (
	openAIPaths = mustPaths(
		"usage.prompt_tokens", "usage.completion_tokens", "usage.prompt_tokens_details.cached_tokens",
		"usage.input_tokens", "usage.output_tokens", "usage.input_tokens_details.cached_tokens",
		"response.usage.input_tokens", "response.usage.output_tokens")
	anthropicPaths = mustPaths(
		"usage.input_tokens", "usage.output_tokens", "usage.cache_read_input_tokens", "usage.cache_creation_input_tokens",
		"message.usage.input_tokens", "message.usage.output_tokens", "message.usage.cache_read_input_tokens", "message.usage.cache_creation_input_tokens")
)

func mustPaths(paths ...string) *usage.Paths {
	p, err := usage.ParsePaths(strings.Join(paths, "+"))
	if err != nil {
		panic(err)
	}
	return &p
}

// Paths returns the usage paths of p, for a usage.Extractor.
func (p Provider) Paths() *usage.Paths {
	if p == Anthropic {
		return anthropicPaths
	}
	return openAIPaths
}

// Tokens is the usage of one answer. Input includes Cached, as in
// OpenAI's prompt_tokens: the input tokens of which Cached were read from
// the provider's prompt cache (Anthropic's cache writes count as input).
type Tokens struct {
	Input, Output, Cached int64
}

// Total is the tokens of the answer: input and output.
func (t Tokens) Total() int64 { return min(t.Input+t.Output, usage.MaxCost) }

// Tokens reads the usage of an answer from e, an Extractor reset with
// p.Paths(); ok is false when it reported none.
func (p Provider) Tokens(e *usage.Extractor) (t Tokens, ok bool) {
	// pick returns the value of the first of paths that was seen.
	pick := func(paths ...int) int64 {
		for _, k := range paths {
			if n, seen := e.Value(k); seen {
				ok = true
				return n
			}
		}
		return 0
	}
	switch p {
	case OpenAI:
		t.Input = pick(0, 3, 6)
		t.Output = pick(1, 4, 7)
		t.Cached = pick(2, 5)
	case Anthropic:
		// message_start reports 1 output token, a placeholder: without
		// the final count (a JSON answer's usage or message_delta's),
		// the usage is missing, not 1.
		if _, final := e.Value(1); !final {
			return Tokens{}, false
		}
		in := pick(0, 4)
		t.Output = pick(1, 5)
		t.Cached = pick(2, 6)
		written := pick(3, 7)
		t.Input = min(in+t.Cached+written, usage.MaxCost)
	}
	t.Cached = min(t.Cached, t.Input)
	return t, ok
}
