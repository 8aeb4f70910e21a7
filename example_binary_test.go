package tollgate

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestBinaryListModules: the built Caddy knows the module.
func TestBinaryListModules(t *testing.T) {
	out, err := exec.Command(caddyBinary(t), "list-modules").CombinedOutput()
	if err != nil {
		t.Fatalf("list-modules: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "http.handlers.rate_limit") {
		t.Errorf("list-modules does not list http.handlers.rate_limit:\n%s", out)
	}
}

// TestCaddyfileExample runs Caddyfile.example with the built binary, as
// the README tells a new user to, and checks tenants, tiers, quotas,
// smoothed webhooks and shadow.
func TestCaddyfileExample(t *testing.T) {
	bin := caddyBinary(t)
	port, admin := freePort(t), freePort(t)
	cmd := exec.Command(bin, "run", "--config", "Caddyfile.example")
	cmd.Env = append(os.Environ(),
		fmt.Sprintf("TOLLGATE_PORT=%d", port),
		fmt.Sprintf("TOLLGATE_ADMIN=127.0.0.1:%d", admin),
		"XDG_DATA_HOME="+t.TempDir(), "XDG_CONFIG_HOME="+t.TempDir())
	var logs syncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			t.Error("caddy did not stop on SIGTERM")
		}
		if t.Failed() {
			t.Logf("caddy output:\n%s", logs.String())
		}
	}()
	waitListening(t, port)
	s := &caddyServer{t: t, port: port, base: fmt.Sprintf("http://127.0.0.1:%d", port)}

	// alice (pro tier): 100 per minute on "api".
	r := s.get("/api/hello", "X-API-Key", "key-alice")
	if r.status != 200 || !strings.HasPrefix(r.body, "hello alice:") {
		t.Fatalf("alice: %d %q", r.status, r.body)
	}
	if got := r.header.Get("X-RateLimit-Limit"); got != "100" {
		t.Errorf("alice X-RateLimit-Limit = %q, want 100 (tier pro)", got)
	}
	// carol has no tier: 10 per minute, then a JSON 429.
	admitted := 0
	var last response
	for range 12 {
		last = s.get("/api/hello", "X-API-Key", "key-carol")
		if last.status == 200 {
			admitted++
		}
	}
	if admitted != 10 || last.status != 429 || !strings.Contains(last.body, `"error":"rate_limited"`) {
		t.Errorf("carol: admitted %d (want 10), last %d %q", admitted, last.status, last.body)
	}
	// No API key: missing_tenant deny.
	if r := s.get("/api/hello"); r.status != 429 {
		t.Errorf("no key: %d, want 429", r.status)
	}
	// The monthly quota (New York months): carol used 10 of her 1000
	// (her 429s were not charged), alice 1 of her 100000.
	s.admin = fmt.Sprintf("127.0.0.1:%d", admin)
	for tenant, left := range map[string]float64{"carol": 990, "alice": 99999} {
		u := adminPolicy(t, s.adminOK("GET", "/rate_limit/usage?tenant="+tenant+"&policy=monthly", ""), "monthly")
		if u["calendar"] != "month America/New_York" || u["remaining"] != left {
			t.Errorf("%s monthly usage: %v, want %v left", tenant, u, left)
		}
	}
	// Webhooks are smoothed: four at once pass at 0, 0.5, 1 and 1.5s, each
	// body saying how long it waited.
	hooks := make([]timedResponse, 4)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range hooks {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodGet, s.base+"/webhooks/ping", nil)
			req.Header.Set("X-API-Key", "key-carol")
			hooks[i] = doTimed(&http.Client{Transport: &http.Transport{}}, req, t0)
		})
	}
	wg.Wait()
	slices.SortFunc(hooks, func(a, b timedResponse) int { return int(a.elapsed - b.elapsed) })
	for k, h := range hooks {
		turn := time.Duration(k) * 500 * time.Millisecond
		if h.err != nil || h.status != 200 || !strings.HasPrefix(h.body, "webhook for carol passed after ") {
			t.Fatalf("webhook %d: %d %q %v", k, h.status, h.body, h.err)
		}
		if h.elapsed < turn || h.elapsed > hooks[0].elapsed+turn+lateTolerance {
			t.Errorf("webhook %d passed after %s, want at its turn %s", k, h.elapsed, turn)
		}
	}
	if hooks[0].body != "webhook for carol passed after 0s\n" {
		t.Errorf("first webhook: %q", hooks[0].body)
	}

	// The shadow policy next_quota (5/min) never blocked carol's first
	// 10; its would-deny lines are in the log.
	deadline := time.Now().Add(2 * time.Second)
	for !strings.Contains(logs.String(), "rate limit would deny") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), "rate limit would deny") {
		t.Error("no 'rate limit would deny' log line from the shadow policy")
	}
}
