package warden_test

import (
	"context"
	"errors"
	"testing"
	"time"

	warden "github.com/warden-redis/warden/go"
)

// Close while 100 goroutines wait without a deadline (on the server, or for
// a waiter connection): every wait ends with
// ErrClosed, the server has no waiter and no connection of warden's left,
// and a call after Close fails without taking anything. With WARDEN.WITHDRAW,
// and with it refused by an ACL.
func TestCloseWhileWaiting(t *testing.T) {
	for _, c := range withdrawCases {
		t.Run(c.name, func(t *testing.T) { closeWhileWaiting(t, c.deny) })
	}
}

func closeWhileWaiting(t *testing.T, deny bool) {
	_, rdb, w := setupCancel(t, deny)
	ctx := context.Background()
	holder, err := w.TryLock(ctx, "k", warden.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	const n = 100
	errc := make(chan error, n)
	for range n {
		go func() {
			h, err := w.Lock(ctx, "k")
			if err == nil {
				_ = h.Release(ctx)
			}
			errc <- err
		}()
	}
	// 64 wait on the server (WithWaiters' default), 36 for a waiter connection.
	waitFor(t, "64 waiters", func() bool { return info(t, rdb, "LOCK.INFO", "k")["waiters"] == int64(64) })
	closed := make(chan struct{})
	go func() { _ = w.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hangs while calls wait")
	}
	for range n {
		select {
		case err := <-errc:
			if !errors.Is(err, warden.ErrClosed) {
				t.Fatalf("a wait cut by Close: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a wait goes on after Close")
		}
	}
	waitFor(t, "no waiter", func() bool { return info(t, rdb, "LOCK.INFO", "k")["waiters"] == int64(0) })
	// What remains connected is go-redis's pool (rdb's), none of warden's own.
	waitFor(t, "warden's connections closed", func() bool {
		return infoField(t, rdb, "clients", "connected_clients") <= int64(rdb.PoolStats().TotalConns)
	})

	// Use after Close: nothing is taken, nothing starts.
	if _, err := w.TryLock(ctx, "free"); !errors.Is(err, warden.ErrClosed) {
		t.Fatalf("TryLock after Close: %v", err)
	}
	if _, err := w.Semaphore("s", 2).Acquire(ctx, 1); !errors.Is(err, warden.ErrClosed) {
		t.Fatalf("Acquire after Close: %v", err)
	}
	if _, err := warden.Load(ctx, w, "c", time.Minute, func(context.Context) (string, error) { return "v", nil }); !errors.Is(err, warden.ErrClosed) {
		t.Fatalf("Load after Close: %v", err)
	}
	if got := info(t, rdb, "LOCK.INFO", "free"); got != nil {
		t.Fatalf("a lock taken after Close: %v", got)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_ = holder.Release(ctx)
}
