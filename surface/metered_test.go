package surface

import (
	"testing"

	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/internal/usage"
	"github.com/tollgate/caddy-tollgate/limiter"
)

func TestParseCostValue(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int64
	}{
		{"30", 30},
		{" 7 ", 7},
		{"0", 0},
		{"9007199254740991", limiter.MaxCount},
		{"9007199254740992", limiter.MaxCount},
		{"99999999999999999999999", limiter.MaxCount}, // beyond an int64: clamped
		{"-1", limiter.NotMetered},
		{"-99999999999999999999999", limiter.NotMetered},
		{"1.5", limiter.NotMetered},
		{"1e3", limiter.NotMetered},
		{"abc", limiter.NotMetered},
		{"", limiter.NotMetered},
	} {
		if got, _ := parseCostValue(tt.in); got != tt.want {
			t.Errorf("parseCostValue(%q) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

func TestBodyFormat(t *testing.T) {
	for _, tt := range []struct {
		ct   string
		want usage.Format
	}{
		{"application/json", usage.JSON},
		{"application/json; charset=utf-8", usage.JSON},
		{"Application/JSON", usage.JSON},
		{"application/problem+json", usage.JSON},
		{"application/vnd.api+json; charset=utf-8", usage.JSON},
		{"text/event-stream", usage.SSE},
		{"text/event-stream; charset=utf-8", usage.SSE},
		{"text/plain", 0},
		{"application/x-ndjson", 0},
		{"", 0},
		{"json", 0},
	} {
		if got := bodyFormat(tt.ct); got != tt.want {
			t.Errorf("bodyFormat(%q) = %d, want %d", tt.ct, got, tt.want)
		}
	}
}

// TestMetersShared: policies that read the same cost share one meter, and
// a response is then read by one extractor for all of them.
func TestMetersShared(t *testing.T) {
	compile := func(ca *config.CostAfterConfig) *config.Meter {
		m, err := (&config.PolicyConfig{CostAfter: ca}).Meter("p", limiter.TokenBucket)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	var policies []*policyRuntime
	for _, ca := range []*config.CostAfterConfig{
		{JSON: "usage.total_tokens"},
		{JSON: "usage.total_tokens"},
		{JSON: "usage.input_tokens+usage.output_tokens"},
		{Header: "X-Tokens"},
		{Header: "x-tokens"},
	} {
		policies = append(policies, &policyRuntime{meter: sameMeter(policies, compile(ca))})
	}
	if policies[0].meter != policies[1].meter || policies[3].meter != policies[4].meter || policies[2].meter == policies[0].meter {
		t.Fatalf("meters not shared as they should be: %p %p %p %p %p", policies[0].meter, policies[1].meter, policies[2].meter, policies[3].meter, policies[4].meter)
	}
	var w meteredWriter
	w.reset(nil, []*config.Meter{policies[0].meter, nil, policies[1].meter, policies[2].meter, policies[3].meter})
	if len(w.ex) != 2 || w.exOf[0] != w.exOf[2] || w.exOf[3] == w.exOf[0] || w.exOf[1] != -1 || w.exOf[4] != -1 {
		t.Errorf("%d extractors, exOf %v: want 2, the first shared by verdicts 0 and 2", len(w.ex), w.exOf)
	}
}
