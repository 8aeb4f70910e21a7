package tollgate

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an OTLP/HTTP trace receiver in the test: it keeps the
// spans it is sent.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			o.spans = append(o.spans, ss.Spans...)
		}
	}
	o.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

// decided returns the spans that carry a rate-limit decision.
func (o *otlpReceiver) decided() []*tracepb.Span {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range o.spans {
		if attr(s.Attributes, "rate_limit.decision") != nil {
			out = append(out, s)
		}
	}
	return out
}

func attr(kvs []*commonpb.KeyValue, key string) *commonpb.AnyValue {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.Value
		}
	}
	return nil
}

// TestBinaryTracing: with Caddy's tracing (which wraps rate_limit in its
// default order), the request's span carries the decision as rate_limit.*
// attributes and a rate_limit.denied event on a 429, exported by OTLP to
// a receiver in the test.
func TestBinaryTracing(t *testing.T) {
	recv := &otlpReceiver{}
	endpoint := "http://" + newHTTPServer(t, recv) + "/v1/traces"
	p := startCaddyProcessEnv(t, []string{
		"OTEL_TRACES_EXPORTER=otlp",
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=" + endpoint,
		"OTEL_BSP_SCHEDULE_DELAY=100",
	}, `{
	admin off
	auto_https off
}
:{PORT} {
	tracing {
		span api
	}
	rate_limit {
		tenant {http.request.header.X-Tenant}
		policy tr_api {
			limit 2
			window 1h
		}
	}
	respond "ok"
}
`)
	if c := p.statuses(3, "/", "X-Tenant", "tr_alice"); c[200] != 2 || c[429] != 1 {
		t.Fatalf("statuses %v", c)
	}
	waitFor(t, func() bool { return len(recv.decided()) >= 3 })
	decisions := map[string]int{}
	for _, s := range recv.decided() {
		d := attr(s.Attributes, "rate_limit.decision").GetStringValue()
		decisions[d]++
		if got := attr(s.Attributes, "rate_limit.policy").GetStringValue(); got != "tr_api" {
			t.Errorf("rate_limit.policy %q", got)
		}
		if got := attr(s.Attributes, "rate_limit.store").GetStringValue(); got != "memory" {
			t.Errorf("rate_limit.store %q", got)
		}
		if attr(s.Attributes, "rate_limit.tenant.digest").GetStringValue() == "" || attr(s.Attributes, "rate_limit.tenant") != nil {
			t.Errorf("tenant attributes: digest %v, tenant %v (log_key is off)", attr(s.Attributes, "rate_limit.tenant.digest"), attr(s.Attributes, "rate_limit.tenant"))
		}
		if got := attr(s.Attributes, "rate_limit.limit").GetIntValue(); got != 2 {
			t.Errorf("rate_limit.limit %d", got)
		}
		denied := 0
		for _, ev := range s.Events {
			if ev.Name == "rate_limit.denied" {
				denied++
			}
		}
		if (d == "denied") != (denied == 1) {
			t.Errorf("decision %s with %d rate_limit.denied events", d, denied)
		}
	}
	if fmt.Sprint(decisions) != "map[allowed:2 denied:1]" {
		t.Errorf("decisions %v", decisions)
	}
}
