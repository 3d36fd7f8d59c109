package warden_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	warden "github.com/warden-redis/warden/go"
)

func ExampleWarden_Lock() {
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL")) // redis://localhost:6379
	rdb := redis.NewClient(opt)                      // or NewFailoverClient, NewClusterClient
	defer rdb.Close()
	w := warden.New(rdb)
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hold, err := w.Lock(ctx, "order:42") // the deadline is the server's WAIT
	if err != nil {
		fmt.Println(err) // context.DeadlineExceeded: still busy after 5 s
		return
	}
	defer hold.Release(context.Background())
	fmt.Println("locked", hold.Fence() > 0) // the store rejects lower fences; stop when hold.Context() ends
	// Output: locked true
}

func ExampleWarden_WithLock() {
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL"))
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	w := warden.New(rdb)
	defer w.Close()

	err := w.WithLock(context.Background(), "nightly-report", func(ctx context.Context) error {
		// ctx is cancelled if the lock is lost; the lock is released on return.
		fmt.Println("running alone")
		return nil
	})
	fmt.Println(err)
	// Output:
	// running alone
	// <nil>
}

func ExampleWarden_RLock() {
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL"))
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	w := warden.New(rdb)
	defer w.Close()

	ctx := context.Background()
	r, _ := w.RLock(ctx, "config")      // readers share
	_, err := w.TryWLock(ctx, "config") // a writer excludes them
	fmt.Println(err)
	_ = r.Release(ctx)
	wr, _ := w.WLock(ctx, "config", warden.TTL(10*time.Second))
	fmt.Println("writing")
	_ = wr.Release(ctx)
	// Output:
	// warden: not acquired
	// writing
}

func ExampleSemaphore_Acquire() {
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL"))
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	w := warden.New(rdb)
	defer w.Close()

	sem := w.Semaphore("imports", 4) // at most 4 permits at once, across processes
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	permit, err := sem.Acquire(ctx, 1, warden.MaxQueue(100))
	if err != nil {
		fmt.Println(err) // ctx.Err(), or ErrNotAcquired when 100 already wait
		return
	}
	defer permit.Release(context.Background())
	fmt.Println("permits:", permit.N())
	// Output: permits: 1
}

func ExampleRateLimiter_Wait() {
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL"))
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	w := warden.New(rdb)
	defer w.Close()

	// 10 calls a second to the partner's API from every process together,
	// 20 at once after a quiet spell.
	partner := w.RateLimiter("partner:api", 10, time.Second, warden.Burst(20))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := partner.Wait(ctx) // queued on the server until the token conforms; the deadline is its WAIT
	var limited *warden.RateLimitError
	if errors.As(err, &limited) {
		fmt.Println("not within 2 s; the token comes in", limited.RetryAfter) // answered at once
		return
	}
	if err != nil {
		fmt.Println(err) // ctx.Err() after a cancel (nothing taken), or the server's error
		return
	}
	fmt.Println("calling the partner")
	// Output: calling the partner
}

func ExampleRateLimiter_AllowN() {
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL"))
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	w := warden.New(rdb)
	defer w.Close()

	logins := w.RateLimiter("login:ada", 5, time.Minute) // 5 a minute, 5 at once
	for attempt := 1; attempt <= 6; attempt++ {
		d, err := logins.AllowN(context.Background(), 1) // never waits
		if err != nil {
			fmt.Println(err)
			return
		}
		if !d.Allowed { // 429 Too Many Requests, with Retry-After
			fmt.Println("attempt", attempt, "refused; retry in", d.RetryAfter.Round(time.Second))
		}
	}
	// Output: attempt 6 refused; retry in 12s
}

func ExampleLoad() {
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL"))
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	w := warden.New(rdb)
	defer w.Close()

	type User struct{ Name string }
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// One loader at a time across every process; the others wait for its value.
	u, err := warden.Load(ctx, w, "user:42", time.Minute, func(ctx context.Context) (User, error) {
		return User{Name: "Ada"}, nil // from the database
	})
	fmt.Println(u.Name, err)
	// Output: Ada <nil>
}

func ExampleNewNearCache() {
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL"))
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	w := warden.New(rdb)
	defer w.Close()
	// One tracking connection of its own; values stay in this process's
	// memory until the server says they changed.
	near, err := warden.NewNearCache(w, warden.NearMaxEntries(10_000), warden.NearMaxBytes(64<<20))
	if err != nil {
		panic(err)
	}
	defer near.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	load := func(ctx context.Context) (string, error) { return "Ada", nil } // from the database
	for range 3 {
		name, err := warden.Load(ctx, w, "user:7", time.Minute, load, warden.WithNear(near))
		fmt.Println(name, err)
	}
	// After your own write: gone here at once, and on the server.
	fmt.Println(near.Invalidate(ctx, "user:7"))
	// Output:
	// Ada <nil>
	// Ada <nil>
	// Ada <nil>
	// <nil>
}

func ExampleWarden_Lock_fromRedsync() {
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL"))
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	w := warden.New(rdb) // rs := redsync.New(goredis.NewPool(rdb))
	defer w.Close()

	// mutex.LockContext(ctx): redsync's 32 tries of 50-250 ms are about 5 s of waiting.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	hold, err := w.Lock(ctx, "invoice:42") // no WithExpiry: a watchdog renews the lease until Release
	cancel()                               // the context bounds the wait only: the hold stays
	if err != nil {
		fmt.Println(err) // context.DeadlineExceeded where redsync says ErrFailed
		return
	}
	fmt.Println("held:", hold.Context().Err() == nil) // mutex.Valid(), mutex.Until()
	if err := hold.Release(context.Background()); err != nil {
		fmt.Println(err) // mutex.Unlock()'s false: ErrNotHeld, the hold was lost first
	}
	// Output: held: true
}

func ExampleWarden_TryLock_fromRedsync() {
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL"))
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	w := warden.New(rdb)
	defer w.Close()

	ctx := context.Background()
	// mutex := rs.NewMutex("report", redsync.WithExpiry(2*time.Minute)); mutex.TryLock()
	hold, err := w.TryLock(ctx, "report", warden.TTL(2*time.Minute))
	if errors.Is(err, warden.ErrNotAcquired) {
		fmt.Println("busy") // redsync: ErrTaken
		return
	}
	defer hold.Release(ctx)
	// Above the server's warden.max-lease (30 s in redis.conf.example) the
	// lease is capped and renewed: held for the 2 minutes asked for, then
	// hold.Context() ends (as it does when the hold is lost).
	err = hold.Extend(ctx, 2*time.Minute) // mutex.Extend(): 2 minutes from now
	fmt.Println("extended:", err == nil, "fence:", hold.Fence() > 0)
	// Output: extended: true fence: true
}
