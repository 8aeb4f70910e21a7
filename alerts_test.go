package tollgate

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"

	"github.com/tollgate/caddy-tollgate/metrics"
)

// alertRules is the Prometheus rule file format, as far as alerts use it.
type alertRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// promqlFunctions are the PromQL functions and aggregations the rules may
// use.
var promqlFunctions = []string{
	"sum", "max", "min", "avg", "count", "topk", "bottomk", "quantile",
	"rate", "irate", "increase", "delta", "histogram_quantile", "abs", "clamp_min", "clamp_max", "absent", "vector", "time",
}

var (
	// callPattern finds function calls and aggregations: name( or name by (.
	callPattern = regexp.MustCompile(`\b([a-z_]+)\s*(?:\(|\s+by\s*\()`)
	// rangePattern finds range selectors.
	rangePattern = regexp.MustCompile(`\[([^\]]*)\]`)
	// templateLabel finds {{ $labels.x }} in annotations.
	templateLabel = regexp.MustCompile(`\{\{\s*\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
	// sentenceEnd ends a sentence inside a description.
	sentenceEnd = regexp.MustCompile(`[.?!:]\s`)
	// comparison is a filtering comparison at the end of an alert.
	comparison = regexp.MustCompile(`(>|<|==|!=|>=|<=)\s*[0-9.]+\s*$`)
)

// requiredAlerts are the situations the rules must cover.
var requiredAlerts = map[string]string{
	"TollgateTenantNearLimit":    "caddy_rate_limit_tenant_near_limit_total",
	"TollgatePolicyNearLimit":    "caddy_rate_limit_near_limit_total",
	"TollgateDenialShareHigh":    "caddy_rate_limit_requests_total",
	"TollgateFailMode":           "caddy_rate_limit_requests_total",
	"TollgateBreakerOpen":        "caddy_rate_limit_breaker_open",
	"TollgateRedisErrors":        "caddy_rate_limit_redis_calls_total",
	"TollgateMeteredCostMissing": "caddy_rate_limit_cost_missing_total",
}

// refusedWith429 classifies every value of the decision label: whether
// the policy answered the request 429 (what TollgateDenialShareHigh
// counts). A new decision must be classified here.
var refusedWith429 = map[string]bool{
	"allowed":          false,
	"denied":           true,
	"shadow_denied":    false, // admitted: shadow mode refuses nothing
	"failed_open":      false,
	"failed_closed":    true,
	"fallback_allowed": false,
	"fallback_denied":  true,
	"delayed":          false, // admitted after its turn
	"penalty":          true,  // refused by the penalty box
	"shed":             false, // protect's 503, under policy "protect"
}

// decisionMatcher finds the decision=~"..." matcher of an expression.
var decisionMatcher = regexp.MustCompile(`decision=~"([^"]*)"`)

// TestAlertRules: dashboards/alerts.yml is a valid Prometheus rule file
// whose every alert has a severity, a summary and a description someone on
// call can act on, uses only metrics, labels and label values the code
// exports, and fills its templates with labels its expression keeps. With
// promtool installed it also passes `promtool check rules` and the unit
// tests of dashboards/alerts_test.yml.
func TestAlertRules(t *testing.T) {
	raw, err := os.ReadFile("dashboards/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules alertRules
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatalf("dashboards/alerts.yml: %v", err)
	}
	if len(rules.Groups) == 0 {
		t.Fatal("no rule groups")
	}
	seen := map[string]bool{}
	for _, g := range rules.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("group %q: needs a name and rules", g.Name)
		}
		for _, r := range g.Rules {
			where := r.Alert
			switch {
			case r.Alert == "" || !strings.HasPrefix(r.Alert, "Tollgate"):
				t.Errorf("rule %q: an alert named Tollgate...", r.Alert)
			case seen[r.Alert]:
				t.Errorf("%s: defined twice", where)
			}
			seen[r.Alert] = true
			if !slices.Contains([]string{"critical", "warning", "info"}, r.Labels["severity"]) {
				t.Errorf("%s: severity %q, want critical, warning or info", where, r.Labels["severity"])
			}
			if r.For != "" {
				if _, err := model.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for %q: %v", where, r.For, err)
				}
			}
			for k := range r.Annotations {
				if k != "summary" && k != "description" {
					t.Errorf("%s: unexpected annotation %q", where, k)
				}
			}
			if s := r.Annotations["summary"]; s == "" || len(s) > 100 {
				t.Errorf("%s: summary %q: want one line", where, s)
			}
			// What happened, what it means for clients, where to look.
			if d := r.Annotations["description"]; len(d) < 250 || len(sentenceEnd.FindAllString(d, -1)) < 2 {
				t.Errorf("%s: description too short for someone on call: %q", where, d)
			}
			checkPromQLShape(t, where, r.Expr)
			if r.Alert == "TollgateDenialShareHigh" {
				checkDenialShare(t, where, r.Expr)
			}
			labels := checkExprMetrics(t, where, r.Expr)
			if m := requiredAlerts[r.Alert]; m != "" && !strings.Contains(r.Expr, m) {
				t.Errorf("%s: does not use %s", where, m)
			}
			// Templates may only use labels the expression keeps.
			for _, ann := range r.Annotations {
				for _, m := range templateLabel.FindAllStringSubmatch(ann, -1) {
					if !slices.Contains(labels, m[1]) {
						t.Errorf("%s: annotation uses $labels.%s, which the expression drops (keeps %v)", where, m[1], labels)
					}
				}
			}
		}
	}
	for name := range requiredAlerts {
		if !seen[name] {
			t.Errorf("no alert %s", name)
		}
	}

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool not installed: not running promtool check rules / test rules")
		return
	}
	for _, args := range [][]string{{"check", "rules", "dashboards/alerts.yml"}, {"test", "rules", "dashboards/alerts_test.yml"}} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// checkDenialShare checks that the denial share's numerator selects
