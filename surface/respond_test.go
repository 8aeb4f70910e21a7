package surface

import (
	"testing"

	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/internal/redistest"
	"github.com/tollgate/caddy-tollgate/limiter"
	"go.uber.org/zap/zapcore"
)

// BenchmarkRecordDenial is the deny path's cost of the stream: building
// the entry and queueing it, with a writer draining the buffer into Redis.
func BenchmarkRecordDenial(b *testing.B) {
	srv := redistest.StartStandalone(b, redistest.Options{})
	backend, err := fleet.Acquire(fleet.BackendOptions{Connection: fleet.Connection{Addresses: []string{srv.Addr}}})
	if err != nil {
		b.Fatal(err)
	}
	defer backend.Release()
	s := backend.Denials()
	s.Acquire(1000)
	defer s.Release(1000)
	h := &Server{Handler: &config.Handler{Tenant: "{http.request.header.X-Tenant}"}}
	p := &policyRuntime{Policy: &gate.Policy{Name: "api", Engine: &limiter.Policy{Name: "api"}}}
	it := &limiter.Item{Tenant: "acme", Policy: p.Engine}
	v := &limiter.Verdict{}
	b.ReportAllocs()
	for b.Loop() {
		h.recordDenial(s, p, it, v, 3)
	}
}

// TestDecisionFieldsTenant: a decision's log line always has a tenant
// field; without a tenant template the tenant is the key, so it is empty
// unless log_key.
func TestDecisionFieldsTenant(t *testing.T) {
	for _, tc := range []struct {
		name           string
		cfg            config.Handler
		tenant, part   string
		wantTenant     string
		wantKey, ofKey bool
	}{
		{"tenant template", config.Handler{Tenant: "{http.request.header.X-Tenant}"}, "acme", "", "acme", false, false},
		{"tenant template, log_key", config.Handler{Tenant: "{http.request.header.X-Tenant}", LogKey: true}, "acme", "/path", "acme", true, false},
		{"key as tenant", config.Handler{}, "10.0.0.1", "", "", false, false},
		{"key as tenant, log_key", config.Handler{LogKey: true}, "10.0.0.1", "", "10.0.0.1", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &Server{Handler: &tc.cfg}
			p := &policyRuntime{Policy: &gate.Policy{Name: "api", Engine: &limiter.Policy{Name: "api"}}}
			it := &limiter.Item{Tenant: tc.tenant, Part: tc.part, Policy: p.Engine}
			enc := zapcore.NewMapObjectEncoder()
			for _, f := range h.decisionFields(nil, p, it, &limiter.Verdict{}, 3) {
				f.AddTo(enc)
			}
			got, ok := enc.Fields["tenant"]
			if !ok || got != tc.wantTenant {
				t.Errorf("tenant field = %v (present %v), want %q", got, ok, tc.wantTenant)
			}
			key, hasKey := enc.Fields["key"]
			if hasKey != tc.wantKey {
				t.Errorf("key field present %v, want %v", hasKey, tc.wantKey)
			}
			if tc.ofKey && key != got {
				t.Errorf("key %v and tenant %v differ; without a tenant template they are one value", key, got)
			}
			if enc.Fields["policy"] != "api" || enc.Fields["retry_after"] != int64(3) {
				t.Errorf("fields %v lack policy or retry_after", enc.Fields)
			}
		})
	}
}
