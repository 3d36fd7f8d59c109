package warden_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	warden "github.com/warden-redis/warden/go"
	"github.com/warden-redis/warden/go/internal/testserver"
)

// nearOn starts a near cache on w and waits until its connection is up.
func nearOn(t *testing.T, w *warden.Warden, opts ...warden.NearOption) *warden.NearCache {
	t.Helper()
	nc, err := warden.NewNearCache(w, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	syncNear(t, nc)
	return nc
}

func syncNear(t *testing.T, nc *warden.NearCache) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := nc.Sync(ctx); err != nil {
		t.Fatal(err)
	}
}

// nearLoad reads key through nc; a miss loads value.
func nearLoad(t *testing.T, w *warden.Warden, nc *warden.NearCache, key, value string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := warden.Load(ctx, w, key, time.Minute, func(context.Context) (string, error) { return value, nil }, warden.WithNear(nc))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// calls is cmdstat_<cmd>'s calls in INFO commandstats.
func cmdCalls(t *testing.T, rdb *redis.Client, cmd string) int {
	t.Helper()
	s, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(s, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
			return n
		}
	}
	return 0
}

// trackingID is the CLIENT ID of the tracking connection, once it is up.
func trackingID(t *testing.T, rdb *redis.Client) string {
	t.Helper()
	var id string
	waitFor(t, "a tracking connection", func() bool {
		var ok bool
		id, ok = trackingConn(rdb)
		return ok
	})
	return id
}

// kept reads key until the near cache serves it from memory (a load's own
// write invalidates the read that raced it, so that may take a few reads).
func kept(t *testing.T, w *warden.Warden, nc *warden.NearCache, key, value string) {
	t.Helper()
	for range 10 {
		// A push not yet applied (the fill's own invalidation, with the
		// reader unscheduled on a busy machine) refuses the hit: sync first.
		syncNear(t, nc)
		before := nc.Stats().Hits
		nearLoad(t, w, nc, key, value)
		if nc.Stats().Hits > before {
			return
		}
	}
	t.Fatalf("%s is not held: %+v", key, nc.Stats())
}

func TestIntegrationNearHitMakesNoRoundTrip(t *testing.T) {
	_, rdb, w := setup(t)
	nc := nearOn(t, w)
	kept(t, w, nc, "k", "v")
	peeks, gets := cmdCalls(t, rdb, "cache.peek"), cmdCalls(t, rdb, "cache.get")
	hits := nc.Stats().Hits
	for range 100 {
		if v := nearLoad(t, w, nc, "k", "other"); v != "v" {
			t.Fatal(v)
		}
	}
	if p, g := cmdCalls(t, rdb, "cache.peek"), cmdCalls(t, rdb, "cache.get"); p != peeks || g != gets {
		t.Fatalf("hits reached the server: cache.peek %d→%d, cache.get %d→%d", peeks, p, gets, g)
	}
	if h := nc.Stats().Hits; h != hits+100 {
		t.Fatalf("hits %d→%d", hits, h)
	}
}

func TestIntegrationNearInvalidation(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name  string
		write func(rdb *redis.Client) error
		want  string // what the next read returns (the loader's "new" if the key is gone)
	}{
		{"SET", func(rdb *redis.Client) error { return rdb.Set(ctx, "k", "set", 0).Err() }, "set"},
		{"DEL", func(rdb *redis.Client) error { return rdb.Del(ctx, "k").Err() }, "new"},
		{"CACHE.INVALIDATE", func(rdb *redis.Client) error { return rdb.Do(ctx, "CACHE.INVALIDATE", "k").Err() }, "new"},
		{"expiry", func(rdb *redis.Client) error { return rdb.PExpire(ctx, "k", 50*time.Millisecond).Err() }, "new"},
		{"FLUSHALL", func(rdb *redis.Client) error { return rdb.FlushAll(ctx).Err() }, "new"},
	}
	_, rdb, w := setup(t)
	nc := nearOn(t, w)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kept(t, w, nc, "k", "old")
			inv := nc.Stats()
			if err := tc.write(rdb); err != nil {
				t.Fatal(err)
			}
			if tc.name == "expiry" {
				// Dropped by the client's clock at expires_at, whether or
				// not the server's expiry push came first.
				waitFor(t, "the value expired", func() bool { return nearLoad(t, w, nc, "k", "new") == "new" })
				return
			}
			syncNear(t, nc)
			if nc.Len() != 0 {
				t.Fatalf("k still held after %s", tc.name)
			}
			after := nc.Stats()
			if tc.name == "FLUSHALL" && after.Flushes != inv.Flushes+1 || tc.name != "FLUSHALL" && after.Invalidations == inv.Invalidations {
				t.Fatalf("%+v → %+v", inv, after)
			}
			if v := nearLoad(t, w, nc, "k", "new"); v != tc.want {
				t.Fatalf("read %q after %s, want %q", v, tc.name, tc.want)
			}
		})
	}
}

