// Package redistest starts real redis-server processes for tests: standalone
// servers (optionally with a password, ACL users or TLS), Redis Clusters and a
// Sentinel setup, each on free loopback ports in a t.TempDir().
//
// Every process is started by the test that asks for it and killed (and
// waited for) by a t.Cleanup registered before the process starts, so nothing
// outlives the test, whether it passes, fails or calls t.FailNow. On Linux the
// processes are additionally started with a parent-death signal, so they die
// with the test binary even when it is killed (for example by -timeout). The
// package needs no TestMain and can be used from any package's tests.
//
// redis-server and redis-cli must be on PATH; ./scripts/test.sh installs them.
// A missing binary fails the test: it is never skipped.
package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// readyTimeout bounds how long a start waits for the server to answer.
	readyTimeout = 10 * time.Second
	// stopGrace is how long Stop waits after SIGTERM before SIGKILL.
	stopGrace = 10 * time.Second
	// portAttempts is how often a start is retried on a fresh port when the
	// chosen one turned out to be taken.
	portAttempts = 5
	// clusterBusOffset is the distance between a cluster node's client port
	// and its cluster bus port.
	clusterBusOffset = 10000
	// maxClusterPort keeps port+clusterBusOffset a valid port.
	maxClusterPort = 65535 - clusterBusOffset
)

// RequireBinaries fails the test (it does not skip it) when redis-server or
// redis-cli is not on PATH. With go test -short it skips the test instead:
// the fast tier runs without Redis.
func RequireBinaries(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("redistest: needs real redis-server processes; skipped with -short")
	}
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("redistest: %s not found on PATH (%v); run ./scripts/test.sh, which installs redis-server and redis-tools", bin, err)
		}
	}
}

// Options configures a standalone server started by StartStandalone.
type Options struct {
	// Password is the password of the default user (requirepass).
	Password string
	// ACLUsers are raw ACL rules, one user per entry, written to the config
	// file as they are, e.g. "user alice on >secret ~* +@all". The leading
	// "user " may be omitted.
	ACLUsers []string
	// TLS serves TLS only: the plain port is disabled and Port/Addr are the
	// TLS port. A throwaway CA, server and client certificate are generated
	// into the server's directory (see Server.TLS).
	TLS bool
	// TLSAuthClients is redis' tls-auth-clients: "yes" (the default when
	// empty: clients must present a certificate signed by the CA),
	// "optional" or "no".
	TLSAuthClients string
	// Args are extra redis-server command-line arguments, appended after the
	// generated config file, e.g. []string{"--maxmemory", "10mb"}.
	Args []string
}

// Server is one redis-server process (a data node or a sentinel). Its
// exported fields are fixed for the server's lifetime, across restarts.
type Server struct {
	// Addr is "127.0.0.1:<Port>".
	Addr string
	// Port is the port clients connect to (the TLS port for a TLS server).
	Port int
	// Dir is the server's working directory: redis.conf, redis.log,
	// stdio.log, nodes.conf (cluster) and any persistence files live here.
	Dir string
	// LogFile is the path of the server's log file.
	LogFile string
	// Password is the default user's password, "" for none.
	Password string
	// TLS holds the generated certificate files; nil for a plain server.
	TLS *TLSFiles

	sentinel  bool     // started with --sentinel
	bus       bool     // cluster node: port+10000 must be free too
	firstPort int      // tests only: port for the first start attempt
	config    []string // config lines, without the port lines
	args      []string // extra command-line args

	mu   sync.Mutex
	proc *process
}

