package warden_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	warden "github.com/warden-redis/warden/go"
	"github.com/warden-redis/warden/go/internal/testserver"
)

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("never: %s", what)
		}
	}
}

// Idle waiter connections that died (server restart, CLIENT KILL) are not
// handed to the next wait: it succeeds instead of failing on a dead socket.
func TestStaleWaiterConnections(t *testing.T) {
	for _, c := range []struct {
		name string
		drop func(t *testing.T, srv *testserver.Server, rdb *redis.Client)
	}{
		{"restart", func(t *testing.T, srv *testserver.Server, _ *redis.Client) {
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
		}},
		{"client kill", func(t *testing.T, _ *testserver.Server, rdb *redis.Client) {
			if err := rdb.Do(context.Background(), "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv, rdb, w := setup(t)
			ctx := context.Background()
			// A wait leaves an idle waiter connection behind.
			busy := func() *warden.Hold {
				h, err := w.TryLock(ctx, "k", warden.TTL(300*time.Millisecond))
				if err != nil {
					t.Fatal(err)
				}
				return h
			}
			busy()
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			h, err := w.Lock(dctx, "k")
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			_ = h.Release(ctx)
			c.drop(t, srv, rdb)
			time.Sleep(100 * time.Millisecond)
			busy()
			dctx, cancel = context.WithTimeout(ctx, 5*time.Second)
			h, err = w.Lock(dctx, "k")
			cancel()
			if err != nil {
				t.Fatalf("a wait after the waiter connection died: %v", err)
			}
			_ = h.Release(ctx)
		})
	}
}

// A server paused past ReadTimeout during the fast path: go-redis would
// retry the timed-out LOCK.ACQUIRE on new connections, queueing copies that
// run when the server resumes. The acquire is sent once, and nothing is
// left held once the server resumes.
func TestFastPathNotResentToPausedServer(t *testing.T) {
	srv := testserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	w := warden.New(rdb)
	defer w.Close()
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	srv.Freeze()
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err := w.Lock(dctx, "k")
	cancel()
	srv.Thaw()
	if err == nil {
		t.Fatal("granted by a paused server")
	}
	t.Logf("paused: %v", err)
	waitFor(t, "the server answers", func() bool { return rdb.Ping(ctx).Err() == nil })
	time.Sleep(200 * time.Millisecond)
	if n := calls(t, rdb, "lock.acquire"); n != 1 {
		t.Errorf("LOCK.ACQUIRE ran %d times for one call", n)
	}
	if got := info(t, rdb, "LOCK.INFO", "k"); got != nil {
		t.Errorf("left held after the server resumed: %v", got)
	}
}

// A cancel while go-redis's pool has no free connection (PoolSize 1, taken)
// returns ctx.Err() at once: nothing was sent, nothing to give back first.
func TestCancelWhileGoRedisPoolBusy(t *testing.T) {
	srv := testserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 1})
	defer rdb.Close()
	w := warden.New(rdb)
	defer w.Close()
	ctx := context.Background()
	pinned := rdb.Conn() // takes the pool's only connection
	if err := pinned.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := w.Lock(cctx, "k")
	el := time.Since(start)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	// Generous: the give-back of an acquire never sent waited for the pool (PoolTimeout, 4 s).
	if el > 2*time.Second {
		t.Fatalf("returned %v after the call, cancelled at 100 ms", el)
	}
	_ = pinned.Close()
	if got := info(t, rdb, "LOCK.INFO", "k"); got != nil {
		t.Fatalf("left held: %v", got)
	}
}
