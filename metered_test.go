package tollgate

import (
	"testing"

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