// process is one run of redis-server.
type process struct {
	cmd   *exec.Cmd
	done  chan struct{} // closed once cmd.Wait has returned
	stdio *os.File
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// StartStandalone starts a standalone redis-server configured by opts and
// waits until it answers. The server is killed at the end of the test.
func StartStandalone(t testing.TB, opts Options) *Server {
	t.Helper()
	s := newServer(t)
	s.Password = opts.Password
	if opts.Password != "" {
		s.config = append(s.config, "requirepass "+quote(opts.Password))
	}
	for _, u := range opts.ACLUsers {
		u = strings.TrimSpace(u)
		if !strings.HasPrefix(u, "user ") {
			u = "user " + u
		}
		s.config = append(s.config, u)
	}
	if opts.TLS {
		s.TLS = GenerateTLS(t, s.Dir)
		auth := opts.TLSAuthClients
		if auth == "" {
			auth = "yes"
		}
		s.config = append(s.config,
			"tls-cert-file "+quote(s.TLS.ServerCert),
			"tls-key-file "+quote(s.TLS.ServerKey),
			"tls-ca-cert-file "+quote(s.TLS.CA),
			"tls-auth-clients "+auth,
		)
	}
	s.args = append(s.args, opts.Args...)
	s.start(t)
	return s
}

// newServer prepares a Server with the base configuration in a fresh
// temporary directory and registers its cleanup. It does not start it.
func newServer(t testing.TB) *Server {
	t.Helper()
	RequireBinaries(t)
	// TempDir first: cleanups run last-registered-first, so the process is
	// killed before its directory is removed.
	dir := t.TempDir()
	s := &Server{
		Dir:     dir,
		LogFile: filepath.Join(dir, "redis.log"),
	}
	s.config = []string{
		"bind 127.0.0.1",
		"daemonize no",
		"protected-mode no",
		"dir " + quote(dir),
		"logfile " + quote(s.LogFile),
		`save ""`,
		"appendonly no",
		// Replicas sync at once instead of after the 5 s default delay.
		"repl-diskless-sync-delay 0",
		// A master with lagging replicas would otherwise delay SIGTERM 10 s.
		"shutdown-timeout 1",
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("redistest: server %s (dir %s) log tail:\n%s", s.Addr, s.Dir, s.logTail(12))
		}
		s.Kill()
	})
	return s
}

// start picks a port, writes the config and starts the server, retrying on
// another port when the chosen one is taken.
func (s *Server) start(t testing.TB) {
	t.Helper()
	var lastErr error
	for attempt := 0; attempt < portAttempts; attempt++ {
		port := s.firstPort
		if attempt > 0 || port == 0 {
			port = freePort(t, s.bus)
		}
		s.Port = port
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if err := s.writeConfig(); err != nil {
			t.Fatalf("redistest: %v", err)
		}
		// A failed cluster node has already written its identity, with
		// the old port; start the next attempt as a fresh node.
		_ = os.Remove(filepath.Join(s.Dir, "nodes.conf"))
		err := s.launch()
		if err == nil {
			return
		}
		lastErr = err
		if !errors.Is(err, errPortInUse) {
			break
		}
	}
	t.Fatalf("redistest: starting redis-server in %s: %v", s.Dir, lastErr)
}

