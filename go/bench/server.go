package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// server is the one redis-server (with the module) every run of the bench shares.
type server struct {
	binary, module string
	port           int
	cmd            *exec.Cmd
	dir            string
	admin          *redis.Client
	exited         chan struct{}
}

func startServer(binary, module string, port int) (*server, error) {
	if port == 0 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		port = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	dir, err := os.MkdirTemp("", "warden-go-bench-")
	if err != nil {
		return nil, err
	}
	s := &server{binary: binary, module: module, port: port, dir: dir}
	log, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	s.cmd = exec.Command(binary, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", dir, "--loadmodule", module)
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	s.exited = make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	s.admin = redis.NewClient(&redis.Options{Addr: s.addr()})
	for i := 0; i < 200; i++ {
		select {
		case <-s.exited:
			i = 200
			continue
		default:
		}
		if s.admin.Ping(context.Background()).Err() == nil {
			return s, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.close()
	out, _ := os.ReadFile(filepath.Join(dir, "server.log"))
	return nil, fmt.Errorf("%s with %s did not start: %s", binary, module, strings.TrimSpace(string(out)))
}

func (s *server) addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

func (s *server) pid() int { return s.cmd.Process.Pid }

func (s *server) info(section string) map[string]string {
	out := map[string]string{}
	text, err := s.admin.Info(context.Background(), section).Result()
	if err != nil {
		return out
	}
	for _, line := range strings.Split(text, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = v
		}
	}
	return out
}

func (s *server) version() string { return s.info("server")["redis_version"] }

func (s *server) moduleVersion() string {
	mods, err := s.admin.Do(context.Background(), "MODULE", "LIST").Slice()
	if err != nil {
		return "?"
	}
	for _, m := range mods {
		f := fieldsOf(m)
		if fmt.Sprint(f["name"]) == "warden" {
			return fmt.Sprintf("warden %v", f["ver"])
		}
	}
	return "?"
}

// fieldsOf reads a MODULE LIST entry, a RESP2 flat list or a RESP3 map.
func fieldsOf(v any) map[string]any {
	out := map[string]any{}
	switch e := v.(type) {
	case map[any]any:
		for k, x := range e {
			out[fmt.Sprint(k)] = x
		}
	case []any:
		for i := 0; i+1 < len(e); i += 2 {
			out[fmt.Sprint(e[i])] = e[i+1]
		}
	}
	return out
}

// cpuSeconds is used_cpu_sys + used_cpu_user.
func (s *server) cpuSeconds() float64 {
	i := s.info("cpu")
	a, _ := strconv.ParseFloat(i["used_cpu_sys"], 64)
	b, _ := strconv.ParseFloat(i["used_cpu_user"], 64)
	return a + b
}

// commandCalls: calls per command from INFO commandstats (those run inside scripts included),
// INFO itself left out.
func (s *server) commandCalls() map[string]int64 {
	out := map[string]int64{}
	for k, v := range s.info("commandstats") {
		cmd := strings.TrimPrefix(k, "cmdstat_")
		if cmd == "info" || cmd == k {
			continue
		}
		_, rest, _ := strings.Cut(v, "calls=")
		n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
		out[cmd] = n
	}
	return out
}

func delta(before, after map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// monitor counts the commands between two ECHO markers on a MONITOR connection: run counts every
// line, sent leaves out those run by a Lua script.
type monitor struct {
	conn net.Conn
	r    *bufio.Reader
}

func (s *server) monitor() (*monitor, error) {
	c, err := net.Dial("tcp", s.addr())
	if err != nil {
		return nil, err
	}
	m := &monitor{conn: c, r: bufio.NewReader(c)}
	if _, err := c.Write([]byte("MONITOR\r\n")); err != nil {
		c.Close()
		return nil, err
	}
	if _, err := m.r.ReadString('\n'); err != nil { // +OK
		c.Close()
		return nil, err
	}
	return m, nil
}

// count reads until the line holding end, counting from the line holding start.
func (m *monitor) count(start, end string) (sent, run int64, names map[string]int64, err error) {
	names = map[string]int64{}
	in := false
	_ = m.conn.SetReadDeadline(time.Now().Add(time.Minute))
	for {
		line, err := m.r.ReadString('\n')
		if err != nil {
			return 0, 0, nil, err
		}
		switch {
		case strings.Contains(line, start):
			in = true
			continue
		case strings.Contains(line, end):
			return sent, run, names, nil
		}
		// +1700000000.123456 [0 127.0.0.1:5555] "lock.acquire" "k" ...; [0 lua] inside scripts
		b := strings.Index(line, " [")
		e := strings.Index(line, "] ")
		if !in || b < 0 || e < b {
			continue
		}
		run++
		if strings.HasSuffix(line[b:e], " lua") {
			continue
		}
		sent++
		cmd := strings.ToLower(strings.Trim(strings.SplitN(line[e+2:], " ", 2)[0], "\"\r\n"))
		names[cmd]++
	}
}

func (m *monitor) close() { m.conn.Close() }

func (s *server) close() {
	if s.admin != nil {
		s.admin.Close()
	}
	if s.exited != nil {
		_ = s.cmd.Process.Signal(os.Interrupt)
		select {
		case <-s.exited:
		case <-time.After(10 * time.Second):
			_ = s.cmd.Process.Kill()
		}
	}
	os.RemoveAll(s.dir)
}
