package warden_test

import (
	"context"
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
