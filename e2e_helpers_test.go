package tollgate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// caddyMu serializes tests that run Caddy in-process: Caddy's running
// config is process-global.
var caddyMu sync.Mutex

// freePort returns a loopback TCP port that is free and that no other
// server of this test process (Redis included) was given: the kernel may
// hand the port it just released to the next bind, so a Caddy's site and
// its admin endpoint could otherwise get the same one.
func freePort(t testing.TB) int {
	t.Helper()
	return redistest.FreePort(t)
}

// adaptCaddyfile turns a Caddyfile into JSON, failing the test on errors
// or warnings.
func adaptCaddyfile(t testing.TB, src string) []byte {
	t.Helper()
	cfg, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v\n%s", err, src)
	}
	for _, w := range warnings {
		t.Logf("adapt warning: %s:%d: %s", w.File, w.Line, w.Message)
	}
	return cfg
}

// caddyServer is a Caddy running in this process with one HTTP site.
type caddyServer struct {
	t    testing.TB
	port int
	base string
	// admin is the admin endpoint's address ("" = admin off).
	admin string
}

// startCaddy runs site (a Caddyfile site body) on a free loopback port,
// with global options globals. The config is unloaded when the test ends.
// Use {PORT} in site to refer to the port. extra, when set, edits the
// adapted JSON before it is loaded.
func startCaddy(t testing.TB, globals, site string, extra func(cfg map[string]any)) *caddyServer {
	t.Helper()
	return startCaddyWith(t, "", globals, site, extra)
}

// startCaddyAdmin is startCaddy with Caddy's admin endpoint on a free
// loopback port; s.admin is its address.
func startCaddyAdmin(t testing.TB, globals, site string, extra func(cfg map[string]any)) *caddyServer {
	t.Helper()
	return startCaddyWith(t, fmt.Sprintf("127.0.0.1:%d", freePort(t)), globals, site, extra)
}

func startCaddyWith(t testing.TB, admin, globals, site string, extra func(cfg map[string]any)) *caddyServer {
	t.Helper()
	caddyMu.Lock()
	t.Cleanup(caddyMu.Unlock)
	s := &caddyServer{t: t, port: freePort(t), admin: admin}
	s.base = fmt.Sprintf("http://127.0.0.1:%d", s.port)
	t.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			t.Errorf("stopping caddy: %v", err)
		}
	})
	s.load(globals, site, extra)
	return s
}

// load (re)loads the server's config: a reload when one is running.
func (s *caddyServer) load(globals, site string, extra func(cfg map[string]any)) {
	s.t.Helper()
	if globals == "" {
		// Keep test output readable; tests that read logs set their own.
		globals = "\tlog {\n\t\toutput discard\n\t}"
	}
	admin := "off"
	if s.admin != "" {
		admin = s.admin
	}
	src := fmt.Sprintf("{\n\tadmin "+admin+"\n\tpersist_config off\n\tauto_https off\n%s\n}\n\nhttp://127.0.0.1:%d {\n%s\n}\n",
		globals, s.port, strings.ReplaceAll(site, "{PORT}", fmt.Sprint(s.port)))
	cfg := adaptCaddyfile(s.t, src)
	if extra != nil {
		var m map[string]any
		if err := json.Unmarshal(cfg, &m); err != nil {
			s.t.Fatal(err)
		}
		extra(m)
		var err error
		if cfg, err = json.Marshal(m); err != nil {
			s.t.Fatal(err)
		}
	}
	if err := caddy.Load(cfg, true); err != nil {
		s.t.Fatalf("loading config: %v\n%s", err, src)
	}
	// Keep-alive connections to the previous config's server are being
	// closed; a request on one could see "connection reset by peer".
	testClient.CloseIdleConnections()
	waitListening(s.t, s.port)
}

func waitListening(t testing.TB, port int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 100*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("nothing listening on port %d", port)
}

var testClient = &http.Client{
	Timeout: 10 * time.Second,
	Transport: &http.Transport{
		MaxIdleConnsPerHost: 64,
	},
}

// response is what the tests look at in an HTTP answer.
type response struct {
	status int
	header http.Header
	body   string
}

// get sends a GET to path with header pairs ("Name", "value", ...).
func (s *caddyServer) get(path string, headerPairs ...string) response {
	s.t.Helper()
	return s.do(context.Background(), path, headerPairs...)
}

func (s *caddyServer) do(ctx context.Context, path string, headerPairs ...string) response {
	s.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.base+path, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	for i := 0; i+1 < len(headerPairs); i += 2 {
		req.Header.Set(headerPairs[i], headerPairs[i+1])
	}
	res, err := testClient.Do(req)
	// Right after a config reload, the previous server may accept a new
	// connection and drop it before reading the request (no handler saw
	// it): retry those, on fresh connections.
	for retry := 0; err != nil && droppedBeforeRequest(err) && retry < 5; retry++ {
		time.Sleep(20 * time.Millisecond)
		testClient.CloseIdleConnections()
		res, err = testClient.Do(req)
	}
	if err != nil {
		s.t.Fatalf("GET %s: %v", path, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		s.t.Fatalf("reading body of %s: %v", path, err)
	}
	return response{status: res.StatusCode, header: res.Header, body: string(body)}
}

// statuses sends n GETs and counts the answers by status code.
func (s *caddyServer) statuses(n int, path string, headerPairs ...string) map[int]int {
	s.t.Helper()
	counts := make(map[int]int)
	for range n {
		counts[s.get(path, headerPairs...).status]++
	}
	return counts
}

// eventRecorder is a test-only caddyevents handler that keeps every event.
type eventRecorder struct{}

var (
	recordedMu     sync.Mutex
	recordedEvents []caddy.Event
)

func init() { caddy.RegisterModule(eventRecorder{}) }

func (eventRecorder) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "events.handlers.tollgate_test_recorder",
		New: func() caddy.Module { return new(eventRecorder) },
	}
}

func (eventRecorder) Handle(_ context.Context, e caddy.Event) error {
	recordedMu.Lock()
	defer recordedMu.Unlock()
	recordedEvents = append(recordedEvents, e)
	return nil
}

var _ caddyevents.Handler = eventRecorder{}

// subscribeRecorder adds an events app that sends eventName to the
// recorder.
func subscribeRecorder(eventName string) func(cfg map[string]any) {
	return func(cfg map[string]any) {
		apps := cfg["apps"].(map[string]any)
		apps["events"] = map[string]any{
			"subscriptions": []any{map[string]any{
				"events":   []any{eventName},
				"handlers": []any{map[string]any{"handler": "tollgate_test_recorder"}},
			}},
		}
	}
}

func takeRecordedEvents() []caddy.Event {
	recordedMu.Lock()
	defer recordedMu.Unlock()
	ev := recordedEvents
	recordedEvents = nil
	return ev
}

// waitFor polls cond for up to 10 seconds and fails the test if it never
// holds.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// droppedBeforeRequest reports whether err is a connection the server
// reset or closed without answering.
func droppedBeforeRequest(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF)
}
