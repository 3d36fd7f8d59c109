package warden

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// serverError is an error reply read on a waiter connection. It keeps the
// server's text and satisfies go-redis's redis.Error, so callers test both
// paths alike.
type serverError string

func (e serverError) Error() string { return string(e) }
func (e serverError) RedisError()   {}

var _ redis.Error = serverError("")

// conn is a waiter connection: a plain RESP2 connection dialled with the
// go-redis client's own dialer and credentials. It is warden's, not the
// pool's: go-redis would retry a blocking command after a read timeout (a
// second queued acquire) and cannot interrupt a blocked read when a context
// is cancelled (redis/go-redis#2556); here a cancel withdraws, unblocks or
// closes it.
type conn struct {
	nc net.Conn
	in *source // what br reads
	br *bufio.Reader
	bw *bufio.Writer
	id int64 // CLIENT ID, for CLIENT UNBLOCK / CLIENT KILL
}

// source is a connection as its reader reads it: by Read, or by read once
// that is set (the near cache's tracking connection, which notes when the
// reader takes bytes).
type source struct {
	net.Conn
	read func([]byte) (int, error)
}

func (s *source) Read(p []byte) (int, error) {
	if s.read != nil {
		return s.read(p)
	}
	return s.Conn.Read(p)
}

// dial opens a connection to the node opt describes (for a failover client,
// opt.Dialer resolves the current master) and authenticates it as go-redis would.
func dial(ctx context.Context, opt *redis.Options) (*conn, error) {
	d := opt.Dialer
	if d == nil {
		d = (&net.Dialer{Timeout: opt.DialTimeout}).DialContext
	}
	network := opt.Network
	if network == "" {
		network = "tcp"
	}
	nc, err := d(ctx, network, opt.Addr)
	if err != nil {
		return nil, err
	}
	in := &source{Conn: nc}
	c := &conn{nc: nc, in: in, br: bufio.NewReader(in), bw: bufio.NewWriter(nc)}
	if err := c.handshake(ctx, opt); err != nil {
		_ = nc.Close()
		return nil, err
	}
	return c, nil
}

func (c *conn) handshake(ctx context.Context, opt *redis.Options) error {
	deadline := time.Now().Add(10 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = c.nc.SetDeadline(deadline)
	defer func() { _ = c.nc.SetDeadline(time.Time{}) }()
	user, pass := opt.Username, opt.Password
	switch {
	case opt.CredentialsProviderContext != nil:
		var err error
		if user, pass, err = opt.CredentialsProviderContext(ctx); err != nil {
			return err
		}
	case opt.CredentialsProvider != nil:
		user, pass = opt.CredentialsProvider()
	}
	var cmds [][]any
	if pass != "" {
		if user != "" {
			cmds = append(cmds, []any{"AUTH", user, pass})
		} else {
			cmds = append(cmds, []any{"AUTH", pass})
		}
	}
	if opt.DB != 0 {
		cmds = append(cmds, []any{"SELECT", opt.DB})
	}
	cmds = append(cmds, []any{"CLIENT", "ID"})
	for _, cmd := range cmds {
		c.write(cmd...)
	}
	if err := c.bw.Flush(); err != nil {
		return err
	}
	var first error
	for i := range cmds {
		r, err := c.read()
		if err != nil {
			return err
		}
		if e, ok := r.(serverError); ok && first == nil {
			first = e
		}
		if i == len(cmds)-1 && first == nil {
			id, ok := r.(int64)
			if !ok {
				return fmt.Errorf("warden: CLIENT ID answered %v", r)
			}
			c.id = id
		}
	}
	return first
}

func (c *conn) write(args ...any) {
	c.bw.WriteByte('*')
	c.bw.WriteString(strconv.Itoa(len(args)))
	c.bw.WriteString("\r\n")
	for _, a := range args {
		var s string
		switch v := a.(type) {
		case string:
			s = v
		case []byte:
			s = string(v)
		case int:
			s = strconv.Itoa(v)
		case int64:
			s = strconv.FormatInt(v, 10)
		default:
			s = fmt.Sprint(v)
		}
		c.bw.WriteByte('$')
		c.bw.WriteString(strconv.Itoa(len(s)))
		c.bw.WriteString("\r\n")
		c.bw.WriteString(s)
		c.bw.WriteString("\r\n")
	}
}

// send writes one command.
func (c *conn) send(args ...any) error {
	_ = c.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	c.write(args...)
	return c.bw.Flush()
}

// push is a RESP3 push message (the near cache's invalidations).
type push []any

// read reads one reply: int64, string, nil, []any, or serverError; on a
// RESP3 connection (the near cache's) also push, bool and float64, with maps
// and sets read as []any.
func (c *conn) read() (any, error) {
	line, err := c.br.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("warden: bad reply line %q", line)
	}
	body := line[1 : len(line)-2]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return serverError(body), nil
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, err
		}
		if n < 0 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(c.br, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*', '~', '>', '%':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, err
		}
		if n < 0 {
			return nil, nil
		}
		if line[0] == '%' {
			n *= 2
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = c.read(); err != nil {
				return nil, err
			}
		}
		if line[0] == '>' {
			return push(out), nil
		}
		return out, nil
	case '_':
		return nil, nil
	case '#':
		return body == "t", nil
	case ',':
		return strconv.ParseFloat(body, 64)
	case '(':
		return body, nil
	case '=', '!':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("warden: bad reply line %q", line)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(c.br, buf); err != nil {
			return nil, err
		}
		if line[0] == '!' {
			return serverError(buf[:n]), nil
		}
		// A verbatim string starts with its format: "txt:".
		if n >= 4 {
			return string(buf[4:n]), nil
		}
		return string(buf[:n]), nil
	case '|':
		// Attributes describe the reply that follows: skip them.
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, err
		}
		for range 2 * n {
			if _, err := c.read(); err != nil {
				return nil, err
			}
		}
		return c.read()
	}
	return nil, fmt.Errorf("warden: unexpected reply %q", line)
}

// do sends one command and reads its reply within timeout.
func (c *conn) do(timeout time.Duration, args ...any) (any, error) {
	if err := c.send(args...); err != nil {
		return nil, err
	}
	_ = c.nc.SetReadDeadline(time.Now().Add(timeout))
	defer func() { _ = c.nc.SetReadDeadline(time.Time{}) }()
	return c.read()
}

func (c *conn) close() { _ = c.nc.Close() }

// unblockSupported tells from INFO server whether CLIENT UNBLOCK takes a
// warden waiter out of its queue: Redis >= 7.4 and Valkey >= 8 (Valkey
// reports redis_version 7.2.4 and its own valkey_version).
func unblockSupported(info string) bool {
	version := func(field string) (int, int, bool) {
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
				parts := strings.SplitN(v, ".", 3)
				if len(parts) < 2 {
					return 0, 0, false
				}
				major, err1 := strconv.Atoi(parts[0])
				minor, err2 := strconv.Atoi(parts[1])
				return major, minor, err1 == nil && err2 == nil
			}
		}
		return 0, 0, false
	}
	if major, _, ok := version("valkey_version"); ok {
		return major >= 8
	}
	major, minor, ok := version("redis_version")
	return ok && (major > 7 || major == 7 && minor >= 4)
}

// ErrClosed: the Warden was closed (before or during the call).
var ErrClosed = errors.New("warden: closed")

var errClosed = ErrClosed
