// Package testserver starts real redis-server (or valkey-server) processes
// with the warden module for the Go client's tests: a free TCP port on
// 127.0.0.1, a temporary directory, no persistence. WARDEN_SERVER names the
// server binary (default redis-server), WARDEN_MODULE the module (default
// ../target/release/libwarden.so from go/).
package testserver

import (
	"context"
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

// Binary is the server binary the tests start.
func Binary() string {
	if b := os.Getenv("WARDEN_SERVER"); b != "" {
		return b
	}
	return "redis-server"
}

// Module is the warden module the servers load.
func Module() string {
	if m := os.Getenv("WARDEN_MODULE"); m != "" {
		return m
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "target", "release", "libwarden.so")
}

// Server is one server process.
type Server struct {
	Port int
	Dir  string
	args []string
	cmd  *exec.Cmd
	mu   sync.Mutex
}

// Addr is host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

var portMu sync.Mutex

// freePort finds a port free for TCP, and port+10000 too (a cluster's bus).
func freePort() (int, error) {
	portMu.Lock()
	defer portMu.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if port+10000 > 65535 {
			continue
		}
		if b, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000)); err == nil {
			_ = b.Close()
			return port, nil
		}
	}
	return 0, fmt.Errorf("no free port")
}

// Launch starts a server with the module and args; Stop ends it.
func Launch(args ...string) (*Server, error) {
	return launch(true, args)
}

// StartPlain starts a server without the module.
func StartPlain(t testing.TB) *Server {
	t.Helper()
	s, err := launch(false, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

func launch(module bool, args []string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "warden-go-")
	if err != nil {
		return nil, err
	}
	s := &Server{Port: port, Dir: dir}
	s.args = append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0", "--logfile", "server.log", "--daemonize", "no"}, args...)
	if module {
		s.args = append(s.args, "--loadmodule", Module())
	}
	if err := s.start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cmd = exec.Command(Binary(), s.args...)
	s.cmd.Dir = s.Dir
	if err := s.cmd.Start(); err != nil {
		return err
	}
	return s.ready()
}

func (s *Server) ready() error {
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: time.Second})
	defer rdb.Close()
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if err := rdb.Ping(context.Background()).Err(); err == nil {
			return nil
		} else if strings.Contains(err.Error(), "LOADING") {
			continue
		}
		if s.cmd.ProcessState != nil {
			break
		}
	}
	log, _ := os.ReadFile(filepath.Join(s.Dir, "server.log"))
	return fmt.Errorf("%s on port %d did not start: %s", Binary(), s.Port, log)
}

// Start launches a server that the test's cleanup stops.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	s, err := Launch(args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Client is a go-redis client to the server, closed at the test's end.
func (s *Server) Client(t testing.TB) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Stop kills the server and removes its directory.
func (s *Server) Stop() {
	s.Kill9()
	_ = os.RemoveAll(s.Dir)
}

// Kill9 kills the server with SIGKILL and reaps it.
func (s *Server) Kill9() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil && s.cmd.Process != nil && s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}

// Restart kills the server and starts it again on the same port.
func (s *Server) Restart() error {
	s.Kill9()
	return s.start()
}

// Freeze stops the process (SIGSTOP): it answers nothing until Thaw.
func (s *Server) Freeze() { _ = s.cmd.Process.Signal(syscall.SIGSTOP) }

// Thaw resumes a frozen server.
func (s *Server) Thaw() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }

// Pid is the server's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Replica starts a replica of s and waits until it is in sync.
func (s *Server) Replica(t testing.TB) *Server {
	t.Helper()
	r := Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(s.Port))
	rdb := r.Client(t)
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		info, _ := rdb.Info(context.Background(), "replication").Result()
		if strings.Contains(info, "master_link_status:up") {
			return r
		}
	}
	t.Fatalf("replica of %s never synced", s.Addr())
	return nil
}

// Sentinel starts a Sentinel monitoring master as name with quorum 1.
func Sentinel(t testing.TB, master *Server, name string) *Server {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	conf := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s 127.0.0.1 %d 1\n"+
		"sentinel down-after-milliseconds %s 2000\nsentinel failover-timeout %s 10000\n",
		port, dir, name, master.Port, name, name)
	path := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &Server{Port: port, Dir: dir, args: []string{path, "--sentinel", "--logfile", "server.log"}}
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Kill9)
	return s
}

// Cluster starts n masters with the module, splits the 16384 slots among
// them and waits until every node reports cluster_state:ok.
func Cluster(t testing.TB, n int) []*Server {
	t.Helper()
	nodes := make([]*Server, n)
	for i := range nodes {
		nodes[i] = Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000")
	}
	ctx := context.Background()
	per := 16384 / n
	for i, s := range nodes {
		rdb := s.Client(t)
		lo, hi := i*per, (i+1)*per-1
		if i == n-1 {
			hi = 16383
		}
		if err := rdb.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			if err := nodes[0].Client(t).Do(ctx, "CLUSTER", "MEET", "127.0.0.1", s.Port).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ok := true
		for _, s := range nodes {
			info, _ := s.Client(t).ClusterInfo(ctx).Result()
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", n)) {
				ok = false
			}
		}
		if ok {
			return nodes
		}
		if time.Now().After(end) {
			t.Fatal("cluster never became ok")
		}
	}
}
