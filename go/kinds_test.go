package warden_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	warden "github.com/warden-redis/warden/go"
	"github.com/warden-redis/warden/go/internal/testserver"
)

func TestIntegrationReadWriteLock(t *testing.T) {
	_, rdb, w := setup(t)
	ctx := context.Background()
	r1, err := w.RLock(ctx, "rw")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := w.TryRLock(ctx, "rw")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.TryWLock(ctx, "rw"); !errors.Is(err, warden.ErrNotAcquired) {
		t.Fatalf("TryWLock under readers: %v", err)
	}
	got := make(chan *warden.Hold, 1)
	go func() {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		wh, err := w.WLock(dctx, "rw")
		if err != nil {
			t.Error(err)
		}
		got <- wh
	}()
	for info(t, rdb, "RWLOCK.INFO", "rw")["waiters"] != int64(1) {
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := w.TryRLock(ctx, "rw"); !errors.Is(err, warden.ErrNotAcquired) {
		t.Fatalf("a new reader overtook a waiting writer: %v", err)
	}
	if err := errors.Join(r1.Release(ctx), r2.Release(ctx)); err != nil {
		t.Fatal(err)
	}
	wh := <-got
	if wh.Fence() <= r2.Fence() {
		t.Fatalf("writer fence %d after reader fence %d", wh.Fence(), r2.Fence())
	}
	if m := info(t, rdb, "RWLOCK.INFO", "rw")["mode"]; m != "write" {
		t.Fatalf("mode %v", m)
	}
	if err := wh.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestIntegrationSemaphore(t *testing.T) {
	_, rdb, w := setup(t)
	ctx := context.Background()
	sem := w.Semaphore("sem", 3)
	big, err := sem.Acquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	one, err := sem.TryAcquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sem.TryAcquire(ctx, 1); !errors.Is(err, warden.ErrNotAcquired) {
		t.Fatalf("a fourth permit: %v", err)
	}
	if _, err := w.Semaphore("sem", 4).TryAcquire(ctx, 1); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("another limit: %v", err)
	}
	if m := info(t, rdb, "SEM.INFO", "sem"); m["used"] != int64(3) || big.N() != 2 {
		t.Fatalf("SEM.INFO %v", m)
	}
	dctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
	_, err = sem.Acquire(dctx, 2)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire(2) with one free: %v", err)
	}
	if err := big.Release(ctx); err != nil {
		t.Fatal(err)
	}
	two, err := sem.Acquire(ctx, 2, warden.Wait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(one.Release(ctx), two.Release(ctx)); err != nil {
		t.Fatal(err)
	}
	if m := info(t, rdb, "SEM.INFO", "sem"); m != nil {
		t.Fatalf("left: %v", m)
	}
}

// A hold without TTL is renewed by its watchdog past its lease; a hold with
// TTL is lost at its lease end: Context is cancelled and Release says ErrNotHeld.
func TestIntegrationWatchdogAndLoss(t *testing.T) {
	// A 1 s watchdog lease: a shorter one is lost whenever a busy machine
	// stalls the renewing goroutine past it.
	_, rdb, w := setup(t, warden.WithWatchdogTTL(time.Second))
	ctx := context.Background()
	kept, err := w.Lock(ctx, "kept")
	if err != nil {
		t.Fatal(err)
	}
	leased, err := w.Lock(ctx, "leased", warden.TTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-leased.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Context of a lapsed hold not cancelled")
	}
	if !errors.Is(context.Cause(leased.Context()), warden.ErrNotHeld) {
		t.Fatalf("cause %v", context.Cause(leased.Context()))
	}
	if err := leased.Release(ctx); !errors.Is(err, warden.ErrNotHeld) {
		t.Fatalf("Release of a lapsed hold: %v", err)
	}
	time.Sleep(2200 * time.Millisecond) // more than twice the watchdog's lease
	if kept.Context().Err() != nil || info(t, rdb, "LOCK.INFO", "kept")["owner"] != kept.Owner() {
		t.Fatal("the watchdog did not keep the hold")
	}
	// Taken away on the server: the next renewal finds it gone.
	rdb.Del(ctx, "kept")
	select {
	case <-kept.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Context of a deleted hold not cancelled")
	}
	if err := kept.Release(ctx); !errors.Is(err, warden.ErrNotHeld) {
		t.Fatalf("Release of a deleted hold: %v", err)
	}
	before := calls(t, rdb, "lock.extend")
	time.Sleep(700 * time.Millisecond) // two renewal periods
	if calls(t, rdb, "lock.extend") != before {
		t.Fatal("EXTEND sent after the hold was lost")
	}
}

// Release's reply is the last command of a hold: no watchdog EXTEND after it.
func TestIntegrationNoExtendAfterRelease(t *testing.T) {
	_, rdb, w := setup(t, warden.WithWatchdogTTL(30*time.Millisecond))
	ctx := context.Background()
	for i := range 50 {
		h, err := w.Lock(ctx, fmt.Sprint("k", i))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(i%12) * time.Millisecond)
		// ErrNotHeld: a renewal came too late for the 30 ms lease on a busy
		// machine; what is checked is that no EXTEND follows the reply.
		if err := h.Release(ctx); err != nil && !errors.Is(err, warden.ErrNotHeld) {
			t.Fatal(err)
		}
	}
	before := calls(t, rdb, "lock.extend")
	time.Sleep(100 * time.Millisecond)
	if after := calls(t, rdb, "lock.extend"); after != before {
		t.Fatalf("%d EXTENDs after every Release returned", after-before)
	}
}