func (s *Server) writeConfig() error {
	var b strings.Builder
	fmt.Fprintf(&b, "# generated by internal/redistest\n")
	if s.TLS != nil {
		fmt.Fprintf(&b, "port 0\ntls-port %d\n", s.Port)
	} else {
		fmt.Fprintf(&b, "port %d\n", s.Port)
	}
	for _, l := range s.config {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	// Sentinel rewrites its config file, so it must stay writable.
	return os.WriteFile(s.configPath(), []byte(b.String()), 0o600)
}

func (s *Server) configPath() string { return filepath.Join(s.Dir, "redis.conf") }

var errPortInUse = errors.New("port already in use")

// launch runs redis-server with the existing config and waits until it
// answers. On failure the process is gone when launch returns.
func (s *Server) launch() error {
	if s.Running() {
		return errors.New("already running")
	}
	// A fresh log per run makes "Address already in use" detection and the
	// failure tail refer to this run only; keep the previous one around.
	if _, err := os.Stat(s.LogFile); err == nil {
		_ = os.Rename(s.LogFile, s.LogFile+".prev")
	}
	stdio, err := os.Create(filepath.Join(s.Dir, "stdio.log"))
	if err != nil {
		return err
	}
	args := []string{s.configPath()}
	if s.sentinel {
		args = append(args, "--sentinel")
	}
	args = append(args, s.args...)
	cmd := exec.Command("redis-server", args...)
	cmd.Dir = s.Dir
	cmd.Stdout = stdio
	cmd.Stderr = stdio
	cmd.SysProcAttr = sysProcAttr()
	if err := startCmd(cmd); err != nil {
		stdio.Close()
		return err
	}
	p := &process{cmd: cmd, done: make(chan struct{}), stdio: stdio}
	go func() {
		_ = cmd.Wait()
		stdio.Close()
		close(p.done)
	}()
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	if err := s.waitReady(p); err != nil {
		_ = p.cmd.Process.Kill()
		<-p.done
		if strings.Contains(s.readFile(s.LogFile), "Address already in use") {
			return fmt.Errorf("%w: %v", errPortInUse, err)
		}
		return fmt.Errorf("%v\n--- %s (tail) ---\n%s\n--- stdio ---\n%s", err, s.LogFile, s.logTail(30),
			strings.TrimSpace(s.readFile(filepath.Join(s.Dir, "stdio.log"))))
	}
	return nil
}

// waitReady waits until the server answers INFO with p's pid (so a foreign
// server that happens to hold the port is not mistaken for ours).
//
// It polls with plain TCP connects first: a go-redis client whose dials fail
// backs off (100 ms per retry, then a 1 s circuit breaker), which would slow
// every start down.
func (s *Server) waitReady(p *process) error {
	pid := strconv.Itoa(p.cmd.Process.Pid)
	deadline := time.Now().Add(readyTimeout)
	var lastErr error
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("redis-server exited during startup (%v)", p.cmd.ProcessState)
		}
		if lastErr = s.probe(pid, p); lastErr == nil {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %v: %v", readyTimeout, lastErr)
}

// probe checks once whether the server answers and is process pid.
func (s *Server) probe(pid string, p *process) error {
	conn, err := net.DialTimeout("tcp", s.Addr, 500*time.Millisecond)
	if err != nil {
		return err
	}
	conn.Close()
	opt := s.ClientOptions()
	opt.Protocol = 2
	opt.DisableIdentity = true
	opt.MaxRetries = -1
	opt.DialerRetries = 1
	opt.DialTimeout = 500 * time.Millisecond
	// Short: a foreign listener that never answers must not hold up the
	// next check of whether our process has exited. A slow but healthy
	// server just gets asked again.
	opt.ReadTimeout = 250 * time.Millisecond
	opt.WriteTimeout = 250 * time.Millisecond
	opt.PoolSize = 1
	c := redis.NewClient(opt)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	switch {
	case err == nil:
		if got := infoField(info, "process_id"); got != pid {
			return fmt.Errorf("port %d is answered by process %s, not ours (%s)", s.Port, got, pid)
		}
		return nil
	case isAuthError(err):
		// Something answers but will not let us in (e.g. the default user
		// is disabled by an ACL rule): accept it if our process is alive
		// and has logged that it is ready.
		if !p.exited() && strings.Contains(s.readFile(s.LogFile), "Ready to accept connections") {
			return nil
		}
		return err
	default:
		return err
	}
}

func isAuthError(err error) bool {
	msg := err.Error()
	for _, p := range []string{"NOAUTH", "WRONGPASS", "NOPERM"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// infoField returns the value of field in an INFO reply.
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// Running reports whether the server process is currently running (it may
// be paused).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil && !s.proc.exited()
}

// Pid returns the process id of the running server, 0 when it is not running.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || s.proc.exited() {
		return 0
	}
	return s.proc.cmd.Process.Pid
}

func (s *Server) current() *process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

