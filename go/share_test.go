package warden_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	warden "github.com/warden-redis/warden/go"
	"github.com/warden-redis/warden/go/internal/testserver"
)

// One hold released from 10 goroutines at once, while its watchdog renews
// every 10 ms: every Release gives the same answer (nil; or ErrNotHeld when
// the 30 ms lease ran out before a renewal on a busy machine), a hold is
// freed by one RELEASE at most, and no EXTEND follows it.
func TestReleaseFromManyGoroutines(t *testing.T) {
	_, rdb, w := setup(t, warden.WithWatchdogTTL(30*time.Millisecond))
	ctx := context.Background()
	released := int64(0)
	for i := range 20 {
		h, err := w.TryLock(ctx, "k")
		if errors.Is(err, warden.ErrNotAcquired) {
			// The last hold lapsed here before its RELEASE: the server's
			// lease ends a moment later.
			waitFor(t, "the lapsed hold's lease", func() bool { return info(t, rdb, "LOCK.INFO", "k") == nil })
			h, err = w.TryLock(ctx, "k")
		}
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(i%4) * 5 * time.Millisecond)
		var wg sync.WaitGroup
		errs := make([]error, 10)
		for g := range errs {
			wg.Add(1)
			go func() { defer wg.Done(); errs[g] = h.Release(ctx) }()
		}
		wg.Wait()
		for _, err := range errs {
			if err != errs[0] || err != nil && !errors.Is(err, warden.ErrNotHeld) {
				t.Fatalf("Release from 10 goroutines: %v", errs)
			}
		}
		if errs[0] == nil {
			released++
		}
		if h.Context().Err() == nil {
			t.Fatal("Context alive after Release")
		}
	}
	if n := calls(t, rdb, "lock.release"); n < released || n > 20 {
		t.Fatalf("LOCK.RELEASE ran %d times for 20 holds, %d released", n, released)
	}
	if released == 0 {
		t.Fatal("no hold lasted until its Release")
	}
	waitFor(t, "the key free", func() bool { return info(t, rdb, "LOCK.INFO", "k") == nil })
	before := calls(t, rdb, "lock.extend")
	time.Sleep(50 * time.Millisecond)
	if n := calls(t, rdb, "lock.extend") - before; n != 0 {
		t.Fatalf("%d EXTENDs after every Release returned", n)
	}
}

// A slot moved to another master while the client's slot map is stale: a
// wait on a key of that slot goes to the key's new master and is granted
// there, not answered MOVED.
func TestClusterSlotMovedBeforeWait(t *testing.T) {
	nodes := testserver.Cluster(t, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr()}})
	defer rdb.Close()
	w := warden.New(rdb)
	defer w.Close()
	ctx := context.Background()
	const key = "moving"
	src, err := rdb.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	slot, err := rdb.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	var dst *testserver.Server
	for _, n := range nodes {
		if n.Addr() != src.Options().Addr {
			dst = n
			break
		}
	}
	dstID, err := dst.Client(t).ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if err := n.Client(t).Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err(); err != nil {
			t.Fatal(err)
		}
	}
	holder := dst.Client(t)
	if err := holder.Do(ctx, "LOCK.ACQUIRE", key, "other", 60000).Err(); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(300*time.Millisecond, func() { holder.Do(ctx, "LOCK.RELEASE", key, "other") })
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	h, err := w.Lock(dctx, key, warden.TTL(time.Minute))
	if err != nil {
		t.Fatalf("a wait on a moved slot: %v", err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
