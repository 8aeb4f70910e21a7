package surface

import (
	"testing"

	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/internal/redistest"
	"github.com/tollgate/caddy-tollgate/limiter"
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
