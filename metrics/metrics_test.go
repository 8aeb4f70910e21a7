package metrics

import (
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
	for ev := range limiter.NumLeaseEvents {
		c := collectors.leaseUnits.WithLabelValues("lease_hook", ev.String())
		before := read(c).Counter.GetValue()
		ObserveLeaseUnits("lease_hook", ev, 3)
		ObserveLeaseUnits("lease_hook", ev, 0)
		if got := read(c).Counter.GetValue() - before; got != 3 {
			t.Errorf("lease units %s: %v, want 3", ev, got)
		}
	}
}
