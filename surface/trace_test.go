package surface

import (
	"context"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestTraceCostsNothingOff: without a recording span (tracing off, or not
// wrapping rate_limit), putting a decision on the span allocates nothing.
func TestTraceCostsNothingOff(t *testing.T) {
	h := provisionServer(t, `{"tenant":"{http.request.header.X-Tenant}",`+allocPolicies+`}`)
	st := decidedState(t, h, "alloc_allow", "acme")
	r := httptest.NewRequest("GET", "/", nil)
	if n := testing.AllocsPerRun(1000, func() { h.traceDecision(r, st, 0) }); n != 0 {
		t.Errorf("%v allocations per request without tracing", n)
	}
}

// TestTraceAttributes: with a recording span, the decision's attributes
// and a denial's event are on it.
func TestTraceAttributes(t *testing.T) {
	h := provisionServer(t, `{"tenant":"{http.request.header.X-Tenant}",`+allocPolicies+`}`)
	decidedState(t, h, "alloc_deny", "acme") // use up the quota
	st := decidedState(t, h, "alloc_deny", "acme")
	rec := tracetest.NewSpanRecorder()
	tp := trace.NewTracerProvider(trace.WithSpanProcessor(rec))
	ctx, span := tp.Tracer("test").Start(context.Background(), "req")
	h.traceDecision(httptest.NewRequest("GET", "/", nil).WithContext(ctx), st, 0)
	span.End()
	got := map[string]string{}
	for _, kv := range rec.Ended()[0].Attributes() {
		got[string(kv.Key)] = kv.Value.String()
	}
	for k, want := range map[string]string{"rate_limit.decision": "denied", "rate_limit.policy": "alloc_deny", "rate_limit.remaining": "0",
		"rate_limit.limit": "1", "rate_limit.store": "memory", "rate_limit.lease_hit": "false", "rate_limit.policies": `["alloc_deny"]`} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q", k, got[k], want)
		}
	}
	if evs := rec.Ended()[0].Events(); len(evs) != 1 || evs[0].Name != "rate_limit.denied" {
		t.Errorf("events %v", evs)
	}
}

// BenchmarkTraceOff is the cost per request of the tracing hook without
// a recording span.
func BenchmarkTraceOff(b *testing.B) {
	h := provisionServer(b, `{"tenant":"{http.request.header.X-Tenant}",`+allocPolicies+`}`)
	st := decidedState(b, h, "alloc_allow", "acme")
	r := httptest.NewRequest("GET", "/", nil)
	b.ReportAllocs()
	for b.Loop() {
		h.traceDecision(r, st, 0)
	}
}
