package warden_test

import (
	"bufio"
	"context"
	"errors"
	"math/rand/v2"
	"net"
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

// infoField reads one numeric field of INFO <section>.
func infoField(t *testing.T, rdb *redis.Client, section, field string) int64 {
	t.Helper()
	s, err := rdb.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// calls is how many times the server ran cmd (INFO commandstats).
func calls(t *testing.T, rdb *redis.Client, cmd string) int64 {
	t.Helper()
	s, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+strings.ToLower(cmd)+":calls="); ok {
			n, _ := strconv.ParseInt(strings.SplitN(v, ",", 2)[0], 10, 64)
			return n
		}
	}
	return 0
}

// The fast path grants a free key in one command on the shared client:
// no waiter connection is opened.
func TestIntegrationFastPathOpensNoWaiterConnection(t *testing.T) {
	_, rdb, w := setup(t)
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	before := infoField(t, rdb, "stats", "total_connections_received")
	for i := range 20 {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		h, err := w.Lock(dctx, "free"+strconv.Itoa(i%3))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		p, err := w.Semaphore("sem", 2).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := errors.Join(h.Release(ctx), p.Release(ctx)); err != nil {
			t.Fatal(err)
		}
	}
	if after := infoField(t, rdb, "stats", "total_connections_received"); after != before {
		t.Fatalf("%d connections opened by uncontended acquires", after-before)
	}
	if n := calls(t, rdb, "lock.acquire"); n != 20 {
		t.Fatalf("LOCK.ACQUIRE ran %d times for 20 acquires", n)
	}
}