// exactly the decisions answered 429, every one of them.
func checkDenialShare(t *testing.T, where, expr string) {
	t.Helper()
	m := decisionMatcher.FindStringSubmatch(expr)
	if m == nil {
		t.Errorf("%s: no decision=~ matcher", where)
		return
	}
	re, err := regexp.Compile("^(?:" + m[1] + ")$")
	if err != nil {
		t.Errorf("%s: decision=~%q: %v", where, m[1], err)
		return
	}
	for _, d := range metrics.DecisionNames() {
		refused, ok := refusedWith429[d]
		if !ok {
			t.Errorf("decision %q: classify it in refusedWith429", d)
			continue
		}
		if re.MatchString(d) != refused {
			t.Errorf("%s: decision %q counted: %v, want %v (answered 429 or not)", where, d, re.MatchString(d), refused)
		}
	}
}

// checkPromQLShape checks what a regular expression can: balanced
// brackets outside strings, known functions, valid range durations, and a
// comparison that makes the expression an alert condition.
func checkPromQLShape(t *testing.T, where, expr string) {
	t.Helper()
	var stack []rune
	inString := false
	pairs := map[rune]rune{')': '(', '}': '{', ']': '['}
	for i, c := range expr {
		switch {
		case c == '"' && (i == 0 || expr[i-1] != '\\'):
			inString = !inString
		case inString:
		case c == '(' || c == '{' || c == '[':
			stack = append(stack, c)
		case c == ')' || c == '}' || c == ']':
			if len(stack) == 0 || stack[len(stack)-1] != pairs[c] {
				t.Errorf("%s: unbalanced %q at %d", where, c, i)
				return
			}
			stack = stack[:len(stack)-1]
		}
	}
	if len(stack) > 0 || inString {
		t.Errorf("%s: unclosed %q", where, stack)
	}
	for _, m := range callPattern.FindAllStringSubmatch(expr, -1) {
		if name := m[1]; name != "by" && name != "without" && name != "and" && name != "or" && name != "unless" && !slices.Contains(promqlFunctions, name) {
			t.Errorf("%s: unknown function %q", where, name)
		}
	}
	for _, m := range rangePattern.FindAllStringSubmatch(expr, -1) {
		if _, err := model.ParseDuration(m[1]); err != nil {
			t.Errorf("%s: range [%s]: %v", where, m[1], err)
		}
	}
	if !comparison.MatchString(strings.TrimSpace(expr)) && !strings.Contains(expr, "\nand\n") {
		t.Errorf("%s: the expression does not end with a comparison: it would fire on any value", where)
	}
}

// checkExprMetrics checks the metric names, labels and label values of
// expr against the catalog, as the dashboard test does, and returns the
// labels the expression keeps: those of every `by (...)` clause.
func checkExprMetrics(t *testing.T, where, expr string) []string {
	t.Helper()
	var labels []string
	n := 0
	for _, m := range selectorPattern.FindAllStringSubmatch(expr, -1) {
		n++
		family, info, ok := familyOf(m[1])
		if !ok {
			t.Errorf("%s: %s is not a metric Tollgate exports", where, m[1])
			continue
		}
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
	if n == 0 {
		t.Errorf("%s: uses no Tollgate metric", where)
	}
	var kept []string
	for i, m := range groupingPattern.FindAllStringSubmatch(expr, -1) {
		var by []string
		for _, l := range strings.Split(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				by = append(by, l)
				if !slices.Contains(labels, l) {
					t.Errorf("%s: grouping by %q, which none of the expression's metrics has", where, l)
				}
			}
		}
		if i == 0 {
			kept = by
		} else {
			kept = slices.DeleteFunc(kept, func(l string) bool { return !slices.Contains(by, l) })
		}
	}
	return kept
}
