package tollgate

import (
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/tollgate/caddy-tollgate/internal/caddyreq"

	"github.com/tollgate/caddy-tollgate/gate"
)

// TestEmbeddedStoreMemoryBudget: max_memory bounds the embedded store's
// buckets, and handlers share a store only when sweep_interval and
// max_memory both match.
func TestEmbeddedStoreMemoryBudget(t *testing.T) {
	const pol = `"tenant":"{http.request.header.X-Tenant}","headers":"off",
		"rate_limits":{"api":{"algorithm":"token_bucket","max_events":10,"window":60000000000}}`
	small := provisionHandler(t, `{"max_memory":1048576,`+pol+`}`)
	small2 := provisionHandler(t, `{"max_memory":1048576,`+pol+`}`)
	def := provisionHandler(t, `{`+pol+`}`)
	if small.gate.Store.Scope() != small2.gate.Store.Scope() {
		t.Error("two handlers with the same max_memory got different stores")
	}
	if small.gate.Store.Scope() == def.gate.Store.Scope() {
		t.Error("handlers with different max_memory share a store")
	}

	const tenants = 20000
	w := httptest.NewRecorder()
	for _, h := range []*Handler{small, def} {
		for i := range tenants {
			if err := h.ServeHTTP(w, caddyreq.New(w, "tenant-"+strconv.Itoa(i)), caddyreq.OK); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A bucket with a ~30-byte key counts about 160 bytes, so 1 MiB holds
	// at most ~6,600 of them; the default budget holds all 20,000.
	if n := small.gate.Store.(*gate.Memory).MemoryStore().Len(); n < 3000 || n > 1<<20/150 {
		t.Errorf("1 MiB store holds %d buckets, want 3000 to %d", n, 1<<20/150)
	}
	if n := def.gate.Store.(*gate.Memory).MemoryStore().Len(); n != tenants {
		t.Errorf("default store holds %d buckets, want %d", n, tenants)
	}
}