// Stop shuts the server down gracefully (SIGTERM, then SIGCONT in case it is
// paused) and waits for it to exit, using SIGKILL if it has not exited after
// 10 s. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	p := s.current()
	if p == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if sigCont != nil {
		_ = p.cmd.Process.Signal(sigCont)
	}
	select {
	case <-p.done:
	case <-time.After(stopGrace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Kill kills the server with SIGKILL and waits for it to exit. Killing a
// stopped server does nothing.
func (s *Server) Kill() {
	p := s.current()
	if p == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Pause freezes the server with SIGSTOP: connections stay open but nothing is
// answered, as with a hung or partitioned node. Resume undoes it; Stop,
// Restart and cleanup handle paused servers. Unix only.
func (s *Server) Pause() { s.signal(sigStop) }

// Resume continues a server frozen by Pause (SIGCONT).
func (s *Server) Resume() { s.signal(sigCont) }

func (s *Server) signal(sig os.Signal) {
	if p := s.current(); sig != nil && p != nil && !p.exited() {
		_ = p.cmd.Process.Signal(sig)
	}
}

// Restart stops the server if it is running (gracefully, see Stop) and starts
// it again on the same port with the same directory and config file. Data is
// empty afterwards unless persistence was enabled through Options.Args; a
// cluster node keeps its identity (nodes.conf) and a sentinel its state.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	// The port was free a moment ago; it can only be taken transiently
	// (e.g. as an ephemeral source port), so retry on the same port.
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		if err = s.launch(); err == nil || !errors.Is(err, errPortInUse) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("redistest: restarting redis-server on port %d: %v", s.Port, err)
	}
}

// ClientOptions returns a fresh go-redis option set for this server (address,
// default-user password, TLS with the generated CA and client certificate).
func (s *Server) ClientOptions() *redis.Options {
	opt := &redis.Options{Addr: s.Addr, Password: s.Password}
	if s.TLS != nil {
		cfg, err := s.TLS.ClientConfig()
		if err != nil {
			panic(fmt.Sprintf("redistest: %v", err)) // files were written by GenerateTLS
		}
		opt.TLSConfig = cfg
	}
	return opt
}

// Client returns a go-redis client for this server built from ClientOptions,
// closed at the end of the test.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(s.ClientOptions())
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// CLIArgs returns the redis-cli connection flags for this server (host, port,
// password, TLS files), to which a command can be appended.
func (s *Server) CLIArgs() []string {
	args := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(s.Port)}
	if s.TLS != nil {
		args = append(args, "--tls", "--cacert", s.TLS.CA, "--cert", s.TLS.ClientCert, "--key", s.TLS.ClientKey)
	}
	if s.Password != "" {
		args = append(args, "-a", s.Password, "--no-auth-warning")
	}
	return args
}

// CLI runs `redis-cli <CLIArgs> -e args...` against the server and returns its
// trimmed standard output. The test fails if redis-cli fails, including when
// the command returns an error reply.
func (s *Server) CLI(t testing.TB, args ...string) string {
	t.Helper()
	out, err := runCLI(append(append(s.CLIArgs(), "-e"), args...)...)
	if err != nil {
		t.Fatalf("redistest: redis-cli -p %d %s: %v", s.Port, strings.Join(args, " "), err)
	}
	return out
}

// runCLI runs redis-cli with a timeout and returns its trimmed stdout.
func runCLI(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "redis-cli", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()+"\n"+stdout.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// logTail returns the last n lines of the server log.
func (s *Server) logTail(n int) string {
	lines := strings.Split(strings.TrimRight(s.readFile(s.LogFile), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (s *Server) readFile(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	return string(b)
}

// quote makes s a single token in a redis config file.
func quote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\r", `\r`)
	return `"` + r.Replace(s) + `"`
}

var (
	portMu    sync.Mutex
	usedPorts = map[int]bool{} // ports handed out by this process, never reused
)

// FreePort returns a loopback port that is currently free and that this
// process has not handed out before (to a redis-server or to another
// caller): for the tests' own servers, so that no two of them, Redis or
// not, are given the same port.
func FreePort(t testing.TB) int {
	t.Helper()
	return freePort(t, false)
}

// freePort returns a loopback port that is currently free and has not been
// handed out before by this process. With bus, port+10000 is free too and
// port <= 55535 (for a cluster bus).
func freePort(t testing.TB, bus bool) int {
	t.Helper()
	portMu.Lock()
	defer portMu.Unlock()
	for i := 0; i < 1000; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("redistest: finding a free port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		ok := !usedPorts[port]
		if ok && bus {
			ok = port <= maxClusterPort && !usedPorts[port+clusterBusOffset]
			if ok {
				l2, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+clusterBusOffset)))
				ok = err == nil
				if ok {
					l2.Close()
				}
			}
		}
		l.Close()
		if ok {
			usedPorts[port] = true
			if bus {
				usedPorts[port+clusterBusOffset] = true
			}
			return port
		}
	}
	t.Fatalf("redistest: no free port found")
	return 0
}

var (
	spawnOnce sync.Once
	spawnCh   chan spawnReq
)

type spawnReq struct {
	cmd *exec.Cmd
	err chan error
}

// startCmd starts cmd from one goroutine locked to its OS thread for the life
// of the process. On Linux the parent-death signal fires when the thread that
// forked the child exits, not the process; a thread that never exits makes it
// fire exactly when the test binary dies.
func startCmd(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnCh = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for r := range spawnCh {
				r.err <- r.cmd.Start()
			}
		}()
	})
	r := spawnReq{cmd: cmd, err: make(chan error, 1)}
	spawnCh <- r
	return <-r.err
}
