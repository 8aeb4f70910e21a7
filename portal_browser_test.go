package tollgate

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// browserCaddyfile: the tenant's page on the built binary, embedded store.
const browserCaddyfile = `{
	admin 127.0.0.1:{ADMIN}
	auto_https off
}
:{PORT} {
	handle /limits {
		rate_limit_usage
	}
	handle {
		rate_limit {
			tenant {http.request.header.X-Tenant}
			policy api {
				limit 10
				window 1h
			}
			policy burst {
				algorithm token_bucket
				limit 60
				window 1h
				burst 5
			}
		}
		respond "ok"
	}
}
`

// artifactDir is where browser tests leave their screenshots:
// $TOLLGATE_ARTIFACTS, else artifacts/ in the repository (ignored by git).
func artifactDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("TOLLGATE_ARTIFACTS")
	if dir == "" {
		dir = "artifacts"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// newBrowser starts headless Chromium (Debian's chromium, which the test
// command installs) for the test.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium not found (scripts/test.sh installs it: apt-get install chromium): %v", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.WindowSize(1200, 900))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	return ctx
}

// TestBrowserPortal drives the tenant's page in a real browser, with
// real traffic behind it on the built binary: the numbers on the page
// are the JSON's and the admin API's, the chart has the JSON's points,
// another tenant never appears, the page fits a phone's width, and it has
// no script. Screenshots go to artifactDir; with
// UPDATE_DOCS_SCREENSHOT=1 the desktop one also replaces
// docs/images/portal.png.
func TestBrowserPortal(t *testing.T) {
	p := startCaddyProcess(t, browserCaddyfile)
	p.caddyServer.admin = fmt.Sprintf("127.0.0.1:%d", p.admin)
	if c := p.statuses(12, "/", "X-Tenant", "alice"); c[200] != 5 || c[429] != 7 {
		// burst admits 5 at once (then one a minute): 5 pass, 7 are
		// denied by it.
		t.Fatalf("alice: %v", c)
	}
	if c := p.statuses(3, "/", "X-Tenant", "bob"); c[200] != 3 {
		t.Fatalf("bob: %v", c)
	}
	// The history is by minute: the JSON and the page below must be read
	// in the same minute for their bars to line up.
	if sec := time.Now().UTC().Second(); sec >= 45 {
		time.Sleep(time.Duration(61-sec) * time.Second)
	}
	r := p.request("GET", "/limits", "X-Tenant", "alice", "Accept", "application/json")
	var v struct {
		Policies []struct {
			Policy    string `json:"policy"`
			Remaining int64  `json:"remaining"`
			Capacity  int64  `json:"capacity"`
			History   struct {
				Points []struct {
					At               string `json:"at"`
					Admitted, Denied int64
				} `json:"points"`
			} `json:"history"`
		} `json:"policies"`
	}
	if err := json.Unmarshal([]byte(r.body), &v); err != nil || len(v.Policies) != 2 {
		t.Fatalf("JSON: %q %v", r.body, err)
	}
	admin := p.adminOK("GET", "/rate_limit/usage?tenant=alice&policy=api", "")
	if got := adminPolicy(t, admin, "api")["remaining"]; got != float64(v.Policies[0].Remaining) {
		t.Fatalf("admin API remaining %v, JSON %d", got, v.Policies[0].Remaining)
	}

	ctx := newBrowser(t)
	url := p.base + "/limits"
	load := func() {
		t.Helper()
		err := chromedp.Do(ctx,
			func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
				_, err := chromedp.Call(ctx, network.Enable, network.EnableParams{})
				if err == nil {
					_, err = chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"X-Tenant": "alice"}})
				}
				return chromedp.Void{}, err
			},
			chromedp.Navigate(url),
			chromedp.WaitVisible(chromedp.CSS("#tenant")),
		)
		if err != nil {
			t.Fatal(err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("%s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}
	eval := func(js string, out any) {
		t.Helper()
		raw, err := chromedp.Run(ctx, chromedp.Evaluate[json.RawMessage](js))
		if err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s: %s: %v", js, raw, err)
		}
	}
	shot := func(name string) []byte {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(artifactDir(t), name)
		if err := os.WriteFile(file, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", file)
		return png
	}

	load()
	if got := text("#tenant"); got != "alice" {
		t.Fatalf("tenant %q", got)
	}
	for _, pol := range v.Policies {
		sec := "#policy-" + pol.Policy + " "
		if got := text(sec + `[data-field="remaining"]`); got != strconv.FormatInt(pol.Remaining, 10) {
			t.Errorf("%s: page says %q left, JSON %d", pol.Policy, got, pol.Remaining)
		}
		if got := text(sec + `[data-field="capacity"]`); got != strconv.FormatInt(pol.Capacity, 10) {
			t.Errorf("%s: page says out of %q, JSON %d", pol.Policy, got, pol.Capacity)
		}
		var bars [][3]any
		eval(`Array.from(document.querySelectorAll("#policy-`+pol.Policy+` rect.admitted")).map(r => [r.dataset.at, +r.dataset.admitted, +r.dataset.denied])`, &bars)
		if len(bars) != len(pol.History.Points) {
			t.Fatalf("%s: %d bars, %d points", pol.Policy, len(bars), len(pol.History.Points))
		}
		for i, pt := range pol.History.Points {
			if want := [3]any{pt.At, float64(pt.Admitted), float64(pt.Denied)}; fmt.Sprint(bars[i]) != fmt.Sprint(want) {
				t.Errorf("%s: bar %d %v, point %v", pol.Policy, i, bars[i], want)
			}
		}
	}
	var body string
	eval(`document.documentElement.outerHTML`, &body)
	if !strings.HasSuffix(strings.TrimSpace(body), "</html>") || !strings.Contains(body, `id="h-denials"`) {
		t.Error("the page is not whole")
	}
	if strings.Contains(body, "bob") {
		t.Error("alice's page names bob")
	}
	if strings.Contains(body, "<script") {
		t.Error("the page has a script")
	}
	var scripts int
	eval(`document.scripts.length`, &scripts)
	if scripts != 0 {
		t.Errorf("%d scripts", scripts)
	}
	desktop := shot("portal-desktop.png")
	if os.Getenv("UPDATE_DOCS_SCREENSHOT") == "1" {
		if err := os.WriteFile(filepath.Join("docs", "images", "portal.png"), desktop, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// A phone: nothing wider than the screen.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile)); err != nil {
		t.Fatal(err)
	}
	load()
	var widths [2]float64
	eval(`[document.documentElement.scrollWidth, window.innerWidth]`, &widths)
	if widths[0] > widths[1] {
		t.Errorf("on a phone the page is %v px wide in a %v px viewport", widths[0], widths[1])
	}
	shot("portal-phone.png")
}
