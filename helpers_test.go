package tollgate

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

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
	t.Cleanup(func() { stopCaddy(t) })
	s.load(globals, site, extra)
	return s
}

// load (re)loads the server's config: a reload when one is running.
func (s *caddyServer) load(globals, site string, extra func(cfg map[string]any)) {
	s.t.Helper()
	if globals == "" {
		// The test's own log, shown when it fails; tests that read logs
		// set their own.
		globals = "\tlog {\n\t\toutput file " + testLogFile(s.t) + "\n\t}"
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
	if err := loadConfig(s.t, cfg); err != nil {
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

// newHTTPServer serves h on a free loopback port until the test ends and
// returns its address.
func newHTTPServer(t testing.TB, h http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// post sends a POST of a JSON body to path with header pairs.
func (s *caddyServer) post(path, body string, headerPairs ...string) response {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.base+path, strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return s.send(req, headerPairs...)
}

func (s *caddyServer) do(ctx context.Context, path string, headerPairs ...string) response {
	s.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.base+path, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	return s.send(req, headerPairs...)
}

// send sends req with header pairs and reads the whole answer.
func (s *caddyServer) send(req *http.Request, headerPairs ...string) response {
	s.t.Helper()
	path := req.URL.Path
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
		if req.GetBody != nil {
			req.Body, _ = req.GetBody()
		}
		res, err = testClient.Do(req)
	}
	if err != nil {
		s.t.Fatalf("%s %s: %v", req.Method, path, err)
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

// caddyProcess is the built cmd/caddy running as its own process.
type caddyProcess struct {
	t     *testing.T
	cmd   *exec.Cmd
	port  int
	admin int
	dir   string
	logs  *syncBuffer
	*caddyServer

	// exited is closed when the process has exited; exitErr is then its
	// Wait error. One goroutine waits on the process (see watch): a
	// second cmd.Wait would race with it.
	exited  chan struct{}
	exitErr error
}

// watch waits for the started process in the background.
func (p *caddyProcess) watch() {
	p.exited = make(chan struct{})
	go func() {
		p.exitErr = p.cmd.Wait()
		close(p.exited)
	}()
}

// waitExit waits up to d for the process to exit and returns its Wait
// error; ok is false when it was still running after d.
func (p *caddyProcess) waitExit(d time.Duration) (err error, ok bool) {
	select {
	case <-p.exited:
		return p.exitErr, true
	case <-time.After(d):
		return nil, false
	}
}

// hasExited reports whether the process has exited.
func (p *caddyProcess) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// startCaddyProcess runs the built binary with a Caddyfile in which
// {PORT} and {ADMIN} stand for the process's free ports. The process is
// stopped when the test ends; its output is logged if the test failed.
func startCaddyProcess(t *testing.T, caddyfile string) *caddyProcess {
	t.Helper()
	return startCaddyProcessEnv(t, nil, caddyfile)
}

// startCaddyProcessEnv is startCaddyProcess with env added to the
// process's environment.
func startCaddyProcessEnv(t *testing.T, env []string, caddyfile string) *caddyProcess {
	t.Helper()
	p := &caddyProcess{t: t, port: freePort(t), admin: freePort(t), dir: t.TempDir(), logs: new(syncBuffer)}
	p.caddyServer = &caddyServer{t: t, port: p.port, base: fmt.Sprintf("http://127.0.0.1:%d", p.port)}
	file := p.writeConfig(caddyfile)
	p.cmd = exec.Command(caddyBinary(t), "run", "--config", file, "--adapter", "caddyfile")
	p.cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+p.dir, "XDG_CONFIG_HOME="+p.dir, "HOME="+p.dir)
	p.cmd.Env = append(p.cmd.Env, env...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.watch()
	t.Cleanup(p.stop)
	waitListening(t, p.port)
	return p
}

func (p *caddyProcess) writeConfig(caddyfile string) string {
	p.t.Helper()
	src := strings.NewReplacer("{PORT}", fmt.Sprint(p.port), "{ADMIN}", fmt.Sprint(p.admin)).Replace(caddyfile)
	file := filepath.Join(p.dir, "Caddyfile")
	if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
		p.t.Fatal(err)
	}
	return file
}

func (p *caddyProcess) stop() {
	if !p.hasExited() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		if _, ok := p.waitExit(10 * time.Second); !ok {
			_ = p.cmd.Process.Kill()
			<-p.exited
			p.t.Error("caddy did not stop within 10s of SIGTERM")
		}
	}
	if p.t.Failed() {
		p.t.Logf("caddy on :%d output:\n%s", p.port, p.logs.String())
	}
}

var (
	buildOnce sync.Once
	builtPath string
	buildErr  error
)

// caddyBinary builds ./cmd/caddy once per test run, as a user would.
func caddyBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs cmd/caddy; skipped with -short")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tollgate-bin-")
		if err != nil {
			buildErr = err
			return
		}
		builtPath = filepath.Join(dir, "caddy")
		out, err := exec.Command("go", "build", "-o", builtPath, "./cmd/caddy").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/caddy: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtPath
}

func TestMain(m *testing.M) {
	// Caddy logs through one process-wide logger, stderr until a config
	// says otherwise: silence it, so that a failing test prints its own
	// logs (testLogFile) and not every test's.
	if err := silenceCaddy(); err != nil {
		fmt.Fprintln(os.Stderr, "silencing Caddy's logs:", err)
	}
	code := m.Run()
	if builtPath != "" {
		os.RemoveAll(filepath.Dir(builtPath))
	}
	os.Exit(code)
}

// syncBuffer is a bytes.Buffer safe for the process's output goroutines
// and the test to use at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startCaddyConfig runs the built binary on config (adapter "json" or
// "caddyfile"), in which {PORT}, {ADMIN} and {DIR} stand for the
// process's HTTP port, admin port and data directory. XDG_DATA_HOME is
// the data directory, so every process has its own instance ID and
// default storage.
func startCaddyConfig(t *testing.T, adapter, config string) *caddyProcess {
	t.Helper()
	p := &caddyProcess{t: t, port: freePort(t), admin: freePort(t), dir: t.TempDir(), logs: new(syncBuffer)}
	p.caddyServer = &caddyServer{t: t, port: p.port, base: fmt.Sprintf("http://127.0.0.1:%d", p.port)}
	src := strings.NewReplacer("{PORT}", strconv.Itoa(p.port), "{ADMIN}", strconv.Itoa(p.admin), "{DIR}", p.dir).Replace(config)
	file := filepath.Join(p.dir, "config."+adapter)
	if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"run", "--config", file}
	if adapter != "json" {
		args = append(args, "--adapter", adapter)
	}
	p.cmd = exec.Command(caddyBinary(t), args...)
	p.cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+p.dir, "XDG_CONFIG_HOME="+p.dir, "HOME="+p.dir,
		"CADDY_ADMIN=127.0.0.1:"+strconv.Itoa(p.admin))
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.watch()
	t.Cleanup(func() {
		if p.hasExited() && t.Failed() {
			t.Logf("caddy on :%d exited early; output:\n%s", p.port, p.logs.String())
		}
		p.stop()
	})
	waitListening(t, p.port)
	return p
}

