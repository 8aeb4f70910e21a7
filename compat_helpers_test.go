package tollgate

import (
	"bufio"
	"bytes"
	"context"
	"encoding/gob"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Helpers of the caddy-ratelimit compatibility tests (compat_test.go):
// they run the built binary on caddy-ratelimit's own configs, JSON or
// Caddyfile, and look at it only from outside: HTTP, logs, /metrics and
// the files in its storage.

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
	t.Cleanup(func() {
		if p.cmd.ProcessState != nil && t.Failed() {
			t.Logf("caddy on :%d exited early; output:\n%s", p.port, p.logs.String())
		}
		p.stop()
	})
	waitListening(t, p.port)
	return p
}

// peerJSON turns one of caddy-ratelimit's test configs (admin on
// localhost:2999, listening on :8080) into one for a test process.
func peerJSON(config string) string {
	return strings.NewReplacer(`"localhost:2999"`, `"127.0.0.1:{ADMIN}"`, `":8080"`, `"127.0.0.1:{PORT}"`).Replace(config)
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

// peerState and peerStateValue are caddy-ratelimit's state file as its
// distributed.go writes it (gob, fields by name); the tests write them as
// a caddy-ratelimit peer would.
type peerState struct {
	Timestamp time.Time
	Zones     map[string]map[string]peerStateValue
}

type peerStateValue struct {
	Count       int
	OldestEvent time.Time
}

// writePeerState writes the state file of instance id into the
// file_system storage at root, as caddy-ratelimit's writeRateLimitState.
func writePeerState(t *testing.T, root, id string, st peerState) string {
	t.Helper()
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(st); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(root, "rate_limit", "instances", id+".rlstate")
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// readPeerStates decodes every state file in the storage at root.
func readPeerStates(t *testing.T, root string) map[string]peerState {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(root, "rate_limit", "instances", "*.rlstate"))
	out := map[string]peerState{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var st peerState
		if err := gob.NewDecoder(bytes.NewReader(b)).Decode(&st); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[filepath.Base(f)] = st
	}
	return out
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
