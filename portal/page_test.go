package portal

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tollgate/caddy-tollgate/report"
)

func TestFormatWindow(t *testing.T) {
	for in, want := range map[string]string{"1h0m0s": "1h", "1m0s": "1m", "1h30m0s": "1h30m", "90s": "1m30s", "24h0m0s": "1d", "48h0m0s": "2d", "500ms": "500ms", "10s": "10s"} {
		if got := formatWindow(in); got != want {
			t.Errorf("formatWindow(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestPageRenders: the whole page renders for policies with history,
// denials in a chart, an unlimited policy and denials listed.
func TestPageRenders(t *testing.T) {
	rem, reset := int64(0), 12.5
	series := &report.Series{Resolution: "1m", From: "2026-11-26T10:00:00Z", To: "2026-11-26T10:02:00Z", Points: []report.Point{
		{At: "2026-11-26T10:00:00Z", Admitted: 3}, {At: "2026-11-26T10:01:00Z", Admitted: 5, Denied: 2}, {At: "2026-11-26T10:02:00Z"}}}
	v := &View{Tenant: "acme", GeneratedAt: "2026-11-26T10:02:30Z", Policies: []Policy{
		{Policy: report.Policy{Policy: "api", Limit: 5, Window: "1m0s", Remaining: &rem, Reset: &reset, History: series}, Capacity: 5, Why: "the default limit"},
		{Policy: report.Policy{Policy: "free", Unlimited: true}, Why: "the default limit: unlimited"},
	}, Denials: []Denial{{At: "2026-11-26T10:01:10Z", Policy: "api", Limit: 5, RetryAfter: 50}, {At: "2026-11-26T10:01:20Z", Policy: "api", Limit: 5, RetryAfter: 3600, Reason: "penalty"}}}
	var buf bytes.Buffer
	if err := pageTemplate.Execute(&buf, v); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	for _, want := range []string{`<rect class="denied"`, `data-admitted="5" data-denied="2"`, "5 per 1m", "limit reached", "penalty box", "13s", "</html>"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
}