// An invalidation the server has delivered stops hits until it is
// applied: here the reader has read the push and is held before applying
// it, and the read goes to the server (a miss) and returns the new value.
func TestIntegrationNearNoHitWhileAPushIsUnapplied(t *testing.T) {
	ctx := context.Background()
	_, rdb, w := setup(t)
	var hold atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	nc := nearOn(t, w, warden.NearOnPush(func() {
		if hold.CompareAndSwap(true, false) {
			close(held)
			<-release
		}
	}))
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // before Close, which waits for the reader
	kept(t, w, nc, "k", "old")
	hold.Store(true)
	if err := rdb.Set(ctx, "k", "new", 0).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("no push reached the reader")
	}
	before, peeks := nc.Stats(), cmdCalls(t, rdb, "cache.peek")
	read := make(chan string, 1)
	go func() {
		v, _ := warden.Load(ctx, w, "k", time.Minute, func(context.Context) (string, error) { return "loaded", nil }, warden.WithNear(nc))
		read <- v
	}()
	// A hit answers at once; a miss sends CACHE.PEEK on the tracking
	// connection, answered once the reader goes on.
	waitFor(t, "the read", func() bool { return len(read) > 0 || cmdCalls(t, rdb, "cache.peek") > peeks })
	free()
	v := <-read
	after := nc.Stats()
	if v != "new" || after.Hits != before.Hits || after.Misses != before.Misses+1 {
		t.Fatalf("read %q, %+v → %+v", v, before, after)
	}
}

