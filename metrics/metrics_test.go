package metrics

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tollgate/caddy-tollgate/limiter"
)

func TestTenantLabel(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"acme", "acme"},
		{strings.Repeat("a", 64), strings.Repeat("a", 64)},
		{strings.Repeat("a", 65), strings.Repeat("a", 64)},
		{strings.Repeat("a", 63) + "é", strings.Repeat("a", 63)}, // no half rune
		{"bad\xff\xfe", "bad\uFFFD"},
		{strings.Repeat("\xff", 100), strings.Repeat("\uFFFD", 1)},
	} {
		if got := tenantLabel(tc.in); got != tc.want {
			t.Errorf("tenantLabel(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	// Any input is a valid label value of at most 64 bytes.
	for _, in := range []string{strings.Repeat("\xe2\x82", 50), strings.Repeat("😀", 30), "\x00\x01"} {
		got := tenantLabel(in)
		if len(got) > maxTenantLabel {
			t.Errorf("tenantLabel(%q): %d bytes", in, len(got))
		}
		if _, err := collectors.tenantRequests.GetMetricWithLabelValues("label_test", got, "allowed"); err != nil {
			t.Errorf("tenantLabel(%q) = %q: %v", in, got, err)
		}
		collectors.tenantRequests.DeleteLabelValues("label_test", got, "allowed")
	}
}

// TestRegisterMetricsTwice: a second handler of the same config, and the
// next config's registry, register without error; a foreign collector of
// the same name is an error.
func TestRegisterMetricsTwice(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	for range 2 {
		if err := Register(reg); err != nil {
			t.Fatal(err)
		}
	}
	if err := Register(prometheus.NewPedanticRegistry()); err != nil {
		t.Fatal(err)
	}
	clash := prometheus.NewPedanticRegistry()
	clash.MustRegister(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "caddy_rate_limit_requests_total", Help: "x"}, []string{"zone", "key"}))
	if err := Register(clash); err == nil {
		t.Error("registering over a different caddy_rate_limit_requests_total: no error")
	}
}

func TestClassify(t *testing.T) {
	v := func(path limiter.Path, shadow, allowed bool) *limiter.Verdict {
		return &limiter.Verdict{Path: path, Limit: limiter.Limit{Shadow: shadow}, Result: limiter.Result{Allowed: allowed}}
	}
	for _, tc := range []struct {
		v     *limiter.Verdict
		redis bool
		dec   decisionLabel
		src   sourceLabel
	}{
		{v(limiter.PathStore, false, true), false, decisionAllowed, sourceMemory},
		{v(limiter.PathStore, false, false), false, decisionDenied, sourceMemory},
		{v(limiter.PathStore, true, false), false, decisionShadowDenied, sourceMemory},
		{v(limiter.PathStore, true, true), true, decisionAllowed, sourceRedis},
		{v(limiter.PathStore, false, false), true, decisionDenied, sourceRedis},
		{v(limiter.PathFailedOpen, false, true), true, decisionFailedOpen, sourceRedis},
		{v(limiter.PathFailedClosed, false, false), true, decisionFailedClosed, sourceRedis},
		{v(limiter.PathFallback, false, true), true, decisionFallbackAllowed, sourceFallback},
		{v(limiter.PathFallback, false, false), true, decisionFallbackDenied, sourceFallback},
		{v(limiter.PathPenalty, false, false), true, decisionPenalty, sourceCache},
		{v(limiter.PathPenalty, false, false), false, decisionPenalty, sourceCache},
		{v(limiter.PathPenalty, true, false), true, decisionShadowDenied, sourceCache},
	} {
		if dec, src := classify(tc.v, tc.redis); dec != tc.dec || src != tc.src {
			t.Errorf("classify(%+v, redis=%v) = %s/%s, want %s/%s", *tc.v, tc.redis,
				decisionNames[dec], sourceNames[src], decisionNames[tc.dec], sourceNames[tc.src])
		}
	}
}

// TestBreakerAndLeaseHooks: the setters the breaker and leases call.
func TestBreakerAndLeaseHooks(t *testing.T) {
	read := func(c prometheus.Metric) *dto.Metric {
		var m dto.Metric
		if err := c.Write(&m); err != nil {
			t.Fatal(err)
		}
		return &m
	}
	// The breaker gauge reads the backends in use (fleet.AnyBreakerOpen,
	// tested in package fleet): none here.
	if got := read(collectors.breakerOpen).Gauge.GetValue(); got != 0 {
		t.Errorf("no backend: breaker gauge %v", got)
	}
	// Each engine event adds to the series of its label; a lost grant
	// (limiter.LeaseLost) adds to acquired and expired, and there is no
	// "lost" series.
	for _, tc := range []struct {
		ev   limiter.LeaseEvent
		want map[string]float64
	}{
		{limiter.LeaseAcquired, map[string]float64{"acquired": 3}},
		{limiter.LeaseSpent, map[string]float64{"spent": 3}},
		{limiter.LeaseReturned, map[string]float64{"returned": 3}},
		{limiter.LeaseExpired, map[string]float64{"expired": 3}},
		{limiter.LeaseLost, map[string]float64{"acquired": 3, "expired": 3}},
	} {
		before := map[string]float64{}
		for _, name := range LeaseEventNames() {
			before[name] = read(collectors.leaseUnits.WithLabelValues("lease_hook", name)).Counter.GetValue()
		}
		ObserveLeaseUnits("lease_hook", tc.ev, 3)
		ObserveLeaseUnits("lease_hook", tc.ev, 0)
		for _, name := range LeaseEventNames() {
			got := read(collectors.leaseUnits.WithLabelValues("lease_hook", name)).Counter.GetValue() - before[name]
			if got != tc.want[name] {
				t.Errorf("after %d units %s: %s moved by %v, want %v", 3, tc.ev, name, got, tc.want[name])
			}
		}
	}
	if n := limiter.NumLeaseEvents; n != 5 {
		t.Errorf("the engine has %d lease events: map the new ones in leaseLabel and here", n)
	}
	if got, want := LeaseEventNames(), []string{"acquired", "spent", "returned", "expired"}; !slices.Equal(got, want) {
		t.Errorf("LeaseEventNames() = %v, want %v", got, want)
	}
	ch := make(chan prometheus.Metric, 16)
	collectors.leaseUnits.Collect(ch)
	close(ch)
	var events []string
	for m := range ch {
		for _, lp := range read(m).Label {
			if lp.GetName() == "event" && !slices.Contains(events, lp.GetValue()) {
				events = append(events, lp.GetValue())
			}
		}
	}
	slices.Sort(events)
	if want := []string{"acquired", "expired", "returned", "spent"}; !slices.Equal(events, want) {
		t.Errorf("lease_units_total event values %v, want %v", events, want)
	}
}
