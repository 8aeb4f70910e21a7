package surface

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/gate"
)

// provisionServer builds the Server of a JSON handler config on the
// embedded store, as the module's Provision does, outside a running Caddy.
func provisionServer(tb testing.TB, cfg string) *Server {
	tb.Helper()
	var c config.Handler
	if err := json.Unmarshal([]byte(cfg), &c); err != nil {
		tb.Fatal(err)
	}
	policies, err := c.Validate()
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	tb.Cleanup(cancel)
	g := &gate.Gate{Config: &c, Policies: gate.NewPolicies(&c, policies)}
	s, err := New(ctx, &c, g)
	if err != nil {
		tb.Fatal(err)
	}
	m, err := gate.OpenMemory(gate.MemoryOptions{Sweep: time.Duration(c.SweepInterval), MaxMemory: c.MaxMemory})
	if err != nil {
		tb.Fatal(err)
	}
	g.Store = m
	tb.Cleanup(func() {
		s.Close()
		_ = m.Close()
	})
	return s
}

// poolsDropItems reports whether sync.Pool drops what is put back, as it
// does at random under the race detector; allocation counts of code that
// pools are then meaningless.
func poolsDropItems() bool {
	var p sync.Pool
	for range 100 {
		x := new(int)
		p.Put(x)
		if p.Get() != x {
			return true
		}
	}
	return false
}
