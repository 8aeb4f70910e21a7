package portal

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/tollgate/caddy-tollgate/report"
)

// The page: one HTML document, its style inline (no CDN, no font, no
// script): the numbers, a bar chart per policy drawn as SVG on the
// server, and the last denials. Readable on a phone (one column), in
// dark mode, and by screen readers (the chart has a title and a
// description, and its numbers are in the text).

//go:embed assets/page.css
var pageCSS string

var pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{
	"css":     func() template.CSS { return template.CSS(pageCSS) },
	"chart":   chartOf,
	"num":     formatNum,
	"seconds": formatSeconds,
	"deref":   func(p *int64) int64 { return *p },
	"dur":     formatWindow,
	"derefF":  func(p *float64) float64 { return *p },
	"total": func(s *report.Series) int64 {
		var n int64
		for _, p := range s.Points {
			n += p.Admitted
		}
		return n
	},
	"totalDenied": func(s *report.Series) int64 {
		var n int64
		for _, p := range s.Points {
			n += p.Denied
		}
		return n
	},
}).Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Your rate limits</title>
<style>{{css}}</style>
</head>
<body>
<main>
<h1>Your rate limits</h1>
<p class="meta">Tenant <strong id="tenant">{{.Tenant}}</strong> · as of <time datetime="{{.GeneratedAt}}">{{.GeneratedAt}}</time></p>
{{range .Policies}}{{$name := .Policy.Policy}}
<section class="policy" id="policy-{{.Policy.Policy}}" aria-labelledby="h-{{.Policy.Policy}}">
<h2 id="h-{{.Policy.Policy}}">{{.Policy.Policy}}
{{if .Unlimited}}<span class="badge ok">unlimited</span>{{else if and .Remaining (eq (deref .Remaining) 0)}}<span class="badge out">limit reached</span>{{else if .NearLimit}}<span class="badge near">near the limit</span>{{else}}<span class="badge ok">ok</span>{{end}}</h2>
<p class="muted">{{.Why}}{{if .Window}}: {{num .Limit}} per {{dur .Window}}{{else if .Calendar}}: {{num .Limit}} per {{.Calendar}}{{end}}{{if .Burst}}, bursts up to {{num .Burst}}{{end}}.</p>
{{if not .Unlimited}}
<dl class="numbers">
<div><dt>Left now</dt><dd data-field="remaining">{{if .Remaining}}{{num (deref .Remaining)}}{{end}}</dd></div>
<div><dt>Out of</dt><dd data-field="capacity">{{num .Capacity}}</dd></div>
<div><dt>More in</dt><dd data-field="reset">{{if .Reset}}{{seconds (derefF .Reset)}}{{end}}</dd></div>
{{with .History}}<div><dt>Used, {{.Resolution}} points</dt><dd data-field="used">{{num (total .)}}</dd></div>
<div><dt>Denied</dt><dd data-field="denied">{{num (totalDenied .)}}</dd></div>{{end}}
</dl>
{{if .Remaining}}<meter min="0" max="{{.Capacity}}" value="{{deref .Remaining}}" aria-label="left of {{.Capacity}}">{{deref .Remaining}} left</meter>{{end}}
{{end}}
{{with .History}}{{with chart $name .}}{{$c := .}}
<figure>
<svg class="chart" viewBox="0 0 {{.W}} {{.H}}" role="img" aria-labelledby="t-{{.ID}} d-{{.ID}}">
<title id="t-{{.ID}}">{{.Title}}</title>
<desc id="d-{{.ID}}">{{.Desc}}</desc>
<line class="axis" x1="0" y1="{{.Base}}" x2="{{.W}}" y2="{{.Base}}"/>
{{range .Bars}}<rect class="admitted" x="{{.X}}" y="{{.Y}}" width="{{.BW}}" height="{{.BH}}" data-at="{{.At}}" data-admitted="{{.Admitted}}" data-denied="{{.Denied}}"><title>{{.At}}: {{.Admitted}} used{{if .Denied}}, {{.Denied}} denied{{end}}</title></rect>{{if .Denied}}<rect class="denied" x="{{.X}}" y="{{$c.Base}}" width="{{.BW}}" height="4"/>{{end}}
{{end}}
<text x="0" y="{{.H}}">{{.FromLabel}}</text><text x="{{.W}}" y="{{.H}}" text-anchor="end">{{.ToLabel}}</text><text x="0" y="10">{{.MaxLabel}}</text>
</svg>
<figcaption><span class="key admitted"></span> used per {{.Step}} · <span class="key denied"></span> minutes with denials</figcaption>
</figure>
{{end}}{{end}}
</section>
{{else}}
<p>No rate limit applies to you here.</p>
{{end}}
<section aria-labelledby="h-denials">
<h2 id="h-denials">Your last denials</h2>
{{if .Denials}}
<table>
<thead><tr><th scope="col">When</th><th scope="col">Policy</th><th scope="col">Limit</th><th scope="col">Retry after</th><th scope="col">Why</th></tr></thead>
<tbody>{{range .Denials}}<tr><td><time datetime="{{.At}}">{{.At}}</time></td><td>{{.Policy}}</td><td>{{num .Limit}}</td><td>{{.RetryAfter}} s</td><td>{{if eq .Reason "penalty"}}penalty box{{else}}over the limit{{end}}</td></tr>{{end}}</tbody>
</table>
{{else if .DenialsKept}}
<p class="muted">None recorded.</p>
{{else}}
<p class="muted">Denials are not recorded here.</p>
{{end}}
</section>
<p class="muted">This page is also JSON: ask with <code>Accept: application/json</code>. Query: <code>?policy=</code>, <code>&amp;range=</code> (e.g. 1h, 48h, 30d), <code>&amp;resolution=</code> (1m, 1h).</p>
</main>
</body>
</html>
`))

var errorTemplate = template.Must(template.New("error").Funcs(template.FuncMap{
	"css": func() template.CSS { return template.CSS(pageCSS) },
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Your rate limits: {{.Status}}</title><style>{{css}}</style></head>
<body><main><h1>Your rate limits</h1><p role="alert">{{.Message}}</p></main></body></html>
`))

