//go:build !linux

package warden

// unread tells on Linux only whether a connection has bytes its reader has
// not acted on; elsewhere there is none, and hits do not wait for them.
type unread struct{}

func newUnread(*conn) *unread { return nil }

func (*unread) acted() {}

func (*unread) settled() bool { return true }

func (*unread) shut() {}