// request sends method to path and returns the status and Retry-After.
func (p *caddyProcess) request(method, path string, headerPairs ...string) response {
	p.t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, p.base+path, nil)
	if err != nil {
		p.t.Fatal(err)
	}
	for i := 0; i+1 < len(headerPairs); i += 2 {
		req.Header.Set(headerPairs[i], headerPairs[i+1])
	}
	res, err := testClient.Do(req)
	if err != nil {
		p.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return response{status: res.StatusCode, header: res.Header, body: string(body)}
}

// expect asserts a status, and for 429 a Retry-After, like
// caddy-ratelimit's assert429Response (retryAfter < 0: any).
func (p *caddyProcess) expect(r response, status int, retryAfter int, what string) {
	p.t.Helper()
	if r.status != status {
		p.t.Fatalf("%s: status %d, want %d (body %q)", what, r.status, status, r.body)
	}
	if status != http.StatusTooManyRequests || retryAfter < 0 {
		return
	}
	got, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil {
		p.t.Fatalf("%s: Retry-After %q is not an integer", what, r.header.Get("Retry-After"))
	}
	if got != retryAfter {
		p.t.Fatalf("%s: Retry-After %d, want %d", what, got, retryAfter)
	}
}

// logLines returns the process's JSON log lines whose msg is msg.
func (p *caddyProcess) logLines(msg string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(p.logs.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// waitLogLines waits until at least n lines with msg were logged.
func (p *caddyProcess) waitLogLines(msg string, n int) []map[string]any {
	p.t.Helper()
	var lines []map[string]any
	deadline := time.Now().Add(5 * time.Second)
	for {
		if lines = p.logLines(msg); len(lines) >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(lines) < n {
		p.t.Fatalf("%d log lines %q, want at least %d", len(lines), msg, n)
	}
	return lines
}

// metrics scrapes the admin endpoint's /metrics.
func (p *caddyProcess) metrics() map[string]*dto.MetricFamily {
	p.t.Helper()
	res, err := testClient.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", p.admin))
	if err != nil {
		p.t.Fatal(err)
	}
	defer res.Body.Close()
	tp := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := tp.TextToMetricFamilies(res.Body)
	if err != nil {
		p.t.Fatal(err)
	}
	return fams
}

// metricValue is the value of the series of family name with exactly the
// given labels (a histogram: its sample count); ok is false when there
// is no such series.
func metricValue(fams map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	for _, m := range f.Metric {
		if len(m.Label) != len(labels) {
			continue
		}
		match := true
		for _, l := range m.Label {
			if labels[l.GetName()] != l.GetValue() {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

// execCaddy runs the built binary with args and returns its output.
func execCaddy(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(caddyBinary(t), args...)
	cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+t.TempDir(), "XDG_CONFIG_HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// sleepUntil sleeps until t.
func sleepUntil(t time.Time) { time.Sleep(time.Until(t)) }

// provisionHandler builds a Handler from JSON outside a running Caddy.
func provisionHandler(tb testing.TB, cfg string) *Handler {
	tb.Helper()
	var h Handler
	if err := json.Unmarshal([]byte(cfg), &h); err != nil {
		tb.Fatal(err)
	}
	ctx := quietContext(tb)
	if err := h.Provision(ctx); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { h.Cleanup() })
	return &h
}

// discardLogging is a config's logging section that sends Caddy's
// default log and the standard library's (the sink) nowhere.
const discardLogging = `{"sink":{"writer":{"output":"discard"}},"logs":{"default":{"writer":{"output":"discard"}}}}`

// silenceCaddy loads an empty config that logs nowhere. Caddy logs
// through one process-wide default logger: every config without a
// logging section of its own sets it to stderr, and stopping a config
// leaves it on that config's (closed) writer, so tests put it back here.
func silenceCaddy() error {
	return caddy.Load([]byte(`{"admin":{"disabled":true},"logging":`+discardLogging+`}`), true)
}

// stopCaddy stops the config t loaded, leaving Caddy silent.
func stopCaddy(t testing.TB) {
	t.Helper()
	if err := caddy.Stop(); err != nil {
		t.Errorf("stopping caddy: %v", err)
	}
	if err := silenceCaddy(); err != nil {
		t.Errorf("silencing caddy: %v", err)
	}
}

// quietContext is a context to provision a module with outside a loaded
// config, logging nowhere (caddy.NewContext alone gives modules a
// development logger on stderr). It is cancelled when tb ends.
func quietContext(tb testing.TB) caddy.Context {
	parent := caddy.ActiveContext() // the silent config (silenceCaddy)
	parent.Context = context.Background()
	ctx, cancel := caddy.NewContext(parent)
	tb.Cleanup(cancel)
	return ctx
}

// validateConfig provisions every module of cfg without starting
// servers (caddy.Validate), logging nowhere.
func validateConfig(cfg []byte) error {
	var c caddy.Config
	if err := json.Unmarshal(cfg, &c); err != nil {
		return err
	}
	if c.Logging == nil {
		c.Logging = new(caddy.Logging)
		if err := json.Unmarshal([]byte(discardLogging), c.Logging); err != nil {
			return err
		}
	}
	return caddy.Validate(&c)
}

// testLogFiles maps each test to its log file, made once per test: every
// distinct file name keeps a writer (and its goroutine) open in Caddy's
// process-wide pool, so a file per reload would look like a leak.
var testLogFiles sync.Map // testing.TB → string

// testLogFile is the file t's Caddy configs log to; its lines are
// printed when t fails, so a failing test shows its own logs only.
func testLogFile(t testing.TB) string {
	t.Helper()
	if f, ok := testLogFiles.Load(t); ok {
		return f.(string)
	}
	file := filepath.Join(t.TempDir(), "caddy.log")
	testLogFiles.Store(t, file)
	t.Cleanup(func() {
		testLogFiles.Delete(t)
		if t.Failed() {
			if b, err := os.ReadFile(file); err == nil && len(b) > 0 {
				t.Logf("Caddy's log:\n%s", b)
			}
		}
	})
	return file
}

// loadConfig loads a Caddy JSON config in this process; without a
// logging section of its own, it logs to the test's file (testLogFile).
func loadConfig(t testing.TB, cfg []byte) error {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(cfg, &m); err != nil {
		return err
	}
	if _, ok := m["logging"]; !ok {
		m["logging"] = map[string]any{"logs": map[string]any{"default": map[string]any{
			"writer": map[string]any{"output": "file", "filename": testLogFile(t)}}}}
		var err error
		if cfg, err = json.Marshal(m); err != nil {
			return err
		}
	}
	return caddy.Load(cfg, true)
}
