package tollgate

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate/caddy-tollgate/metrics"
)

// targetLabels are attached by Prometheus to every scraped series.
var targetLabels = []string{"instance", "job"}

// knownLabelValues are the values a dashboard may match for the labels
// whose values Tollgate fixes.
var knownLabelValues = map[string][]string{
	"decision": metrics.DecisionNames(),
	"source":   metrics.SourceNames(),
	"result":   {"ok", "error", "timeout", "noscript"},
	"script":   metrics.RedisScripts(),
	"event":    metrics.LeaseEventNames(),
}

var (
	// selectorPattern finds a metric name and its optional {matchers}.
	selectorPattern = regexp.MustCompile(`\b(caddy_rate_limit_[a-z_]+)\b(\{[^}]*\})?`)
	matcherPattern  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"`)
	groupingPattern = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	labelValuesCall = regexp.MustCompile(`label_values\((?:[^,()]|\([^)]*\))*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)`)
)

// familyOf maps a series name in PromQL to its family in the catalog:
// histograms are queried through _bucket, _sum and _count.
func familyOf(series string) (string, metrics.Family, bool) {
	if info, ok := metrics.Catalog()[series]; ok {
		return series, info, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(series, suffix)
		if !ok {
			continue
		}
		if info, ok := metrics.Catalog()[base]; ok && info.Kind == "histogram" {
			return base, info, true
		}
	}
	return "", metrics.Family{}, false
}

// dashboardQueries returns every PromQL expression of the dashboard
// (panel targets and templating queries), with where it was found.
func dashboardQueries(v any, path string, out map[string]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, child := range v {
			p := path + "." + k
			if s, ok := child.(string); ok && (k == "expr" || (k == "query" && strings.Contains(s, "("))) {
				out[p] = s
				continue
			}
			dashboardQueries(child, p, out)
		}
	case []any:
		for i, child := range v {
			dashboardQueries(child, path+"["+strconv.Itoa(i)+"]", out)
		}
	}
}

// TestDashboardMatchesMetrics: every metric, label and label value the
// Grafana dashboard queries is one metrics.go exports, and every exported
// family has a panel, so the dashboard cannot drift from the code.
func TestDashboardMatchesMetrics(t *testing.T) {
	raw, err := os.ReadFile("dashboards/tollgate.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboards/tollgate.json: %v", err)
	}
	for _, k := range []string{"title", "uid", "panels", "templating", "schemaVersion"} {
		if dash[k] == nil {
			t.Errorf("dashboard has no %q", k)
		}
	}

	queries := map[string]string{}
	dashboardQueries(dash, "$", queries)
	if len(queries) < 10 {
		t.Fatalf("found only %d queries", len(queries))
	}
	used := map[string]bool{}
	for where, expr := range queries {
		var labels []string // labels of the families in this expression
		for _, m := range selectorPattern.FindAllStringSubmatch(expr, -1) {
			family, info, ok := familyOf(m[1])
			if !ok {
				t.Errorf("%s: %s is not a metric Tollgate exports", where, m[1])
				continue
			}
			used[family] = true
			allowed := append(slices.Clone(info.Labels), targetLabels...)
			if strings.HasSuffix(m[1], "_bucket") && m[1] != family {
				allowed = append(allowed, "le")
			}
			labels = append(labels, allowed...)
			for _, mm := range matcherPattern.FindAllStringSubmatch(m[2], -1) {
				name, op, value := mm[1], mm[2], mm[3]
				if !slices.Contains(allowed, name) {
					t.Errorf("%s: %s has no label %q (labels: %v)", where, m[1], name, info.Labels)
					continue
				}
				checkLabelValue(t, where, name, op, value)
			}
		}
		for _, m := range groupingPattern.FindAllStringSubmatch(expr, -1) {
			for _, l := range strings.Split(m[1], ",") {
				if l = strings.TrimSpace(l); l != "" && !slices.Contains(labels, l) {
					t.Errorf("%s: grouping by %q, which none of the expression's metrics has", where, l)
				}
			}
		}
		for _, m := range labelValuesCall.FindAllStringSubmatch(expr, -1) {
			if !slices.Contains(labels, m[1]) {
				t.Errorf("%s: label_values of %q, which the metric does not have", where, m[1])
			}
		}
	}
	for family := range metrics.Catalog() {
		if !used[family] {
			t.Errorf("no panel shows %s", family)
		}
	}
	checkDashboardLayout(t, dash)
}

// checkLabelValue checks an equality matcher's value, or each
// alternative of a regex matcher, against the label's known values.
func checkLabelValue(t *testing.T, where, name, op, value string) {
	t.Helper()
	known, ok := knownLabelValues[name]
	if !ok || strings.Contains(value, "$") {
		return
	}
	if op == "=" || op == "!=" {
		if !slices.Contains(known, value) {
			t.Errorf("%s: %s=%q is not a value Tollgate exports (%v)", where, name, value, known)
		}
		return
	}
	for _, alt := range strings.Split(value, "|") {
		re, err := regexp.Compile("^(?:" + alt + ")$")
		if err != nil {
			t.Errorf("%s: %s matcher %q: %v", where, name, alt, err)
			continue
		}
		if !slices.ContainsFunc(known, re.MatchString) {
			t.Errorf("%s: %s matcher %q matches no value Tollgate exports (%v)", where, name, alt, known)
		}
	}
}

// checkDashboardLayout: unique panel ids, every panel has a datasource
// and a title, and no two panels overlap on the grid.
func checkDashboardLayout(t *testing.T, dash map[string]any) {
	type rect struct{ x, y, w, h float64 }
	ids := map[float64]bool{}
	var rects []rect
	var titles []string
	for _, p := range dash["panels"].([]any) {
		panel := p.(map[string]any)
		id, _ := panel["id"].(float64)
		if ids[id] {
			t.Errorf("panel id %v is used twice", id)
		}
		ids[id] = true
		title, _ := panel["title"].(string)
		if title == "" {
			t.Errorf("panel %v has no title", id)
		}
		titles = append(titles, title)
		if panel["type"] != "row" && panel["datasource"] == nil {
			t.Errorf("panel %q has no datasource", title)
		}
		g := panel["gridPos"].(map[string]any)
		r := rect{g["x"].(float64), g["y"].(float64), g["w"].(float64), g["h"].(float64)}
		if r.x+r.w > 24 {
			t.Errorf("panel %q is wider than the grid", title)
		}
		for i, o := range rects {
			if r.x < o.x+o.w && o.x < r.x+r.w && r.y < o.y+o.h && o.y < r.y+r.h {
				t.Errorf("panels %q and %q overlap", title, titles[i])
			}
		}
		rects = append(rects, r)
	}
}
