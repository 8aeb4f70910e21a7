package tollgate

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/caddyreq"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/internal/redistest"
	"github.com/tollgate/caddy-tollgate/metrics"
)

// The metric families: names, types and labels are a
// contract.
func TestMetricCatalogIsTheDesign(t *testing.T) {
	want := map[string]metrics.Family{
		"caddy_rate_limit_requests_total":            {Kind: "counter", Labels: []string{"policy", "decision"}},
		"caddy_rate_limit_decision_duration_seconds": {Kind: "histogram", Labels: []string{"policy", "source"}},
		"caddy_rate_limit_redis_calls_total":         {Kind: "counter", Labels: []string{"script", "result"}},
		"caddy_rate_limit_redis_duration_seconds":    {Kind: "histogram", Labels: []string{"script"}},
		"caddy_rate_limit_lease_units_total":         {Kind: "counter", Labels: []string{"policy", "event"}},
		"caddy_rate_limit_breaker_open":              {Kind: "gauge", Labels: nil},
		"caddy_rate_limit_tenant_requests_total":     {Kind: "counter", Labels: []string{"policy", "tenant", "decision"}},
		"caddy_rate_limit_denials_dropped_total":     {Kind: "counter", Labels: []string{"reason"}},
		"caddy_rate_limit_near_limit_total":          {Kind: "counter", Labels: []string{"policy"}},
		"caddy_rate_limit_tenant_near_limit_total":   {Kind: "counter", Labels: []string{"policy", "tenant"}},
		"caddy_rate_limit_delay_seconds":             {Kind: "histogram", Labels: []string{"policy"}},
		"caddy_rate_limit_cost_missing_total":        {Kind: "counter", Labels: []string{"policy", "reason"}},
		"caddy_rate_limit_drains_total":              {Kind: "counter", Labels: []string{"event"}},
		"caddy_rate_limit_llm_requests_total":        {Kind: "counter", Labels: []string{"result"}},
		"caddy_rate_limit_redis_queue_seconds":       {Kind: "histogram", Labels: nil},
		"caddy_rate_limit_redis_queue_shed_total":    {Kind: "counter", Labels: nil},
		"caddy_rate_limit_notifications_total":       {Kind: "counter", Labels: []string{"event", "result"}},
		"caddy_rate_limit_protect_limit":             {Kind: "gauge", Labels: nil},
		"caddy_rate_limit_protect_inflight":          {Kind: "gauge", Labels: nil},
		"caddy_rate_limit_protect_queued":            {Kind: "gauge", Labels: nil},
		"caddy_rate_limit_protect_wait_seconds":      {Kind: "histogram", Labels: []string{"tier"}},
		"caddy_rate_limit_shed_total":                {Kind: "counter", Labels: []string{"reason"}},
		// caddy-ratelimit's families, without its unbounded key label.
		"caddy_rate_limit_declined_requests_total": {Kind: "counter", Labels: []string{"zone"}},
		"caddy_rate_limit_process_time_seconds":    {Kind: "histogram", Labels: []string{"zone"}},
		"caddy_rate_limit_keys_total":              {Kind: "gauge", Labels: []string{"zone"}},
		"caddy_rate_limit_config":                  {Kind: "counter", Labels: []string{"zone", "max_events", "window", "ipv4_prefix", "ipv6_prefix"}},
	}
	if !reflect.DeepEqual(metrics.Catalog(), want) {
		t.Errorf("metric catalog:\n got %v\nwant %v", metrics.Catalog(), want)
	}
	// The catalog describes the collectors that are actually exported.
	var descs []string
	for _, c := range metrics.Collectors() {
		ch := make(chan *prometheus.Desc, 4)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			descs = append(descs, d.String())
		}
	}
	if len(descs) != len(want) {
		t.Errorf("%d descriptors, want %d", len(descs), len(want))
	}
	for name := range want {
		if !slices.ContainsFunc(descs, func(d string) bool { return strings.Contains(d, fmt.Sprintf("fqName: %q", name)) }) {
			t.Errorf("no collector exports %s", name)
		}
	}
	wantDecisions := []string{"allowed", "denied", "shadow_denied", "failed_open", "failed_closed", "fallback_allowed", "fallback_denied", "delayed", "penalty", "shed"}
	if !slices.Equal(metrics.DecisionNames(), wantDecisions) {
		t.Errorf("decisions %v, want %v", metrics.DecisionNames(), wantDecisions)
	}
	wantSources := []string{"memory", "redis", "lease", "cache", "fallback"}
	if !slices.Equal(slices.Sorted(slices.Values(metrics.SourceNames())), slices.Sorted(slices.Values(wantSources))) {
		t.Errorf("sources %v, want %v", metrics.SourceNames(), wantSources)
	}
}