func TestIntegrationWithLock(t *testing.T) {
	_, rdb, w := setup(t)
	ctx := context.Background()
	var ran bool
	err := w.WithLock(ctx, "job", func(ctx context.Context) error {
		ran = info(t, rdb, "LOCK.INFO", "job") != nil
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("WithLock: %v, ran with the lock held: %v", err, ran)
	}
	boom := errors.New("boom")
	if err := w.WithLock(ctx, "job", func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("fn's error: %v", err)
	}
	// The hold lost under fn: fn's context ends and WithLock says so.
	err = w.WithLock(ctx, "job", func(ctx context.Context) error {
		rdb.Del(context.Background(), "job")
		<-ctx.Done()
		return nil
	}, warden.TTL(100*time.Millisecond))
	if !errors.Is(err, warden.ErrNotHeld) {
		t.Fatalf("a lost hold: %v", err)
	}
	if info(t, rdb, "LOCK.INFO", "job") != nil {
		t.Fatal("lock left behind")
	}
}

type user struct {
	ID   int    `json:"id"`
	Name string `json:"name"`
}

// Load: one loader across concurrent callers, JSON and raw values, a loader
// error abandons the lease and the next caller loads.
func TestIntegrationLoad(t *testing.T) {
	_, rdb, w := setup(t)
	ctx := context.Background()
	var loads atomic.Int64
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			u, err := warden.Load(dctx, w, "user:1", time.Minute, func(context.Context) (user, error) {
				loads.Add(1)
				time.Sleep(100 * time.Millisecond)
				return user{1, "Ada"}, nil
			})
			if err != nil || u.Name != "Ada" {
				t.Errorf("%v %v", u, err)
			}
		}()
	}
	wg.Wait()
	if loads.Load() != 1 {
		t.Fatalf("%d loads", loads.Load())
	}
	if s, _ := rdb.Get(ctx, "user:1").Result(); s != `{"id":1,"name":"Ada"}` {
		t.Fatalf("stored %q", s)
	}
	raw, err := warden.Load(ctx, w, "raw", 0, func(context.Context) ([]byte, error) { return []byte("bytes"), nil })
	if err != nil || string(raw) != "bytes" || rdb.Get(ctx, "raw").Val() != "bytes" {
		t.Fatalf("raw: %q %v", raw, err)
	}
	boom := errors.New("db down")
	if _, err := warden.Load(ctx, w, "e", time.Minute, func(context.Context) (string, error) { return "", boom }); !errors.Is(err, boom) {
		t.Fatalf("loader error: %v", err)
	}
	if lease := info(t, rdb, "CACHE.INFO", "e")["lease"]; lease != nil {
		t.Fatalf("lease not abandoned: %v", lease)
	}
	v, err := warden.Load(ctx, w, "e", time.Minute, func(context.Context) (string, error) { return "ok", nil })
	if err != nil || v != "ok" {
		t.Fatalf("%q %v", v, err)
	}
}

// go-redis's own Bloom filter commands work unchanged against warden's BF.*.
func TestIntegrationGoRedisBloom(t *testing.T) {
	_, rdb, _ := setup(t)
	ctx := context.Background()
	if err := rdb.BFReserve(ctx, "bf", 0.01, 1000).Err(); err != nil {
		t.Fatal(err)
	}
	if added, err := rdb.BFAdd(ctx, "bf", "a").Result(); err != nil || !added {
		t.Fatalf("BFAdd: %v %v", added, err)
	}
	if ex, err := rdb.BFExists(ctx, "bf", "a").Result(); err != nil || !ex {
		t.Fatalf("BFExists: %v %v", ex, err)
	}
	if ex, err := rdb.BFExists(ctx, "bf", "zz").Result(); err != nil || ex {
		t.Fatalf("BFExists absent: %v %v", ex, err)
	}
	if r, err := rdb.BFMAdd(ctx, "bf", "b", "c", "a").Result(); err != nil || fmt.Sprint(r) != "[true true false]" {
		t.Fatalf("BFMAdd: %v %v", r, err)
	}
	if r, err := rdb.BFMExists(ctx, "bf", "b", "x").Result(); err != nil || fmt.Sprint(r) != "[true false]" {
		t.Fatalf("BFMExists: %v %v", r, err)
	}
	if n, err := rdb.BFCard(ctx, "bf").Result(); err != nil || n != 3 {
		t.Fatalf("BFCard: %v %v", n, err)
	}
	bi, err := rdb.BFInfo(ctx, "bf").Result()
	if err != nil || bi.Capacity != 1000 || bi.ItemsInserted != 3 {
		t.Fatalf("BFInfo: %+v %v", bi, err)
	}
	if r, err := rdb.BFInsert(ctx, "bf2", &redis.BFInsertOptions{Capacity: 100, Error: 0.001}, "x", "y").Result(); err != nil || len(r) != 2 {
		t.Fatalf("BFInsert: %v %v", r, err)
	}
	if err := rdb.BFReserve(ctx, "bf", 0.01, 10).Err(); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("BFReserve of an existing key: %v", err)
	}
}

