package limiter

import (
	"context"
	"testing"
	"time"
)

type fixedOverrides map[string]Limit

func (f fixedOverrides) Lookup(p *Policy, tenant string) (Limit, bool) {
	l, ok := f[tenant+"/"+p.Name]
	return l, ok
}

func TestDecisionRuntimeOverrideWins(t *testing.T) {
	store := NewMemoryStore(MemoryOptions{})
	defer store.Close()
	p := &Policy{
		Name:         "api",
		Algorithm:    FixedWindow,
		Limit:        Limit{Rate: Rate{Limit: 5, Window: time.Minute}},
		TenantLimits: map[string]Limit{"acme": {Rate: Rate{Limit: 3, Window: time.Minute}}},
	}
	var d Decision
	d.Overrides = fixedOverrides{"acme/api": {Rate: Rate{Limit: 1, Window: time.Minute}}}
	items := []Item{{Policy: p, Tenant: "acme", Cost: 1}}
	for i, want := range []bool{true, false} {
		if err := d.Decide(context.Background(), store, items); err != nil {
			t.Fatal(err)
		}
		if d.Admitted != want || d.Verdicts[0].Source != SourceRuntimeOverride || d.Verdicts[0].Limit.Limit != 1 {
			t.Fatalf("request %d: admitted %v, verdict %+v", i, d.Admitted, d.Verdicts[0])
		}
	}
	// Reset keeps the lookup; other tenants resolve as before.
	d.Reset()
	items[0].Tenant = "other"
	if err := d.Decide(context.Background(), store, items); err != nil {
		t.Fatal(err)
	}
	if d.Verdicts[0].Source != SourcePolicy || d.Verdicts[0].Limit.Limit != 5 {
		t.Fatalf("other tenant: %+v", d.Verdicts[0])
	}
}
