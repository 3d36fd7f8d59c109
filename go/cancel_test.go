package warden_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	warden "github.com/warden-redis/warden/go"
	"github.com/warden-redis/warden/go/internal/testserver"
)

// withdrawCases are the two ways a cancel takes a waiter out: WARDEN.WITHDRAW
// (every server), and, where an ACL refuses it, the fallbacks (CLIENT
// UNBLOCK on Redis 7.4+ and Valkey 8+, else CLIENT KILL).
var withdrawCases = []struct {
	name string
	deny bool // the client's user may not run WARDEN.WITHDRAW
}{
	{"WITHDRAW", false},
	{"ACL -warden.withdraw", true},
}

// setupCancel is setup, with the go-redis client (and so the Warden's
// waiter connections) logged in as a user refused WARDEN.WITHDRAW when deny.
func setupCancel(t *testing.T, deny bool) (*testserver.Server, *redis.Client, *warden.Warden) {
	t.Helper()
	if !deny {
		return setup(t)
	}
	srv := testserver.Start(t)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	err := admin.Do(context.Background(), "ACL", "SETUSER", "nowithdraw",
		"on", ">pw", "~*", "&*", "+@all", "-warden.withdraw").Err()
	_ = admin.Close() // the tests count the server's clients: rdb's and warden's only
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "nowithdraw", Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	w := warden.New(rdb)
	t.Cleanup(func() { _ = w.Close() })
	return srv, rdb, w
}

// waitKinds are the waits WARDEN.WITHDRAW takes out: each with a holder's
// commands that keep the key busy, and the Warden call that waits on it.
var waitKinds = []struct {
	name, info    string
	hold, release func(key string) []any
	wait          func(ctx context.Context, w *warden.Warden, key string) (interface{ Release(context.Context) error }, error)
}{
	{
		"lock", "LOCK.INFO",
		func(k string) []any { return []any{"LOCK.ACQUIRE", k, "holder", 60000} },
		func(k string) []any { return []any{"LOCK.RELEASE", k, "holder"} },
		func(ctx context.Context, w *warden.Warden, k string) (interface{ Release(context.Context) error }, error) {
			return w.Lock(ctx, k, warden.TTL(time.Minute))
		},
	},
	{
		"read", "RWLOCK.INFO",
		func(k string) []any { return []any{"RWLOCK.WRITE", k, "holder", 60000} },
		func(k string) []any { return []any{"RWLOCK.UNLOCK", k, "holder"} },
		func(ctx context.Context, w *warden.Warden, k string) (interface{ Release(context.Context) error }, error) {
			return w.RLock(ctx, k, warden.TTL(time.Minute))
		},
	},
	{
		"write", "RWLOCK.INFO",
		func(k string) []any { return []any{"RWLOCK.READ", k, "holder", 60000} },
		func(k string) []any { return []any{"RWLOCK.UNLOCK", k, "holder"} },
		func(ctx context.Context, w *warden.Warden, k string) (interface{ Release(context.Context) error }, error) {
			return w.WLock(ctx, k, warden.TTL(time.Minute))
		},
	},
	{
		"semaphore", "SEM.INFO",
		func(k string) []any { return []any{"SEM.ACQUIRE", k, "holder", 60000, "LIMIT", 1} },
		func(k string) []any { return []any{"SEM.RELEASE", k, "holder"} },
		func(ctx context.Context, w *warden.Warden, k string) (interface{ Release(context.Context) error }, error) {
			return w.Semaphore(k, 1).Acquire(ctx, 1, warden.TTL(time.Minute))
		},
	},
}

// startWait runs kind's wait on key in the background until cancel; the
// returned channel has its error (a grant is released and reported).
func startWait(w *warden.Warden, wait func(context.Context, *warden.Warden, string) (interface{ Release(context.Context) error }, error), key string) (context.CancelFunc, <-chan error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		h, err := wait(ctx, w, key)
		if err == nil {
			_ = h.Release(context.Background())
			err = errors.New("granted")
		}
		done <- err
	}()
	return cancel, done
}

// blockedClient is the id of the one client blocked on the server (the waiter).
func blockedClient(t *testing.T, rdb *redis.Client) string {
	t.Helper()
	s, err := rdb.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	id := ""
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, " flags=b ") {
			if id != "" {
				t.Fatalf("more than one blocked client: %s", s)
			}
			id = strings.TrimPrefix(strings.Fields(line)[0], "id=")
		}
	}
	if id == "" {
		t.Fatalf("no blocked client: %s", s)
	}
	return id
}

// connected tells whether the client id is connected to the server.
func connected(t *testing.T, rdb *redis.Client, id string) bool {
	t.Helper()
	s, err := rdb.Do(context.Background(), "CLIENT", "LIST", "ID", id).Text()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(s) != ""
}

// withdrawStats is INFO commandstats' calls and rejected_calls of WARDEN.WITHDRAW.
func withdrawStats(t *testing.T, rdb *redis.Client) (calls, rejected int64) {
	t.Helper()
	s, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(s, "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_warden.withdraw:")
		if !ok {
			continue
		}
		for _, f := range strings.Split(v, ",") {
			name, n, _ := strings.Cut(f, "=")
			switch name {
			case "calls":
				calls, _ = strconv.ParseInt(n, 10, 64)
			case "rejected_calls":
				rejected, _ = strconv.ParseInt(n, 10, 64)
			}
		}
	}
	return calls, rejected
}

