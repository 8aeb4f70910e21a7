package tollgate

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// caddyProcess is the built cmd/caddy running as its own process.
type caddyProcess struct {
	t     *testing.T
	cmd   *exec.Cmd
	port  int
	admin int
	dir   string
	logs  *syncBuffer
	*caddyServer
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
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
		p.t.Error("caddy did not stop within 10s of SIGTERM")
	}
	if p.t.Failed() {
		p.t.Logf("caddy on :%d output:\n%s", p.port, p.logs.String())
	}
}
