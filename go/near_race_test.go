package warden_test

import (
	"context"
	"fmt"
	"os"
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

// racePairs is how many write/read pairs a race check runs: 10,000, or
// WARDEN_NEAR_RACE_PAIRS.
func racePairs(t *testing.T) int {
	if s := os.Getenv("WARDEN_NEAR_RACE_PAIRS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("WARDEN_NEAR_RACE_PAIRS=%q", s)
		}
		return n
	}
	return 10_000
}

// chaos is something that drops the near cache's connection; it reports
// whether it did (false: there was no tracking connection to drop).
type chaos struct {
	name string
	do   func() (bool, error)
}

// raceCheck runs pairs write/read pairs on several goroutines, each owning
// a few keys: SET k v+1 and GET k (the server's truth, y) on plain, then
// nc.Sync, then reads through the near cache (x). A read is stale when
// x < y. The chaos events run spread over the pairs.
func raceCheck(t *testing.T, plain *redis.Client, replicated *atomic.Bool, w *warden.Warden, nc *warden.NearCache, pairs int, events []chaos) {
	const workers, keysEach = 4, 3
	var next, finished, stale, errs atomic.Int64
	var wg sync.WaitGroup
	before := nc.Stats()
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			values := map[string]int{}
			for {
				i := next.Add(1)
				if i > int64(pairs) {
					return
				}
				key := fmt.Sprintf("race:%d:%d", g, i%keysEach)
				values[key]++
				if !racePair(plain, replicated, w, nc, key, values[key], &stale) {
					errs.Add(1)
				}
				finished.Add(1)
			}
		}()
	}
	seen := 0
	for i, ev := range events {
		at := int64(pairs) * int64(i+1) / int64(len(events)+1)
		for finished.Load() < at && next.Load() <= int64(pairs) {
			time.Sleep(time.Millisecond)
		}
		start := time.Now()
		did, err := ev.do()
		t.Logf("%s: %v in %v", ev.name, did, time.Since(start).Round(time.Millisecond))
		if err != nil {
			t.Errorf("%s: %v", ev.name, err)
		}
		if did {
			seen++
		}
	}
	wg.Wait()
	after := nc.Stats()
	hits, flushes := after.Hits-before.Hits, after.Flushes-before.Flushes
	t.Logf("near race (%s): pairs=%d stale=%d errors=%d hits=%d flushes=%d chaos=%d",
		testserver.Binary(), finished.Load(), stale.Load(), errs.Load(), hits, flushes, seen)
	if stale.Load() != 0 {
		t.Errorf("%d stale reads", stale.Load())
	}
	if finished.Load() != int64(pairs) {
		t.Errorf("%d of %d pairs finished", finished.Load(), pairs)
	}
	if hits == 0 {
		t.Error("the near cache was never used")
	}
	if flushes < uint64(seen) {
		t.Errorf("%d flushes for %d drops", flushes, seen)
	}
}

// racePair runs one pair; ok false counts it as an error (chaos).
func racePair(plain *redis.Client, replicated *atomic.Bool, w *warden.Warden, nc *warden.NearCache, key string, v int, stale *atomic.Int64) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if !retry(ctx, func() error {
		if err := plain.Set(ctx, key, v, 0).Err(); err != nil {
			return err
		}
		// Acknowledged by the replica too, until the failover: it must not
		// take the write back (that would be lost, not stale). After it
		// the old master rejoins as a replica only when Sentinel gets to it.
		if replicated.Load() {
			if acks, err := plain.Do(ctx, "WAIT", 1, 1000).Int(); err != nil || acks < 1 {
				return fmt.Errorf("WAIT: %d %v", acks, err)
			}
		}
		return nil
	}) {
		return false
	}
	var y int
	if !retry(ctx, func() (err error) {
		y, err = plain.Get(ctx, key).Int()
		return err
	}) {
		return false
	}
	if err := nc.Sync(ctx); err != nil {
		return false
	}
	load := func(ctx context.Context) (string, error) { return plain.Get(ctx, key).Result() }
	x := 0
	for range 3 {
		s, err := warden.Load(ctx, w, key, 0, load, warden.WithNear(nc))
		if err != nil {
			return false
		}
		if x, err = strconv.Atoi(s); err != nil {
			return false
		}
		if x < y {
			stale.Add(1)
		}
	}
	return true
}