// The WAIT sent is what remains of the context's deadline, and a wait
// behind a longer hold ends with the context's own error after the deadline.
func TestIntegrationWaitIsRemainingDeadline(t *testing.T) {
	_, rdb, w := setup(t)
	ctx := context.Background()
	holder, err := w.TryLock(ctx, "k", warden.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	// MONITOR on a plain connection of its own.
	mc, err := net.Dial("tcp", rdb.Options().Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	if _, err := mc.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	mon := make(chan string, 100)
	go func() {
		r := bufio.NewReader(mc)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				close(mon)
				return
			}
			if strings.Contains(line, "WAIT") {
				select {
				case mon <- line:
				default:
				}
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)

	for _, d := range []time.Duration{300 * time.Millisecond, 1200 * time.Millisecond} {
		start := time.Now()
		dctx, cancel := context.WithTimeout(ctx, d)
		_, err := w.Lock(dctx, "k")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%v: %v", d, err)
		}
		if el := time.Since(start); el < d {
			t.Fatalf("returned after %v, before its deadline %v", el, d)
		}
		var wait int64 = -1
		for wait < 0 {
			select {
			case line := <-mon:
				f := strings.Fields(line)
				for i, x := range f {
					if strings.Trim(x, `"`) == "WAIT" && i+1 < len(f) {
						wait, _ = strconv.ParseInt(strings.Trim(f[i+1], `"`), 10, 64)
					}
				}
			case <-time.After(5 * time.Second):
				t.Fatal("MONITOR saw no WAIT")
			}
		}
		if wait <= 0 || wait >= d.Milliseconds() {
			t.Fatalf("deadline %v sent WAIT %d", d, wait)
		}
	}
}

// A ReadTimeout shorter than the wait does not cut the wait short (the wait
// is warden's own connection's); a server that does not answer within WAIT
// + ReadTimeout is an error, and the acquire is never sent twice.
func TestIntegrationReadTimeoutBelowWait(t *testing.T) {
	srv := testserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 50 * time.Millisecond})
	defer rdb.Close()
	w := warden.New(rdb)
	defer w.Close()
	ctx := context.Background()
	holder, err := w.TryLock(ctx, "k", warden.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 400*time.Millisecond)
	_, err = w.Lock(dctx, "k")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a 400 ms wait with ReadTimeout 50 ms: %v", err)
	}
	if n := calls(t, rdb, "lock.acquire"); n != 3 {
		t.Fatalf("LOCK.ACQUIRE ran %d times, want 3 (holder, fast try, one wait)", n)
	}

	// The server freezes during the wait, past WAIT + ReadTimeout.
	errc := make(chan error, 1)
	go func() {
		dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err := w.Lock(dctx, "k")
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	srv.Freeze()
	time.Sleep(800 * time.Millisecond)
	srv.Thaw()
	err = <-errc
	if err == nil {
		t.Fatal("granted")
	}
	// The thawed server works through its backlog: a release may outlast
	// the 50 ms ReadTimeout once; sent again it finds the hold gone or there.
	for i := 0; ; i++ {
		err := holder.Release(ctx)
		if err == nil || (i > 0 && errors.Is(err, warden.ErrNotHeld)) {
			break
		}
		if i == 20 {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := calls(t, rdb, "lock.acquire"); n != 5 {
		t.Fatalf("LOCK.ACQUIRE ran %d times, want 5: the wait was sent twice", n)
	}
	if got := info(t, rdb, "LOCK.INFO", "k"); got != nil {
		t.Fatalf("left behind: %v", got)
	}
}

func TestIntegrationServerErrors(t *testing.T) {
	_, rdb, w := setup(t)
	ctx := context.Background()
	rdb.Set(ctx, "str", "x", 0)
	_, err := w.Lock(ctx, "str")
	var rerr redis.Error
	if err == nil || !strings.HasPrefix(err.Error(), "WRONGTYPE") || !errors.As(err, &rerr) {
		t.Fatalf("Lock on a string: %v", err)
	}
	if _, err := w.Semaphore("str", 3).TryAcquire(ctx, 1); err == nil || !strings.HasPrefix(err.Error(), "WRONGTYPE") {
		t.Fatalf("semaphore on a string: %v", err)
	}
	if _, err := warden.Load(ctx, w, "sem-key-of-lock", time.Minute, func(context.Context) (string, error) { return "v", nil }); err != nil {
		t.Fatal(err)
	}

	plain := testserver.StartPlain(t)
	pw := warden.New(plain.Client(t))
	defer pw.Close()
	_, err = pw.TryLock(ctx, "k")
	if !errors.Is(err, warden.ErrNotLoaded) || !strings.Contains(err.Error(), "is warden loaded?") {
		t.Fatalf("without the module: %v", err)
	}
}

// kill -9 of the server during a wait: the call returns an error, no hang.
func TestIntegrationServerKilledDuringWait(t *testing.T) {
	srv, _, w := setup(t)
	ctx := context.Background()
	if _, err := w.TryLock(ctx, "k", warden.TTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_, err := w.Lock(dctx, "k")
		errc <- err
	}()
	time.Sleep(200 * time.Millisecond)
	srv.Kill9()
	select {
	case err := <-errc:
		if err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("after kill -9: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Lock hangs after the server was killed")
	}
}

// QUEUE n: a request behind n waiters is shed at once.
func TestIntegrationMaxQueue(t *testing.T) {
	_, rdb, w := setup(t)
	ctx := context.Background()
	holder, err := w.TryLock(ctx, "k", warden.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wctx, cancel := context.WithCancel(ctx)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = w.Lock(wctx, "k")
		}()
	}
	for info(t, rdb, "LOCK.INFO", "k")["waiters"] != int64(2) {
		time.Sleep(10 * time.Millisecond)
	}
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = w.Lock(dctx, "k", warden.MaxQueue(2))
	dcancel()
	if !errors.Is(err, warden.ErrNotAcquired) {
		t.Fatalf("shed: %v", err)
	}
	cancel()
	wg.Wait()
	_ = holder.Release(ctx)
	if infoField(t, rdb, "warden", "warden_shed") != 1 {
		t.Fatal("INFO warden counts no shed request")
	}
}

// 10^4 waits cancelled at random instants (cancel and deadline), on a lock
// and a semaphore that keep changing hands so that grants race the cancels:
// each call returns a hold or its context's own error, and nothing is left
// held or waiting afterwards (a grant that raced a cancel was given back).
// With WARDEN.WITHDRAW, and with it refused by an ACL (CLIENT UNBLOCK or
// CLIENT KILL).
func TestIntegrationRandomCancels(t *testing.T) {
	for _, c := range withdrawCases {
		t.Run(c.name, func(t *testing.T) {
			_, rdb, w := setupCancel(t, c.deny)
			randomCancels(t, rdb, w)
		})
	}
}

func randomCancels(t *testing.T, rdb *redis.Client, w *warden.Warden) {
	const total, workers = 10000, 40
	var done, granted atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	sem := w.Semaphore("sem", 2)
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for done.Add(1) <= total {
				delay := time.Duration(r.IntN(15000)) * time.Microsecond
				var ctx context.Context
				var cancel context.CancelFunc
				want := context.Canceled
				if r.IntN(2) == 0 {
					ctx, cancel = context.WithTimeout(context.Background(), delay)
					want = context.DeadlineExceeded
				} else {
					ctx, cancel = context.WithCancel(context.Background())
					time.AfterFunc(delay, cancel)
				}
				var h interface{ Release(context.Context) error }
				var err error
				if g%2 == 0 {
					h, err = w.Lock(ctx, "k", warden.TTL(10*time.Second))
				} else {
					h, err = sem.Acquire(ctx, 1, warden.TTL(10*time.Second))
				}
				cancel()
				switch {
				case err == nil:
					granted.Add(1)
					if err := h.Release(context.Background()); err != nil {
						errc <- err
						return
					}
				case !errors.Is(err, want):
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if granted.Load() == 0 || granted.Load() == total {
		t.Fatalf("%d of %d granted: the cancels never raced a grant", granted.Load(), total)
	}
	for _, c := range []string{"LOCK.INFO", "SEM.INFO"} {
		if got := info(t, rdb, c, map[string]string{"LOCK.INFO": "k", "SEM.INFO": "sem"}[c]); got != nil {
			t.Fatalf("%s after the cancels: %v", c, got)
		}
	}
	if n := infoField(t, rdb, "warden", "warden_waiting_clients"); n != 0 {
		t.Fatalf("%d clients still waiting", n)
	}
	calls, rejected := withdrawStats(t, rdb)
	t.Logf("%d of %d granted; WARDEN.WITHDRAW: %d calls, %d rejected", granted.Load(), total, calls, rejected)
}

// wardenCalls is how many of warden's commands the server ran, the
// *.INFO ones (the test's own polling) left out (INFO commandstats).
func wardenCalls(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	s, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(s, "\n") {
		name, v, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":calls=")
		if !ok || !strings.Contains(name, ".") || strings.HasSuffix(name, ".info") {
			continue
		}
		c, _ := strconv.ParseInt(strings.SplitN(v, ",", 2)[0], 10, 64)
		n += c
	}
	return n
}

// A contended acquire behind a waiter of the same Warden costs two
// commands (the wait and the release): the fast try is skipped, as the
// server refuses a try while anyone waits on the key. Behind another
// process's waiter the try is kept (three commands).
func TestIntegrationContendedAcquireCommands(t *testing.T) {
	_, rdb, w := setup(t)
	other := warden.New(rdb)
	defer other.Close()
	ctx := context.Background()
	ttl := warden.TTL(time.Minute) // no watchdog renewals in the count
	type release func() error
	// grab takes the key (for hold) or waits for it (first, second) through wd.
	type grab func(wd *warden.Warden, key string) (release, error)
	lock := func(wd *warden.Warden, key string) (release, error) {
		h, err := wd.Lock(ctx, key, ttl)
		if err != nil {
			return nil, err
		}
		return func() error { return h.Release(ctx) }, nil
	}
	wlock := func(wd *warden.Warden, key string) (release, error) {
		h, err := wd.WLock(ctx, key, ttl)
		if err != nil {
			return nil, err
		}
		return func() error { return h.Release(ctx) }, nil
	}
	rlock := func(wd *warden.Warden, key string) (release, error) {
		h, err := wd.RLock(ctx, key, ttl)
		if err != nil {
			return nil, err
		}
		return func() error { return h.Release(ctx) }, nil
	}
	sem := func(wd *warden.Warden, key string) (release, error) {
		p, err := wd.Semaphore(key, 1).Acquire(ctx, 1, ttl)
		if err != nil {
			return nil, err
		}
		return func() error { return p.Release(ctx) }, nil
	}
	for _, c := range []struct {
		name                string
		info                string
		hold, first, second grab
		firstOther          bool  // the first waiter is another Warden's
		wantCost            int64 // commands of the second acquire and its release
	}{
		{"lock", "LOCK.INFO", lock, lock, lock, false, 2},
		{"write lock", "RWLOCK.INFO", wlock, wlock, wlock, false, 2},
		{"read behind a waiting writer", "RWLOCK.INFO", wlock, wlock, rlock, false, 2},
		{"semaphore", "SEM.INFO", sem, sem, sem, false, 2},
		{"lock, other process waiting", "LOCK.INFO", lock, lock, lock, true, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			key := "contended:" + c.name
			if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			waiters := func() int64 { n, _ := info(t, rdb, c.info, key)["waiters"].(int64); return n }
			hold, err := c.hold(w, key)
			if err != nil {
				t.Fatal(err)
			}
			first, second := make(chan release, 1), make(chan release, 1)
			errs := make(chan error, 2)
			run := func(g grab, wd *warden.Warden, out chan release) {
				r, err := g(wd, key)
				if err != nil {
					errs <- err
					return
				}
				out <- r
			}
			firstOn := w
			if c.firstOther {
				firstOn = other
			}
			go run(c.first, firstOn, first)
			waitFor(t, "first waiter queued", func() bool { return waiters() == 1 })
			go run(c.second, w, second)
			waitFor(t, "second waiter queued", func() bool { return waiters() == 2 })
			if err := hold(); err != nil {
				t.Fatal(err)
			}
			for _, ch := range []chan release{first, second} {
				select {
				case r := <-ch:
					if err := r(); err != nil {
						t.Fatal(err)
					}
				case err := <-errs:
					t.Fatal(err)
				}
			}
			// The hold: acquire, release (2). The first waiter: try, wait, release (3).
			if got := wardenCalls(t, rdb) - 5; got != c.wantCost {
				t.Fatalf("the second acquire and its release ran %d commands, want %d", got, c.wantCost)
			}
		})
	}

	t.Run("cache", func(t *testing.T) {
		key := "contended:cache"
		if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		waiters := func() int64 { n, _ := info(t, rdb, "CACHE.INFO", key)["waiters"].(int64); return n }
		loading, fill := make(chan struct{}), make(chan struct{})
		got := make(chan error, 3)
		load := func(loader func(context.Context) (string, error)) {
			v, err := warden.Load(ctx, w, key, time.Minute, loader)
			if err == nil && v != "v" {
				err = errors.New("loaded " + v)
			}
			got <- err
		}
		go load(func(context.Context) (string, error) {
			close(loading)
			<-fill
			return "v", nil
		})
		<-loading
		never := func(context.Context) (string, error) { return "", errors.New("second load") }
		go load(never)
		waitFor(t, "first waiter queued", func() bool { return waiters() == 1 })
		go load(never)
		waitFor(t, "second waiter queued", func() bool { return waiters() == 2 })
		close(fill)
		for range 3 {
			if err := <-got; err != nil {
				t.Fatal(err)
			}
		}
		// The loader: get, fill (2). The first waiter: try, wait (2).
		if got := wardenCalls(t, rdb) - 4; got != 1 {
			t.Fatalf("the second Load ran %d commands, want 1 (its wait)", got)
		}
	})
}