// A cancelled wait on a lock, a read or write lock or a semaphore is out of
// the server's queue when the call returns, and nobody is granted. With
// WARDEN.WITHDRAW the waiter's connection is kept on every server (the next
// wait runs on it); refused it by an ACL, the client falls back to CLIENT
// UNBLOCK where the server takes a module's waiter out with it (Redis 7.4+,
// Valkey 8+: kept), else to CLIENT KILL (closed), and asks no more.
func TestIntegrationCancelTakesWaiterOut(t *testing.T) {
	for _, c := range withdrawCases {
		t.Run(c.name, func(t *testing.T) {
			_, rdb, w := setupCancel(t, c.deny)
			ctx := context.Background()
			kept := !c.deny || unblocks(t, rdb)
			last := ""
			for _, k := range waitKinds {
				key := "out:" + k.name
				if err := rdb.Do(ctx, k.hold(key)...).Err(); err != nil {
					t.Fatal(err)
				}
				for round := range 2 {
					what := fmt.Sprintf("%s, round %d", k.name, round)
					cancel, done := startWait(w, k.wait, key)
					waitFor(t, what+": a waiter", func() bool { return info(t, rdb, k.info, key)["waiters"] == int64(1) })
					id := blockedClient(t, rdb)
					if last != "" && (id == last) != kept {
						t.Fatalf("%s: waiter connection %s after %s (kept: %v)", what, id, last, kept)
					}
					cancel()
					if err := <-done; !errors.Is(err, context.Canceled) {
						t.Fatalf("%s: cancelled: %v", what, err)
					}
					if n := info(t, rdb, k.info, key)["waiters"]; n != int64(0) {
						t.Fatalf("%s: %v waiters once the call returned", what, n)
					}
					if kept {
						if !connected(t, rdb, id) {
							t.Fatalf("%s: the waiter connection was closed", what)
						}
					} else {
						waitFor(t, what+": the waiter connection closed", func() bool { return !connected(t, rdb, id) })
					}
					last = id
				}
				if err := rdb.Do(ctx, k.release(key)...).Err(); err != nil {
					t.Fatal(err)
				}
				if got := info(t, rdb, k.info, key); got != nil {
					t.Fatalf("%s: granted to a cancelled waiter: %v", k.name, got)
				}
			}
			calls, rejected := withdrawStats(t, rdb)
			if c.deny && (calls != 0 || rejected != 1) {
				t.Fatalf("WARDEN.WITHDRAW refused by the ACL: %d calls, %d rejected, want 0 and 1 (refused once, then not sent)", calls, rejected)
			}
			if !c.deny && calls != int64(2*len(waitKinds)) {
				t.Fatalf("WARDEN.WITHDRAW: %d calls for %d cancels", calls, 2*len(waitKinds))
			}
		})
	}
}

// A grant that reaches a waiter after its caller cancelled is given back.
// The holder's release and the cancel's WARDEN.WITHDRAW reach a stopped
// server in that order, so the server grants the waiter first and then
// finds nothing to withdraw (0): the client falls back to CLIENT UNBLOCK or
// CLIENT KILL, reads the grant and releases it.
func TestIntegrationGrantRacingCancelGivenBack(t *testing.T) {
	for _, c := range withdrawCases {
		t.Run(c.name, func(t *testing.T) {
			srv, rdb, w := setupCancel(t, c.deny)
			ctx := context.Background()
			raced := 0
			for _, k := range waitKinds {
				key := "race:" + k.name
				if err := rdb.Do(ctx, k.hold(key)...).Err(); err != nil {
					t.Fatal(err)
				}
				cancel, done := startWait(w, k.wait, key)
				waitFor(t, k.name+": a waiter", func() bool { return info(t, rdb, k.info, key)["waiters"] == int64(1) })
				grants := infoField(t, rdb, "warden", "warden_grants")
				srv.Freeze()
				released := make(chan error, 1)
				go func() { released <- rdb.Do(ctx, k.release(key)...).Err() }()
				time.Sleep(50 * time.Millisecond) // the release is on the server's socket first
				cancel()
				time.Sleep(50 * time.Millisecond) // then the cancel's WARDEN.WITHDRAW
				srv.Thaw()
				if err := <-done; !errors.Is(err, context.Canceled) {
					t.Fatalf("%s: cancelled: %v", k.name, err)
				}
				if err := <-released; err != nil {
					t.Fatal(err)
				}
				if got := info(t, rdb, k.info, key); got != nil {
					t.Fatalf("%s: held after the cancel: %v", k.name, got)
				}
				if infoField(t, rdb, "warden", "warden_grants") > grants {
					raced++
				}
			}
			t.Logf("the cancelled waiter was granted (and gave it back) %d times of %d", raced, len(waitKinds))
			if raced == 0 {
				t.Fatal("the release never reached the server before the cancel: no grant raced it")
			}
		})
	}
}