// retry runs f until it succeeds or ctx ends.
func retry(ctx context.Context, f func() error) bool {
	for {
		if f() == nil {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// trackingConn is the CLIENT ID of the connection with tracking on (flag t).
func trackingConn(rdb *redis.Client) (string, bool) {
	list, err := rdb.ClientList(context.Background()).Result()
	if err != nil {
		return "", false
	}
	for _, line := range strings.Split(list, "\n") {
		f := map[string]string{}
		for _, kv := range strings.Fields(line) {
			k, v, _ := strings.Cut(kv, "=")
			f[k] = v
		}
		if strings.Contains(f["flags"], "t") {
			return f["id"], true
		}
	}
	return "", false
}

// killTracking kills nc's tracking connection, once it is up (false: it
// did not come up).
func killTracking(rdb *redis.Client, nc *warden.NearCache) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = nc.Sync(ctx)
	id, ok := trackingConn(rdb)
	if !ok {
		return false, nil
	}
	return rdb.Do(context.Background(), "CLIENT", "KILL", "ID", id).Err() == nil, nil
}

func TestIntegrationNearRace(t *testing.T) {
	srv := testserver.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	plain := srv.Client(t)
	w := warden.New(srv.Client(t))
	t.Cleanup(func() { _ = w.Close() })
	nc := nearOn(t, w)
	kill := chaos{"kill the tracking connection", func() (bool, error) { return killTracking(plain, nc) }}
	restart := chaos{"restart the server", func() (bool, error) {
		_, up := trackingConn(plain)
		return up, srv.Restart()
	}}
	raceCheck(t, plain, new(atomic.Bool), w, nc, racePairs(t), []chaos{kill, restart, kill, restart, kill})
}

// The same through Sentinel (1 master, 1 replica, 1 sentinel), with a
// failover between kills of the tracking connection.
func TestIntegrationNearRaceSentinel(t *testing.T) {
	master := testserver.Start(t)
	replica := master.Replica(t)
	sentinel := testserver.Sentinel(t, master, "m")
	failoverClient := func() *redis.Client {
		rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{sentinel.Addr()}})
		t.Cleanup(func() { _ = rdb.Close() })
		return rdb
	}
	plain := failoverClient()
	replicated := new(atomic.Bool)
	replicated.Store(true)
	w := warden.New(failoverClient())
	t.Cleanup(func() { _ = w.Close() })
	nc := nearOn(t, w)
	srdb := sentinel.Client(t)
	waitFor(t, "sentinel to see the replica", func() bool {
		reps, _ := srdb.Do(context.Background(), "SENTINEL", "REPLICAS", "m").Slice()
		return len(reps) == 1
	})
	kill := chaos{"kill the tracking connection", func() (bool, error) { return killTracking(plain, nc) }}
	failover := chaos{"Sentinel failover", func() (bool, error) {
		ctx := context.Background()
		_, up := trackingConn(plain)
		// Sentinel lists a replica before it counts it as promotable
		// (fresh INFO, link up): NOGOODSLAVE until then.
		for end := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			err := srdb.Do(ctx, "SENTINEL", "FAILOVER", "m").Err()
			if err == nil {
				break
			}
			if !strings.Contains(err.Error(), "NOGOODSLAVE") || time.Now().After(end) {
				return up, err
			}
		}
		for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			addr, _ := srdb.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "m").StringSlice()
			if len(addr) == 2 && addr[1] == strconv.Itoa(replica.Port) {
				replicated.Store(false)
				return up, nil
			}
		}
		return up, fmt.Errorf("no failover")
	}}
	// Each pair waits for the replica (WAIT 1) until the failover: the
	// short run is a tenth.
	pairs := racePairs(t)
	if os.Getenv("WARDEN_NEAR_RACE_PAIRS") == "" {
		pairs /= 10
	}
	start := time.Now()
	raceCheck(t, plain, replicated, w, nc, pairs, []chaos{kill, failover, kill})
	t.Logf("pairs in %v", time.Since(start).Round(time.Millisecond))
}