// scrape is one parsed /metrics answer.
type scrape struct {
	t        testing.TB
	text     string
	families map[string]*dto.MetricFamily
}

// scrapeMetrics GETs url and parses the text exposition.
func scrapeMetrics(t testing.TB, url string) *scrape {
	t.Helper()
	res, err := testClient.Get(url)
	for try := 0; try < 3 && err != nil && droppedBeforeRequest(err); try++ {
		// Right after a reload, the previous config's server may take
		// the connection and close it as it stops: scraping is a read,
		// try again on a new connection.
		testClient.CloseIdleConnections()
		time.Sleep(20 * time.Millisecond)
		res, err = testClient.Get(url)
	}
	if err != nil {
		t.Fatalf("scraping %s: %v", url, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("scraping %s: status %d\n%s", url, res.StatusCode, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parsing %s: %v\n%s", url, err, body)
	}
	return &scrape{t: t, text: string(body), families: fams}
}

// value returns the sample of family name with exactly the given labels
// ("k", "v", ...): a counter's or gauge's value, a histogram's count; 0
// when there is no such series.
func (s *scrape) value(name string, labelPairs ...string) float64 {
	s.t.Helper()
	m := s.metric(name, labelPairs...)
	switch {
	case m == nil:
		return 0
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	s.t.Fatalf("%s: unexpected metric type", name)
	return 0
}

func (s *scrape) metric(name string, labelPairs ...string) *dto.Metric {
	fam := s.families[name]
	if fam == nil {
		return nil
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labelPairs); i += 2 {
		want[labelPairs[i]] = labelPairs[i+1]
	}
	for _, m := range fam.Metric {
		got := map[string]string{}
		for _, lp := range m.Label {
			got[lp.GetName()] = lp.GetValue()
		}
		if reflect.DeepEqual(got, want) {
			return m
		}
	}
	return nil
}

// delta is value minus before's value: counters are process-wide, so
// tests that may run more than once (-count) compare against a scrape
// taken before their traffic.
func (s *scrape) delta(before *scrape, name string, labelPairs ...string) float64 {
	s.t.Helper()
	return s.value(name, labelPairs...) - before.value(name, labelPairs...)
}

// labelValues lists the values of label in family name's series that
// have the label pairs given.
func (s *scrape) labelValues(name, label string, labelPairs ...string) []string {
	var out []string
	fam := s.families[name]
	if fam == nil {
		return nil
	}
	for _, m := range fam.Metric {
		got := map[string]string{}
		for _, lp := range m.Label {
			got[lp.GetName()] = lp.GetValue()
		}
		match := true
		for i := 0; i+1 < len(labelPairs); i += 2 {
			match = match && got[labelPairs[i]] == labelPairs[i+1]
		}
		if match && !slices.Contains(out, got[label]) {
			out = append(out, got[label])
		}
	}
	slices.Sort(out)
	return out
}

// checkFamiliesOnce fails unless every Tollgate family that has series
// appears exactly once, and the always-present gauge is there.
func (s *scrape) checkFamiliesOnce() {
	s.t.Helper()
	for name := range metrics.Catalog() {
		n := strings.Count(s.text, "# TYPE "+name+" ")
		if n > 1 {
			s.t.Errorf("family %s appears %d times", name, n)
		}
	}
	if !strings.Contains(s.text, "# TYPE caddy_rate_limit_breaker_open gauge") {
		s.t.Error("caddy_rate_limit_breaker_open is not exported")
	}
	if strings.Count(s.text, "# TYPE caddy_rate_limit_requests_total counter") != 1 {
		s.t.Errorf("caddy_rate_limit_requests_total appears %d times", strings.Count(s.text, "# TYPE caddy_rate_limit_requests_total counter"))
	}
}

// metricsSite serves /metrics with Caddy's metrics handler and rate
// limits everything else with the rate_limit block body.
func metricsSite(body string) string {
	return `
	handle /metrics {
		metrics
	}
	handle {
		rate_limit {
` + strings.Trim(body, "\n") + `
		}
		respond "ok"
	}`
}

const embeddedMetricsBody = `
			tenant {http.request.header.X-Tenant}
			policy mt_enforced {
				match {
					path /a*
				}
				limit 2
				window 1h
			}
			policy mt_shadow {
				match {
					path /s*
				}
				limit 1
				window 1h
				shadow
			}
			policy mt_free {
				match {
					path /f*
				}
				limit 5
				window 1h
				override vip unlimited
			}`

// TestMetricsEndToEnd: allowed, denied and shadow decisions are counted
// exactly and exported on a metrics route; two reloads keep one family
// each and the counts continue.
func TestMetricsEndToEnd(t *testing.T) {
	s := startCaddy(t, "", metricsSite(embeddedMetricsBody), nil)
	before := scrapeMetrics(t, s.base+"/metrics")
	if c := s.statuses(5, "/a", "X-Tenant", "acme"); c[200] != 2 || c[429] != 3 {
		t.Fatalf("enforced: %v", c)
	}
	if c := s.statuses(3, "/s", "X-Tenant", "acme"); c[200] != 3 {
		t.Fatalf("shadow: %v", c)
	}
	// Unlimited requests are not counted.
	if c := s.statuses(4, "/f", "X-Tenant", "vip"); c[200] != 4 {
		t.Fatalf("unlimited: %v", c)
	}
	const req, dur = "caddy_rate_limit_requests_total", "caddy_rate_limit_decision_duration_seconds"
	check := func(m *scrape, enforcedAllowed, enforcedDenied float64) {
		t.Helper()
		m.checkFamiliesOnce()
		want := []struct {
			name   string
			labels []string
			v      float64
		}{
			{req, []string{"policy", "mt_enforced", "decision", "allowed"}, enforcedAllowed},
			{req, []string{"policy", "mt_enforced", "decision", "denied"}, enforcedDenied},
			{req, []string{"policy", "mt_enforced", "decision", "shadow_denied"}, 0},
			{req, []string{"policy", "mt_shadow", "decision", "allowed"}, 1},
			{req, []string{"policy", "mt_shadow", "decision", "shadow_denied"}, 2},
			{req, []string{"policy", "mt_shadow", "decision", "denied"}, 0},
			{req, []string{"policy", "mt_free", "decision", "allowed"}, 0},
			{dur, []string{"policy", "mt_enforced", "source", "memory"}, enforcedAllowed + enforcedDenied},
			{dur, []string{"policy", "mt_shadow", "source", "memory"}, 3},
			{"caddy_rate_limit_breaker_open", nil, 0},
		}
		for _, w := range want {
			if got := m.delta(before, w.name, w.labels...); got != w.v {
				t.Errorf("%s%v = %v, want %v", w.name, w.labels, got, w.v)
			}
		}
		// An embedded store has no Redis, fail mode or tenant series.
		if got := m.labelValues(req, "decision", "policy", "mt_enforced"); !slices.Equal(got, []string{"allowed", "denied", "shadow_denied"}) {
			t.Errorf("mt_enforced decisions exported: %v", got)
		}
		if got := m.labelValues(dur, "source", "policy", "mt_enforced"); !slices.Equal(got, []string{"memory"}) {
			t.Errorf("mt_enforced sources exported: %v", got)
		}
		if got := m.labelValues("caddy_rate_limit_tenant_requests_total", "tenant", "policy", "mt_enforced"); got != nil {
			t.Errorf("tenant series without metrics_tenants: %v", got)
		}
		// Durations are plausible: every decision under a second.
		if m := m.metric(dur, "policy", "mt_enforced", "source", "memory"); m != nil {
			h := m.Histogram
			for _, b := range h.Bucket {
				if b.GetUpperBound() == 1 && b.GetCumulativeCount() != h.GetSampleCount() {
					t.Errorf("the 1s bucket holds %d of %d", b.GetCumulativeCount(), h.GetSampleCount())
				}
			}
			if first := h.Bucket[0].GetUpperBound(); first != 10e-6 {
				t.Errorf("smallest bucket %v, want 10µs", first)
			}
		}
	}
	check(scrapeMetrics(t, s.base+"/metrics"), 2, 3)

	for range 2 {
		s.load("", metricsSite(embeddedMetricsBody), nil)
		check(scrapeMetrics(t, s.base+"/metrics"), 2, 3)
	}
	if c := s.statuses(1, "/a", "X-Tenant", "acme"); c[429] != 1 {
		t.Fatalf("after reloads: %v (buckets survive reloads)", c)
	}
	if c := s.statuses(1, "/a", "X-Tenant", "other"); c[200] != 1 {
		t.Fatalf("after reloads, new tenant: %v", c)
	}
	check(scrapeMetrics(t, s.base+"/metrics"), 3, 4)
}

// TestMetricsOnAdminEndpoint: the families are on Caddy's admin /metrics
// too (the same registry).
func TestMetricsOnAdminEndpoint(t *testing.T) {
	adminPort := freePort(t)
	withAdmin := func(cfg map[string]any) {
		cfg["admin"] = map[string]any{"listen": fmt.Sprintf("127.0.0.1:%d", adminPort)}
	}
	site := metricsSite(`
			policy mt_admin {
				limit 1
				window 1h
			}`)
	s := startCaddy(t, "", site, withAdmin)
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", adminPort)
	before := scrapeMetrics(t, url)
	if c := s.statuses(3, "/x"); c[200] != 1 || c[429] != 2 {
		t.Fatalf("%v", c)
	}
	for i := range 3 {
		m := scrapeMetrics(t, url)
		m.checkFamiliesOnce()
		if a, d := m.delta(before, "caddy_rate_limit_requests_total", "policy", "mt_admin", "decision", "allowed"),
			m.delta(before, "caddy_rate_limit_requests_total", "policy", "mt_admin", "decision", "denied"); a != 1 || d != 2 {
			t.Errorf("scrape %d: allowed %v denied %v, want 1 and 2", i, a, d)
		}
		s.load("", site, withAdmin)
	}
}

// TestMetricsDisabled: disable_metrics records nothing.
func TestMetricsDisabled(t *testing.T) {
	s := startCaddy(t, "", metricsSite(`
			disable_metrics
			policy mt_disabled {
				limit 1
				window 1h
			}`), nil)
	if c := s.statuses(3, "/x"); c[200] != 1 || c[429] != 2 {
		t.Fatalf("%v", c)
	}
	m := scrapeMetrics(t, s.base+"/metrics")
	if got := m.labelValues("caddy_rate_limit_requests_total", "decision", "policy", "mt_disabled"); got != nil {
		t.Errorf("disable_metrics: decisions recorded: %v", got)
	}
	if got := m.labelValues("caddy_rate_limit_decision_duration_seconds", "source", "policy", "mt_disabled"); got != nil {
		t.Errorf("disable_metrics: durations recorded: %v", got)
	}
}

// TestMetricsTenants: the top n tenants get their own series, the rest
// are _other, and the series continue across reloads.
func TestMetricsTenants(t *testing.T) {
	site := metricsSite(`
			tenant {http.request.header.X-Tenant}
			metrics_tenants 2
			policy mt_tenants {
				limit 4
				window 1h
			}`)
	s := startCaddy(t, "", site, nil)
	before := scrapeMetrics(t, s.base+"/metrics")
	send := func(tenant string, n int) {
		t.Helper()
		s.statuses(n, "/", "X-Tenant", tenant)
	}
	send("alpha", 6) // 4 allowed, 2 denied
	send("beta", 3)
	send("gamma", 1)
	send("delta", 5) // 4 allowed, 1 denied
	const name = "caddy_rate_limit_tenant_requests_total"
	check := func(m *scrape) {
		t.Helper()
		m.checkFamiliesOnce()
		if got := m.labelValues(name, "tenant", "policy", "mt_tenants"); !slices.Equal(got, []string{"_other", "alpha", "beta"}) {
			t.Errorf("tenants %v, want [_other alpha beta]", got)
		}
		for _, w := range []struct {
			tenant, decision string
			v                float64
		}{
			{"alpha", "allowed", 4}, {"alpha", "denied", 2},
			{"beta", "allowed", 3}, {"beta", "denied", 0},
			{"_other", "allowed", 5}, {"_other", "denied", 1},
		} {
			if got := m.value(name, "policy", "mt_tenants", "tenant", w.tenant, "decision", w.decision); got != w.v {
				t.Errorf("%s %s = %v, want %v", w.tenant, w.decision, got, w.v)
			}
		}
		if got := m.delta(before, "caddy_rate_limit_requests_total", "policy", "mt_tenants", "decision", "allowed"); got != 12 {
			t.Errorf("requests allowed %v, want 12", got)
		}
	}
	check(scrapeMetrics(t, s.base+"/metrics"))
	for range 2 {
		s.load("", site, nil)
		check(scrapeMetrics(t, s.base+"/metrics"))
	}
	// A long tenant is cut to 64 bytes, and hostile bytes stay valid.
	s.load("", metricsSite(`
			tenant {http.request.header.X-Tenant}
			metrics_tenants 3
			policy mt_tenants_long {
				limit 4
				window 1h
			}`), nil)
	long := strings.Repeat("é", 40) // 80 bytes
	send(long, 1)
	m := scrapeMetrics(t, s.base+"/metrics")
	got := m.labelValues(name, "tenant", "policy", "mt_tenants_long")
	if want := strings.Repeat("é", 32); !slices.Equal(got, []string{want}) {
		t.Errorf("long tenant label %q, want %q", got, want)
	}
	// The previous config's tenant series went with it.
	if got := m.labelValues(name, "tenant", "policy", "mt_tenants"); got != nil {
		t.Errorf("series of an unloaded config remain: %v", got)
	}

	// Without a tenant template, a request's tenant is its key, here an
	// API key: no key ever becomes a label, so there are no tenant series
	// (the setting is ignored with a warning), and the requests are still
	// counted per policy.
	s.load("", metricsSite(`
			metrics_tenants 3
			policy mt_keys {
				key {http.request.header.X-Api-Key}
				limit 4
				window 1h
			}`), nil)
	before = scrapeMetrics(t, s.base+"/metrics")
	s.statuses(3, "/", "X-Api-Key", "sk-secret-1")
	s.statuses(1, "/", "X-Api-Key", "sk-secret-2")
	m = scrapeMetrics(t, s.base+"/metrics")
	if got := m.labelValues(name, "tenant", "policy", "mt_keys"); got != nil {
		t.Errorf("keys became tenant labels: %v", got)
	}
	if got := m.delta(before, "caddy_rate_limit_requests_total", "policy", "mt_keys", "decision", "allowed"); got != 4 {
		t.Errorf("mt_keys allowed %v, want 4", got)
	}
}

// TestMetricsRedis: every request is one decide script call, counted
// with its duration, and a Redis failure is counted by fail mode.
func TestMetricsRedis(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	site := metricsSite(fmt.Sprintf(`
			redis {
				address %s
			}
			tenant {http.request.header.X-Tenant}
			policy mt_redis {
				limit 3
				window 1h
				fail closed
			}
			policy mt_redis_local {
				match {
					path /local*
				}
				limit 3
				window 1h
			}`, srv.Addr))
	s := startCaddy(t, "", site, nil)
	const calls, rdur = "caddy_rate_limit_redis_calls_total", "caddy_rate_limit_redis_duration_seconds"
	before := scrapeMetrics(t, s.base+"/metrics")
	decideOK := func(m *scrape) float64 { return m.value(calls, "script", "decide", "result", "ok") }
	decideDur := func(m *scrape) float64 { return m.value(rdur, "script", "decide") }

	if c := s.statuses(7, "/", "X-Tenant", "acme"); c[200] != 3 || c[429] != 4 {
		t.Fatalf("%v", c)
	}
	m := scrapeMetrics(t, s.base+"/metrics")
	m.checkFamiliesOnce()
	if got := decideOK(m) - decideOK(before); got != 7 {
		t.Errorf("decide ok calls: %v, want 7 (one per request)", got)
	}
	// A fresh server does not know the script yet: one NOSCRIPT round
	// trip, then EVAL. Every round trip has its duration.
	noscript := m.delta(before, calls, "script", "decide", "result", "noscript")
	if got := decideDur(m) - decideDur(before); got != 7+noscript {
		t.Errorf("decide durations: %v, want %v", got, 7+noscript)
	}
	for _, w := range []struct {
		name   string
		labels []string
		v      float64
	}{
		{"caddy_rate_limit_requests_total", []string{"policy", "mt_redis", "decision", "allowed"}, 3},
		{"caddy_rate_limit_requests_total", []string{"policy", "mt_redis", "decision", "denied"}, 4},
		{"caddy_rate_limit_requests_total", []string{"policy", "mt_redis", "decision", "failed_closed"}, 0},
		{"caddy_rate_limit_decision_duration_seconds", []string{"policy", "mt_redis", "source", "redis"}, 7},
	} {
		if got := m.delta(before, w.name, w.labels...); got != w.v {
			t.Errorf("%s%v = %v, want %v", w.name, w.labels, got, w.v)
		}
	}

	// Reloads: the counts continue, one family each.
	for range 2 {
		s.load("", site, nil)
	}
	if c := s.statuses(1, "/", "X-Tenant", "other"); c[200] != 1 {
		t.Fatalf("after reloads: %v", c)
	}
	m2 := scrapeMetrics(t, s.base+"/metrics")
	m2.checkFamiliesOnce()
	if got := decideOK(m2) - decideOK(before); got != 8 {
		t.Errorf("decide ok calls after reloads: %v, want 8", got)
	}

	// Redis gone: fail closed and fallback decisions, failed calls.
	srv.Kill()
	if c := s.statuses(2, "/", "X-Tenant", "acme"); c[429] != 2 {
		t.Fatalf("redis down, fail closed: %v", c)
	}
	if c := s.statuses(2, "/local", "X-Tenant", "acme"); c[429] != 2 {
		t.Fatalf("redis down, /local: %v (mt_redis still fails closed)", c)
	}
	m3 := scrapeMetrics(t, s.base+"/metrics")
	if got := m3.delta(before, "caddy_rate_limit_requests_total", "policy", "mt_redis", "decision", "failed_closed"); got != 4 {
		t.Errorf("failed_closed = %v, want 4", got)
	}
	if got := m3.delta(before, "caddy_rate_limit_requests_total", "policy", "mt_redis_local", "decision", "fallback_allowed"); got != 2 {
		t.Errorf("fallback_allowed = %v, want 2", got)
	}
	if got := m3.delta(before, "caddy_rate_limit_decision_duration_seconds", "policy", "mt_redis_local", "source", "fallback"); got != 2 {
		t.Errorf("fallback durations = %v, want 2", got)
	}
	failed := 0.0
	for _, r := range []string{"error", "timeout"} {
		failed += m3.delta(m, calls, "script", "decide", "result", r)
	}
	// One failed round trip per request (fewer once a breaker skips them).
	if failed < 1 || failed > 4 {
		t.Errorf("failed decide calls: %v, want 1 to 4", failed)
	}
}

// TestBreakerGaugeAfterCleanup: caddy_rate_limit_breaker_open is 1 while
// a handler's Redis breaker is open and back to 0 once the handler (and
// so its backend) is gone, as after a reload during an outage; it used to
// stay at 1 until some other breaker closed.
func TestBreakerGaugeAfterCleanup(t *testing.T) {
	gauge := func() float64 { return gathered(t, "caddy_rate_limit_breaker_open") }
	var h Handler
	cfg := `{"redis":{"addresses":["127.0.0.1:1"],"timeout":"100ms","breaker_failures":1,"breaker_cooldown":"1h"},"fail":"open",
		"tenant":"{http.request.header.X-Tenant}","rate_limits":{"api":{"algorithm":"token_bucket","max_events":10,"window":"1m"}}}`
	if err := json.Unmarshal([]byte(cfg), &h); err != nil {
		t.Fatal(err)
	}
	if err := h.Provision(quietContext(t)); err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	if err := h.ServeHTTP(w, caddyreq.New(w, "acme"), caddyreq.OK); err != nil {
		t.Fatal(err)
	}
	if g := gauge(); g != 1 {
		t.Fatalf("breaker gauge %v with Redis down, want 1", g)
	}
	if err := h.Cleanup(); err != nil {
		t.Log(err)
	}
	if g := gauge(); g != 0 {
		t.Fatalf("breaker gauge %v after the handler is gone, want 0", g)
	}
}

// TestProvisionRegistersMetrics: provisioning through Caddy's context
// registers the families, and they gather cleanly from its pedantic
// registry.
func TestProvisionRegistersMetrics(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	h := &Handler{Handler: config.Handler{RateLimits: map[string]*config.PolicyConfig{"reg_twice": {MaxEvents: 1, Window: caddy.Duration(time.Hour)}}}}
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	fams, err := ctx.GetMetricsRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range fams {
		if strings.HasPrefix(f.GetName(), "caddy_rate_limit_") {
			names = append(names, f.GetName())
		}
	}
	if !slices.Contains(names, "caddy_rate_limit_requests_total") || !slices.Contains(names, "caddy_rate_limit_breaker_open") {
		t.Errorf("gathered %v", names)
	}
}

// gathered is the value of the series of family name with the label pairs
// given, read from Tollgate's collectors (process-wide) through a registry
// of their own.
func gathered(t testing.TB, name string, labelPairs ...string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := metrics.Register(reg); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{}
	for i := 0; i+1 < len(labelPairs); i += 2 {
		labels[labelPairs[i]] = labelPairs[i+1]
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	v, _ := metricValue(byName, name, labels)
	return v
}

// TestDocMetricsListener: the documented Prometheus setup serves the
// metrics on a listener of its own, with the admin API on localhost only:
// the scrape sees Tollgate's families.
func TestDocMetricsListener(t *testing.T) {
	block := docBlockWith(t, ":9180 {", "metrics")
	metricsPort, sitePort, adminPort := freePort(t), freePort(t), freePort(t)
	src := strings.NewReplacer(
		"admin localhost:2019", fmt.Sprintf("admin 127.0.0.1:%d\n\tauto_https off\n\tpersist_config off", adminPort),
		":9180 {", fmt.Sprintf("http://127.0.0.1:%d {", metricsPort),
		"api.example.com {", fmt.Sprintf("http://127.0.0.1:%d {", sitePort),
	).Replace(block)
	caddyMu.Lock()
	defer caddyMu.Unlock()
	t.Cleanup(func() { stopCaddy(t) })
	if err := loadConfig(t, adaptCaddyfile(t, src)); err != nil {
		t.Fatalf("loading: %v\n%s", err, src)
	}
	waitListening(t, metricsPort)
	site := &caddyServer{t: t, port: sitePort, base: fmt.Sprintf("http://127.0.0.1:%d", sitePort)}
	site.get("/") // one decision, so the families have samples
	m := scrapeMetrics(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
	if _, ok := m.families["caddy_rate_limit_requests_total"]; !ok {
		t.Errorf("no caddy_rate_limit_requests_total on the metrics listener")
	}
}

// TestMetricsOneLabelSet: a caddy-ratelimit zone config and a Tollgate
// policy config, side by side, export the same families with the same
// labels: requests_total{policy, decision} and declined_requests_total{zone}
// for both, the zone label holding the policy's name; no key label.
func TestMetricsOneLabelSet(t *testing.T) {
	site := `
	handle /metrics {
		metrics
	}
	handle /z {
		rate_limit {
			zone ls_zone {
				key static
				events 1
				window 1h
			}
		}
		respond "ok"
	}
	handle /p {
		rate_limit {
			policy ls_policy {
				key static
				limit 1
				window 1h
			}
		}
		respond "ok"
	}`
	s := startCaddy(t, "", site, nil)
	before := scrapeMetrics(t, s.base+"/metrics")
	for _, path := range []string{"/z", "/p"} {
		if c := s.statuses(3, path); c[200] != 1 || c[429] != 2 {
			t.Fatalf("%s: %v", path, c)
		}
	}
	m := scrapeMetrics(t, s.base+"/metrics")
	for _, name := range []string{"ls_zone", "ls_policy"} {
		if got := m.delta(before, "caddy_rate_limit_requests_total", "policy", name, "decision", "denied"); got != 2 {
			t.Errorf("requests_total{policy=%s, decision=denied} = %v, want 2", name, got)
		}
		if got := m.delta(before, "caddy_rate_limit_declined_requests_total", "zone", name); got != 2 {
			t.Errorf("declined_requests_total{zone=%s} = %v, want 2", name, got)
		}
	}
	for name, want := range map[string][]string{
		"caddy_rate_limit_requests_total":          {"decision", "policy"},
		"caddy_rate_limit_declined_requests_total": {"zone"},
	} {
		for _, series := range m.families[name].GetMetric() {
			var got []string
			for _, lp := range series.Label {
				got = append(got, lp.GetName())
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("%s series with labels %v, want %v", name, got, want)
			}
		}
	}
}