// Invalidate drops the key locally at once: this process reads its write.
func TestIntegrationNearInvalidateReadsOwnWrite(t *testing.T) {
	_, _, w := setup(t)
	nc := nearOn(t, w)
	kept(t, w, nc, "k", "old")
	if err := nc.Invalidate(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
	if v := nearLoad(t, w, nc, "k", "new"); v != "new" {
		t.Fatal(v)
	}
}

// A value marked stale is served through CACHE.GET (which refreshes it)
// and never kept.
func TestIntegrationNearStaleNotKept(t *testing.T) {
	ctx := context.Background()
	_, rdb, w := setup(t)
	nc := nearOn(t, w)
	kept(t, w, nc, "k", "old")
	if err := rdb.Do(ctx, "CACHE.INVALIDATE", "k", "STALE", 60000).Err(); err != nil {
		t.Fatal(err)
	}
	syncNear(t, nc)
	gets := cmdCalls(t, rdb, "cache.get")
	refreshed := make(chan struct{})
	v, err := warden.Load(ctx, w, "k", time.Minute, func(context.Context) (string, error) {
		defer close(refreshed)
		return "new", nil
	}, warden.WithNear(nc))
	if err != nil || v != "old" {
		t.Fatalf("stale read: %q %v", v, err)
	}
	if cmdCalls(t, rdb, "cache.get") == gets {
		t.Fatal("the stale value did not go through CACHE.GET")
	}
	if nc.Len() != 0 {
		t.Fatal("the stale value was kept")
	}
	<-refreshed
	waitFor(t, "the refreshed value", func() bool { return nearLoad(t, w, nc, "k", "x") == "new" })
}

// Concurrent misses of one key run one loader, as without a near cache.
func TestIntegrationNearMissLoadsOnce(t *testing.T) {
	_, _, w := setup(t)
	nc := nearOn(t, w)
	var loads atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			v, err := warden.Load(ctx, w, "k", time.Minute, func(context.Context) (string, error) {
				loads.Add(1)
				time.Sleep(100 * time.Millisecond)
				return "v", nil
			}, warden.WithNear(nc))
			if err == nil && v != "v" {
				err = fmt.Errorf("read %q", v)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := loads.Load(); n != 1 {
		t.Fatalf("%d loads", n)
	}
}

func TestIntegrationNearBounds(t *testing.T) {
	cases := []struct {
		name   string
		opt    warden.NearOption
		values []string // read in order; each held once read twice
		held   []bool   // which are still held at the end
	}{
		{"entries", warden.NearMaxEntries(2), []string{"aaaa", "bbbb", "cccc"}, []bool{false, true, true}},
		{"bytes", warden.NearMaxBytes(10), []string{"aaaa", "bbbb", "cccc"}, []bool{false, true, true}},
		{"a value above max bytes", warden.NearMaxBytes(10), []string{"aaaa", "bbbbbbbbbbb"}, []bool{true, false}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, w := setup(t)
			nc := nearOn(t, w, tc.opt)
			for i, v := range tc.values {
				for range 3 {
					nearLoad(t, w, nc, fmt.Sprint("k", i), v)
					syncNear(t, nc)
				}
			}
			n := 0
			for _, h := range tc.held {
				if h {
					n++
				}
			}
			if nc.Len() != n {
				t.Fatalf("%d held, want %d", nc.Len(), n)
			}
			for i, h := range tc.held {
				before := nc.Stats().Hits
				nearLoad(t, w, nc, fmt.Sprint("k", i), tc.values[i])
				if hit := nc.Stats().Hits > before; hit != h {
					t.Fatalf("k%d hit %v, want %v", i, hit, h)
				}
				if !h {
					break // the miss kept it again, evicting another
				}
			}
		})
	}
}

// Losing the tracking connection (killed, or the server restarted) drops
// everything; the near cache reconnects and is used again.
func TestIntegrationNearFlushOnDrop(t *testing.T) {
	cases := []struct {
		name string
		drop func(t *testing.T, srv *testserver.Server, rdb *redis.Client)
	}{
		{"CLIENT KILL", func(t *testing.T, _ *testserver.Server, rdb *redis.Client) {
			if err := rdb.Do(context.Background(), "CLIENT", "KILL", "ID", trackingID(t, rdb)).Err(); err != nil {
				t.Fatal(err)
			}
		}},
		{"server restart", func(t *testing.T, srv *testserver.Server, _ *redis.Client) {
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv, rdb, w := setup(t)
			nc := nearOn(t, w)
			kept(t, w, nc, "k", "old")
			flushes := nc.Stats().Flushes
			tc.drop(t, srv, rdb)
			waitFor(t, "a flush", func() bool { return nc.Stats().Flushes > flushes })
			if nc.Len() != 0 {
				t.Fatal("values kept across a drop")
			}
			syncNear(t, nc)
			if err := rdb.Set(context.Background(), "k", "new", 0).Err(); err != nil {
				t.Fatal(err)
			}
			kept(t, w, nc, "k", "x")
			if v := nearLoad(t, w, nc, "k", "x"); v != "new" {
				t.Fatal(v)
			}
		})
	}
}

func TestIntegrationNearClose(t *testing.T) {
	_, rdb, w := setup(t)
	nc, err := warden.NewNearCache(w)
	if err != nil {
		t.Fatal(err)
	}
	syncNear(t, nc)
	kept(t, w, nc, "k", "v")
	if err := nc.Close(); err != nil {
		t.Fatal(err)
	}
	if nc.Len() != 0 {
		t.Fatal("values kept after Close")
	}
	waitFor(t, "the tracking connection gone", func() bool {
		list, _ := rdb.ClientList(context.Background()).Result()
		for _, line := range strings.Split(list, "\n") {
			for _, f := range strings.Fields(line) {
				if strings.HasPrefix(f, "flags=") && strings.Contains(f, "t") {
					return false
				}
			}
		}
		return true
	})
	hits := nc.Stats().Hits
	if v := nearLoad(t, w, nc, "k", "x"); v != "v" || nc.Stats().Hits != hits {
		t.Fatalf("read %q after Close, hits %d→%d", v, hits, nc.Stats().Hits)
	}
	if err := nc.Sync(context.Background()); err != warden.ErrClosed {
		t.Fatal(err)
	}
}

func BenchmarkNearHit(b *testing.B) {
	srv := testserver.Start(b)
	rdb := srv.Client(b)
	w := warden.New(rdb)
	defer w.Close()
	nc, err := warden.NewNearCache(w)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	ctx := context.Background()
	if err := nc.Sync(ctx); err != nil {
		b.Fatal(err)
	}
	load := func(context.Context) (string, error) { return "value", nil }
	near := warden.WithNear(nc)
	for range 2 {
		if _, err := warden.Load(ctx, w, "k", time.Minute, load, near); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("near hit", func(b *testing.B) {
		for b.Loop() {
			_, _ = warden.Load(ctx, w, "k", time.Minute, load, near)
		}
	})
	b.Run("CACHE.GET hit", func(b *testing.B) {
		for b.Loop() {
			_, _ = warden.Load(ctx, w, "k", time.Minute, load)
		}
	})
}
