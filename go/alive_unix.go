//go:build unix

package warden

import "syscall"

// alive tells whether an idle connection is still open: the server has not
// closed it (EOF) and sent nothing unasked. It peeks at the socket without
// blocking; a deadline cannot do that (a past deadline fails the read
// before looking). Connections without a file descriptor (TLS) count as alive.
func (c *conn) alive() bool {
	if c.br.Buffered() > 0 {
		return false
	}
	sc, ok := c.nc.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	alive := true
	if err := raw.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		alive = err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
		return true
	}); err != nil {
		return false
	}
	return alive
}
