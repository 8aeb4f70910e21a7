package config

import (
	"testing"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// TestOutcomeGivesBack: count_status keeps units only for its statuses,
// refund_status gives them back only for its statuses; classes cover their
// hundred codes and nothing else.
func TestOutcomeGivesBack(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pc     PolicyConfig
		status int
		back   bool
	}{
		{"count 401: a 401 is kept", PolicyConfig{CountStatus: []string{"401"}}, 401, false},
		{"count 401: a 200 goes back", PolicyConfig{CountStatus: []string{"401"}}, 200, true},
		{"count 401: a 403 goes back", PolicyConfig{CountStatus: []string{"401"}}, 403, true},
		{"count 4xx: 499 is kept", PolicyConfig{CountStatus: []string{"4xx"}}, 499, false},
		{"count 4xx: 500 goes back", PolicyConfig{CountStatus: []string{"4xx"}}, 500, true},
		{"count 4XX spelled upper", PolicyConfig{CountStatus: []string{"4XX"}}, 404, false},
		{"refund 5xx: 503 goes back", PolicyConfig{RefundStatus: []string{"5xx"}}, 503, true},
		{"refund 5xx: 599 goes back", PolicyConfig{RefundStatus: []string{"5xx"}}, 599, true},
		{"refund 5xx: 499 is kept", PolicyConfig{RefundStatus: []string{"5xx"}}, 499, false},
		{"refund 5xx 429: 429 goes back", PolicyConfig{RefundStatus: []string{"5xx", "429"}}, 429, true},
		{"refund 5xx: 101 is kept", PolicyConfig{RefundStatus: []string{"5xx"}}, 101, false},
		{"refund 100: 100 goes back", PolicyConfig{RefundStatus: []string{"100"}}, 100, true},
		{"refund 5xx: an out-of-range status is kept", PolicyConfig{RefundStatus: []string{"5xx"}}, 600, false},
		{"count 599: an out-of-range status goes back", PolicyConfig{CountStatus: []string{"599"}}, 99, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := tc.pc.Outcome("p", limiter.SlidingWindow)
			if err != nil || o == nil {
				t.Fatal(o, err)
			}
			if got := o.GivesBack(tc.status); got != tc.back {
				t.Fatalf("GivesBack(%d) = %v, want %v", tc.status, got, tc.back)
			}
		})
	}
	if o, err := (&PolicyConfig{}).Outcome("p", limiter.SlidingWindow); o != nil || err != nil {
		t.Fatalf("a policy without outcomes: %v %v", o, err)
	}
}