// A 3-master cluster: keys on different nodes, locks waiting on each.
func TestIntegrationCluster(t *testing.T) {
	nodes := testserver.Cluster(t, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr()}})
	defer rdb.Close()
	w := warden.New(rdb)
	defer w.Close()
	ctx := context.Background()
	seen := map[string]bool{}
	for _, key := range []string{"a", "b", "c", "d", "e", "f"} {
		m, err := rdb.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		seen[m.Options().Addr] = true
		h, err := w.TryLock(ctx, key, warden.TTL(time.Minute))
		if err != nil {
			t.Fatal(key, err)
		}
		// A waiter on the key's own node, released by the holder.
		got := make(chan error, 1)
		go func() {
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			h2, err := w.Lock(dctx, key)
			if err == nil {
				err = h2.Release(ctx)
			}
			got <- err
		}()
		time.Sleep(20 * time.Millisecond)
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(key, err)
		}
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		v, err := warden.Load(dctx, w, "cache:"+key, time.Minute, func(context.Context) (string, error) { return key, nil })
		cancel()
		if err != nil || v != key {
			t.Fatal(v, err)
		}
		// A rate limiter's wait, on a waiter connection to the key's node.
		l := w.RateLimiter("rate:"+key, 10, time.Second, warden.Burst(1))
		dctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		err = errors.Join(l.Wait(dctx), l.Wait(dctx))
		cancel()
		if i, ierr := l.Info(ctx); err != nil || ierr != nil || i != nil && i.Waiters != 0 {
			t.Fatal(key, err, ierr, i)
		}
	}
	if len(seen) != 3 {
		t.Fatalf("keys on %d nodes", len(seen))
	}
}

// A Sentinel failover under a hold: the replica had the hold, so after the
// promotion Extend keeps it and Context stays alive; a new waiter reaches
// the new master.
func TestSentinelFailoverUnderHold(t *testing.T) {
	master := testserver.Start(t)
	replica := master.Replica(t)
	sentinel := testserver.Sentinel(t, master, "m")
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{sentinel.Addr()}})
	defer rdb.Close()
	w := warden.New(rdb)
	defer w.Close()
	ctx := context.Background()
	h, err := w.Lock(ctx, "k", warden.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	mrdb := master.Client(t)
	if err := mrdb.Do(ctx, "WAIT", 1, 5000).Err(); err != nil {
		t.Fatal(err)
	}
	srdb := sentinel.Client(t)
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		reps, _ := srdb.Do(ctx, "SENTINEL", "REPLICAS", "m").Slice()
		if len(reps) == 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("sentinel never saw the replica")
		}
	}
	// Sentinel lists a replica before it counts it as promotable (fresh
	// INFO, link up): NOGOODSLAVE until then.
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		err := srdb.Do(ctx, "SENTINEL", "FAILOVER", "m").Err()
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "NOGOODSLAVE") || time.Now().After(end) {
			t.Fatal(err)
		}
	}
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		addr, _ := srdb.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "m").StringSlice()
		if len(addr) == 2 && addr[1] == fmt.Sprint(replica.Port) {
			break
		}
		if time.Now().After(end) {
			t.Fatal("no failover")
		}
	}
	var extendErr error
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if extendErr = h.Extend(ctx, time.Minute); extendErr == nil {
			break
		}
	}
	if extendErr != nil || h.Context().Err() != nil {
		t.Fatalf("after the failover: Extend %v, Context %v", extendErr, h.Context().Err())
	}
	if got := info(t, replica.Client(t), "LOCK.INFO", "k")["owner"]; got != h.Owner() {
		t.Fatalf("the new master's holder: %v", got)
	}
	done := make(chan error, 1)
	go func() {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		h2, err := w.Lock(dctx, "k")
		if err == nil {
			err = h2.Release(ctx)
		}
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