// writePage renders v, whole before anything is written: a template
// error is a 500, never half a page.
func writePage(w http.ResponseWriter, r *http.Request, v *View) error {
	var buf bytes.Buffer
	if err := pageTemplate.Execute(&buf, v); err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("rendering the usage page: %w", err))
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return nil
	}
	_, err := w.Write(buf.Bytes())
	return err
}

func writeErrorPage(w http.ResponseWriter, r *http.Request, status int, msg string) error {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if r.Method == http.MethodHead {
		return nil
	}
	return errorTemplate.Execute(w, map[string]any{"Status": status, "Message": msg})
}

// chart is a series drawn as bars.
type chart struct {
	ID, Title, Desc    string
	W, H, Base         int
	Bars               []bar
	FromLabel, ToLabel string
	MaxLabel, Step     string
}

type bar struct {
	X, Y, BW, BH     float64
	At               string
	Admitted, Denied int64
}

// chartOf draws s: one bar per point, scaled to the largest.
func chartOf(id string, s *report.Series) *chart {
	if s == nil || len(s.Points) == 0 {
		return nil
	}
	const w, h, base = 600, 160, 140
	c := &chart{ID: id, W: w, H: h, Base: base, FromLabel: shortTime(s.From), ToLabel: shortTime(s.To), Step: "minute"}
	if s.Resolution == "1h" {
		c.Step = "hour"
	}
	var most, used, denied int64
	for _, p := range s.Points {
		most = max(most, p.Admitted)
		used += p.Admitted
		denied += p.Denied
	}
	c.MaxLabel = "peak " + formatNum(most)
	c.Title = fmt.Sprintf("Use per %s from %s to %s", c.Step, s.From, s.To)
	c.Desc = fmt.Sprintf("%d points; %s used in all, peak %s in one %s; %s denied.", len(s.Points), formatNum(used), formatNum(most), c.Step, formatNum(denied))
	bw := float64(w) / float64(len(s.Points))
	for i, p := range s.Points {
		bh := 0.0
		if most > 0 && p.Admitted > 0 {
			bh = max(1, float64(p.Admitted)/float64(most)*float64(base-12))
		}
		c.Bars = append(c.Bars, bar{X: float64(i) * bw, Y: float64(base) - bh, BW: max(bw-0.5, 0.5), BH: bh,
			At: p.At, Admitted: p.Admitted, Denied: p.Denied})
	}
	return c
}

func shortTime(s string) string {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return s
	}
	return t.UTC().Format("Jan 2 15:04 UTC")
}

// formatNum writes n with thin thousands separators.
func formatNum(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteRune(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func formatSeconds(f float64) string {
	d := time.Duration(f * float64(time.Second)).Round(time.Second)
	if d < time.Second && f > 0 {
		return "under a second"
	}
	return d.String()
}

// formatWindow writes a window as people do: "1h", "90s", "1h30m", "1d".
func formatWindow(s string) string {
	d, err := time.ParseDuration(s)
	if err != nil {
		return s
	}
	if d >= 24*time.Hour && d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	}
	out := d.String()
	if strings.HasSuffix(out, "m0s") {
		out = strings.TrimSuffix(out, "0s")
	}
	if strings.HasSuffix(out, "h0m") {
		out = strings.TrimSuffix(out, "0m")
	}
	return out
}
