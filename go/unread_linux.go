package warden

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// unread tells whether a TCP connection has bytes its reader has not acted
// on: bytes waiting in the kernel (SIOCINQ) or taken by the reader and not
// acted on yet (held, set before each read takes any).
type unread struct {
	raw  syscall.RawConn
	mu   sync.RWMutex // read-held around each use of fd, held by shut
	fd   int          // -1 once shut
	held atomic.Bool  // written by the reader only
}

// newUnread makes c's reads go through it; nil unless c is a TCP connection.
func newUnread(c *conn) *unread {
	tc, ok := c.nc.(*net.TCPConn)
	if !ok {
		return nil
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	u := &unread{raw: raw, fd: -1}
	if raw.Control(func(fd uintptr) { u.fd = int(fd) }) != nil || u.fd < 0 {
		return nil
	}
	u.held.Store(c.br.Buffered() > 0)
	c.in.read = u.read
	return u
}

// read waits until the socket is readable without taking anything, then
// sets held and reads.
func (u *unread) read(p []byte) (n int, err error) {
	was := u.held.Load()
	if rerr := u.raw.Read(func(fd uintptr) bool {
		u.held.Store(true)
		for {
			n, err = syscall.Read(int(fd), p)
			if err != syscall.EINTR {
				break
			}
		}
		if err == syscall.EAGAIN {
			u.held.Store(was)
			return false // wait until readable
		}
		return true
	}); rerr != nil {
		return 0, rerr
	}
	if err != nil {
		return 0, err
	}
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	return n, nil
}

// acted: the reader has acted on everything it took.
func (u *unread) acted() { u.held.Store(false) }

// settled tells whether nothing waits in the kernel (checked first) and
// nothing is held by the reader: one ioctl, no allocation.
func (u *unread) settled() bool {
	u.mu.RLock()
	defer u.mu.RUnlock()
	if u.fd < 0 {
		return false
	}
	var n int32
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(u.fd), unix.SIOCINQ, uintptr(unsafe.Pointer(&n)))
	return errno == 0 && n == 0 && !u.held.Load()
}

// shut stops using the descriptor; call it before the connection closes
// (its number may then be reused).
func (u *unread) shut() {
	u.mu.Lock()
	u.fd = -1
	u.mu.Unlock()
}
