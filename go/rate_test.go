package warden_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	warden "github.com/warden-redis/warden/go"
)

const day = 24 * time.Hour

// rateInfo is the limiter's RATE.INFO, failing the test on an error.
func rateInfo(t *testing.T, l *warden.RateLimiter) *warden.RateInfo {
	t.Helper()
	i, err := l.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// waiters is how many requests wait on the limiter's key.
func waiters(t *testing.T, l *warden.RateLimiter) int64 {
	t.Helper()
	if i := rateInfo(t, l); i != nil {
		return i.Waiters
	}
	return 0
}

// unblocks tells whether CLIENT UNBLOCK takes a warden waiter out of its
// queue (Redis 7.4+, Valkey 8+), as the client decides.
func unblocks(t *testing.T, rdb *redis.Client) bool {
	t.Helper()
	s, err := rdb.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	var redisV, valkeyV string
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "redis_version:"); ok {
			redisV = v
		}
		if v, ok := strings.CutPrefix(line, "valkey_version:"); ok {
			valkeyV = v
		}
	}
	if valkeyV != "" {
		return !strings.HasPrefix(valkeyV, "7.")
	}
	return !strings.HasPrefix(redisV, "6.") && !strings.HasPrefix(redisV, "7.0") && !strings.HasPrefix(redisV, "7.2")
}

// near: got is want, or at most slack less (the server's clock moved on).
func near(got, want, slack time.Duration) bool { return got <= want && got > want-slack }

// RATE.ACQUIRE's five integers as a RateDecision: taken while tokens
// remain, then limited with the exact retry-after, nothing taken.
func TestIntegrationRateAllowThenLimited(t *testing.T) {
	_, _, w := setup(t)
	ctx := context.Background()
	l := w.RateLimiter("api", 1, day, warden.Burst(2)) // a token a day, 2 at once
	steps := []struct {
		name string
		want warden.RateDecision
	}{
		// A new limiter: one token's time (a day) until full, exactly.
		{"first", warden.RateDecision{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: day}},
		{"second", warden.RateDecision{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 2 * day}},
		{"limited", warden.RateDecision{Allowed: false, Limit: 2, Remaining: 0, RetryAfter: day, ResetAfter: 2 * day}},
		{"still limited", warden.RateDecision{Allowed: false, Limit: 2, Remaining: 0, RetryAfter: day, ResetAfter: 2 * day}},
	}
	for i, s := range steps {
		got, err := l.AllowN(ctx, 1)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		slack := 10 * time.Second // time passes between the calls, none before the first
		if i == 0 {
			slack = time.Millisecond
		}
		if got.Allowed != s.want.Allowed || got.Limit != s.want.Limit || got.Remaining != s.want.Remaining ||
			!near(got.ResetAfter, s.want.ResetAfter, slack) ||
			(s.want.RetryAfter == 0) != (got.RetryAfter == 0) || got.RetryAfter != 0 && !near(got.RetryAfter, s.want.RetryAfter, slack) {
			t.Fatalf("%s: %+v, want %+v", s.name, got, s.want)
		}
	}
	if l.Allow() {
		t.Fatal("Allow on an empty bucket")
	}
	i := rateInfo(t, l)
	if i == nil || i.Count != 1 || i.Period != day || i.Burst != 2 || i.Remaining != 0 || i.Waiters != 0 ||
		!near(i.ResetAfter, 2*day, 10*time.Second) {
		t.Fatalf("RATE.INFO %+v", i)
	}
	if l.Burst() != 2 || w.RateLimiter("x", 7, time.Second).Burst() != 7 {
		t.Fatal("Burst")
	}
}

// Waiters are granted in the order they asked, a small request never
// overtaking a larger one ahead of it. The tokens come from refunds (a
// limiter of a token a day): the order is the server's, not the clock's.
func TestIntegrationRateWaitFIFO(t *testing.T) {
	_, _, w := setup(t)
	// No deadline: tokens a day away would not conform before one.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := w.RateLimiter("fifo", 1, day, warden.Burst(2))
	if d, err := l.AllowN(ctx, 2); err != nil || !d.Allowed {
		t.Fatalf("draining: %+v %v", d, err)
	}
	granted := map[string]chan error{"first, two tokens": make(chan error, 1), "second, one token": make(chan error, 1)}
	ask := func(name string, n int64, queued int64) {
		go func() { granted[name] <- l.WaitN(ctx, n) }()
		waitFor(t, name+" queued", func() bool { return waiters(t, l) == queued })
	}
	ask("first, two tokens", 2, 1)
	ask("second, one token", 1, 2)
	feed := func() {
		if ok, err := l.Refund(ctx, 1); err != nil || !ok {
			t.Fatalf("Refund: %v %v", ok, err)
		}
	}
	// One token: enough for the second, not for the first, which is ahead.
	feed()
	if n := waiters(t, l); n != 2 {
		t.Fatalf("after one token, %d waiting: the one-token request overtook", n)
	}
	feed() // two: the first is served
	if err := <-granted["first, two tokens"]; err != nil {
		t.Fatal(err)
	}
	if n := waiters(t, l); n != 1 {
		t.Fatalf("after the first grant, %d waiting", n)
	}
	feed()
	if err := <-granted["second, one token"]; err != nil {
		t.Fatal(err)
	}
	if i := rateInfo(t, l); i == nil || i.Waiters != 0 || i.Remaining != 0 {
		t.Fatalf("RATE.INFO %+v", i)
	}
}

// A wait whose tokens cannot conform before the context's deadline is
// answered at once, limited with the retry-after, and takes nothing: by the
// client from its first try, or by the server behind a waiter.
func TestIntegrationRateWaitCannotConformBeforeDeadline(t *testing.T) {
	for _, c := range []struct {
		name   string
		behind bool // a call of the same Warden waits: no try, the server answers
	}{
		{"from the try", false},
		{"from the server behind a waiter", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, w := setup(t)
			ctx := context.Background()
			l := w.RateLimiter("slow", 1, time.Minute, warden.Burst(1))
			if !l.Allow() {
				t.Fatal("draining")
			}
			owed := time.Minute // the drained token
			ahead := make(chan error, 1)
			wctx, stop := context.WithCancel(ctx)
			defer stop()
			if c.behind {
				go func() { ahead <- l.Wait(wctx) }()
				waitFor(t, "a waiter", func() bool { return waiters(t, l) == 1 })
			}
			const deadline = 20 * time.Second
			dctx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			start := time.Now()
			err := l.Wait(dctx)
			took := time.Since(start)
			var limited *warden.RateLimitError
			if !errors.As(err, &limited) || !errors.Is(err, warden.ErrRateLimited) {
				t.Fatalf("Wait: %v", err)
			}
			if took > deadline/2 {
				t.Fatalf("answered after %v, not at once", took)
			}
			want := owed
			if c.behind {
				want += time.Minute // the waiter's token first
			}
			if limited.Allowed || !near(limited.RetryAfter, want, 10*time.Second) {
				t.Fatalf("%+v, want a retry-after of %v", limited.RateDecision, want)
			}
			if c.behind {
				stop()
				if err := <-ahead; !errors.Is(err, context.Canceled) {
					t.Fatalf("the waiter ahead: %v", err)
				}
			}
			// Nothing taken: the bucket owes the drained token only.
			i := rateInfo(t, l)
			if i == nil || i.Waiters != 0 || !near(i.ResetAfter, owed, 10*time.Second) {
				t.Fatalf("RATE.INFO %+v", i)
			}
		})
	}
}

// A waiting call that gives up (cancel, Close) leaves the queue and takes
// nothing.
func TestIntegrationRateAbandonedWaitTakesNothing(t *testing.T) {
	for _, c := range []struct {
		name string
		quit func(cancel context.CancelFunc, w *warden.Warden)
		want error
	}{
		{"cancel", func(cancel context.CancelFunc, _ *warden.Warden) { cancel() }, context.Canceled},
		{"close", func(_ context.CancelFunc, w *warden.Warden) { _ = w.Close() }, warden.ErrClosed},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, rdb, w := setup(t)
			ctx := context.Background()
			l := w.RateLimiter("abandoned", 1, time.Minute, warden.Burst(1))
			if !l.Allow() {
				t.Fatal("draining")
			}
			w2 := warden.New(rdb)
			defer w2.Close()
			waiting := w2.RateLimiter("abandoned", 1, time.Minute, warden.Burst(1))
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- waiting.Wait(wctx) }()
			waitFor(t, "a waiter", func() bool { return waiters(t, l) == 1 })
			c.quit(cancel, w2)
			if err := <-done; !errors.Is(err, c.want) {
				t.Fatalf("Wait: %v, want %v", err, c.want)
			}
			i := rateInfo(t, l)
			if i == nil || i.Waiters != 0 || !near(i.ResetAfter, time.Minute, 10*time.Second) {
				t.Fatalf("after the %s, RATE.INFO %+v: tokens taken", c.name, i)
			}
		})
	}
}

// Waits cancelled at random instants while a feeder gives tokens back one
// at a time (a limiter of one token a day: no refill muddles the count), so
// that grants race the cancels: every token fed is either kept by a caller
// whose Wait returned nil or still in the bucket. A cancelled waiter took
// nothing, and a grant that raced its cancel was given back (by the client,
// or by the server when the connection was killed).
func TestIntegrationRateRandomCancels(t *testing.T) {
	_, rdb, w := setup(t)
	ctx := context.Background()
	const burst = 1000
	l := w.RateLimiter("busy", 1, day, warden.Burst(burst))
	if d, err := l.AllowN(ctx, burst); err != nil || !d.Allowed {
		t.Fatalf("draining: %+v %v", d, err)
	}
	const workers, each = 8, 100
	var kept atomic.Int64
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 7))
			for range each {
				ctx, cancel := context.WithCancel(ctx)
				stop := time.AfterFunc(time.Duration(r.IntN(10_000))*time.Microsecond, cancel)
				err := l.Wait(ctx)
				stop.Stop()
				cancel()
				switch {
				case err == nil:
					kept.Add(1)
				case !errors.Is(err, context.Canceled):
					t.Errorf("Wait: %v", err)
					return
				}
			}
		}()
	}
	workersDone := make(chan struct{})
	go func() { wg.Wait(); close(workersDone) }()
	var fed int64
	for feeding := true; feeding; {
		select {
		case <-workersDone:
			feeding = false
		case <-time.After(2 * time.Millisecond):
			ok, err := l.Refund(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			if !ok || fed > burst/2 {
				t.Fatalf("feeding: %v after %d tokens", ok, fed)
			}
			fed++
		}
	}
	waitFor(t, "no waiters", func() bool { return waiters(t, l) == 0 })
	i := rateInfo(t, l)
	given := calls(t, rdb, "RATE.REFUND") - fed
	t.Logf("%d tokens fed: %d kept, %d given back by the client", fed, kept.Load(), given)
	if i == nil || kept.Load() == 0 || i.Remaining > fed-kept.Load() {
		t.Fatalf("%d fed, %d kept: RATE.INFO %+v (given back more than taken)", fed, kept.Load(), i)
	}
	// Where CLIENT UNBLOCK cannot take a module's waiter out (Redis before
	// 7.4) a cancel kills the connection, and Redis 7.0 loses a grant now
	// and then that way (neither delivered nor taken back by the server):
	// fewer admitted, never more.
	if lost := fed - kept.Load() - i.Remaining; lost != 0 {
		if unblocks(t, rdb) {
			t.Fatalf("%d fed, %d kept: RATE.INFO %+v (%d tokens lost)", fed, kept.Load(), i, lost)
		}
		t.Logf("%d tokens lost with killed connections", lost)
	}
	if n := infoField(t, rdb, "warden", "warden_waiting_clients"); n != 0 {
		t.Fatalf("%d clients still waiting", n)
	}
}

// Refund gives tokens back, never beyond a full bucket; false when there
// is no limiter.
func TestIntegrationRateRefund(t *testing.T) {
	_, _, w := setup(t)
	ctx := context.Background()
	l := w.RateLimiter("refund", 1, day, warden.Burst(3))
	if d, err := l.AllowN(ctx, 3); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("AllowN(3): %+v %v", d, err)
	}
	if ok, err := l.Refund(ctx, 2); err != nil || !ok {
		t.Fatalf("Refund(2): %v %v", ok, err)
	}
	if i := rateInfo(t, l); i == nil || i.Remaining != 2 {
		t.Fatalf("after a refund of 2: %+v", i)
	}
	if ok, err := l.Refund(ctx, 5); err != nil || !ok {
		t.Fatalf("Refund(5): %v %v", ok, err)
	}
	// Full again: the limiter is gone (a full bucket and no key are the same).
	if i := rateInfo(t, l); i != nil {
		t.Fatalf("a full bucket: %+v", i)
	}
	if ok, err := l.Refund(ctx, 1); err != nil || ok {
		t.Fatalf("Refund without a limiter: %v %v", ok, err)
	}
	if _, err := l.Refund(ctx, 0); !errors.Is(err, warden.ErrInvalid) {
		t.Fatalf("Refund(0): %v", err)
	}
	if d, err := l.AllowN(ctx, 3); err != nil || !d.Allowed {
		t.Fatalf("AllowN(3) after the refunds: %+v %v", d, err)
	}
}

// SetRate changes the rate keeping the tokens owed; the handle states the
// new rate, an old handle is refused with the server's message, and a
// waiter that stated the old rate is answered the server's error.
func TestIntegrationRateSetRate(t *testing.T) {
	_, rdb, w := setup(t)
	ctx := context.Background()
	l := w.RateLimiter("config", 1, time.Minute, warden.Burst(2))
	if d, err := l.AllowN(ctx, 2); err != nil || !d.Allowed {
		t.Fatalf("AllowN(2): %+v %v", d, err)
	}
	w2 := warden.New(rdb)
	defer w2.Close()
	old := w2.RateLimiter("config", 1, time.Minute, warden.Burst(2))
	waited := make(chan error, 1)
	go func() { waited <- old.Wait(ctx) }()
	waitFor(t, "a waiter", func() bool { return waiters(t, l) == 1 })

	changed, err := l.SetRate(ctx, 4, time.Minute, warden.Burst(4))
	if err != nil || !changed {
		t.Fatalf("SetRate: %v %v", changed, err)
	}
	err = <-waited
	var rerr redis.Error
	if !errors.As(err, &rerr) || !strings.Contains(err.Error(), "rate was changed while this request waited") {
		t.Fatalf("the waiter at the old rate: %v", err)
	}
	i := rateInfo(t, l)
	if i == nil || i.Count != 4 || i.Period != time.Minute || i.Burst != 4 || i.Remaining != 2 || l.Burst() != 4 {
		t.Fatalf("after SetRate, RATE.INFO %+v, Burst %d", i, l.Burst())
	}
	if d, err := l.AllowN(ctx, 2); err != nil || !d.Allowed || d.Limit != 4 {
		t.Fatalf("AllowN(2) at the new rate: %+v %v", d, err)
	}
	if _, err := old.AllowN(ctx, 1); err == nil || !strings.Contains(err.Error(), "limiter rate is 4 per 60000 ms burst 4") {
		t.Fatalf("the old rate: %v", err)
	}
	if changed, err := w.RateLimiter("none", 1, time.Second).SetRate(ctx, 2, time.Second); err != nil || changed {
		t.Fatalf("SetRate without a limiter: %v %v", changed, err)
	}
	if _, err := l.SetRate(ctx, 0, time.Second); !errors.Is(err, warden.ErrInvalid) || l.Burst() != 4 {
		t.Fatalf("SetRate(0): %v (handle's burst %d)", err, l.Burst())
	}
}

// Info on a key without a limiter is nil: its bucket is full.
func TestIntegrationRateInfoMissingKey(t *testing.T) {
	_, _, w := setup(t)
	i, err := w.RateLimiter("missing", 5, time.Second).Info(context.Background())
	if err != nil || i != nil {
		t.Fatalf("Info: %+v %v", i, err)
	}
}

// RATE.INFO's RESP2 reply (a flat array) reads as its RESP3 map does.
func TestIntegrationRateInfoRESP2(t *testing.T) {
	srv, _, w := setup(t)
	ctx := context.Background()
	l := w.RateLimiter("resp2", 10, time.Minute)
	if d, err := l.AllowN(ctx, 4); err != nil || !d.Allowed {
		t.Fatalf("AllowN(4): %+v %v", d, err)
	}
	rdb2 := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: 2})
	defer rdb2.Close()
	w2 := warden.New(rdb2)
	defer w2.Close()
	l2 := w2.RateLimiter("resp2", 10, time.Minute)
	i3, i2 := rateInfo(t, l), rateInfo(t, l2)
	if i2 == nil || i3 == nil || i2.Count != 10 || i2.Period != time.Minute || i2.Burst != 10 || i2.Remaining != 6 ||
		i2.Waiters != i3.Waiters || !near(i2.ResetAfter, 24*time.Second, 10*time.Second) {
		t.Fatalf("RESP2 %+v, RESP3 %+v", i2, i3)
	}
	if d, err := l2.AllowN(ctx, 1); err != nil || !d.Allowed || d.Limit != 10 {
		t.Fatalf("AllowN under RESP2: %+v %v", d, err)
	}
}

// Another rate on an existing limiter is the server's error, a redis.Error
// with its text, from every call that states the rate; nothing changed.
func TestIntegrationRateMismatch(t *testing.T) {
	_, _, w := setup(t)
	ctx := context.Background()
	l := w.RateLimiter("partner", 10, time.Second)
	if !l.Allow() {
		t.Fatal("Allow")
	}
	other := w.RateLimiter("partner", 20, time.Second)
	const want = "ERR limiter rate is 10 per 1000 ms burst 10, not 20 per 1000 ms burst 20"
	for name, call := range map[string]func() error{
		"AllowN": func() error { _, err := other.AllowN(ctx, 1); return err },
		"WaitN":  func() error { return other.WaitN(ctx, 1) },
	} {
		err := call()
		var rerr redis.Error
		if !errors.As(err, &rerr) || err.Error() != want {
			t.Errorf("%s: %v, want %q", name, err, want)
		}
	}
	if i := rateInfo(t, l); i == nil || i.Count != 10 || i.Remaining != 9 {
		t.Fatalf("RATE.INFO %+v", i)
	}
}

// Arguments without a meaning are refused before anything is sent
// (ErrInvalid); the ranges' bounds are the server's, with its text.
func TestIntegrationRateInvalidArguments(t *testing.T) {
	_, _, w := setup(t)
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		l      *warden.RateLimiter
		n      int64
		server string // "": ErrInvalid
	}{
		{"count 0", w.RateLimiter("k", 0, time.Second), 1, ""},
		{"period 0", w.RateLimiter("k", 1, 0), 1, ""},
		{"a period of part of a ms", w.RateLimiter("k", 1, 1500*time.Microsecond), 1, ""},
		{"negative burst", w.RateLimiter("k", 1, time.Second, warden.Burst(-1)), 1, ""},
		{"burst 0", w.RateLimiter("k", 1, time.Second, warden.Burst(0)), 1, ""},
		{"a negative max queue", w.RateLimiter("k", 1, time.Second, warden.RateMaxQueue(-5)), 1, ""},
		{"0 tokens", w.RateLimiter("k", 1, time.Second), 0, ""},
		{"more tokens than the burst", w.RateLimiter("k", 5, time.Second), 6, ""},
		{"more than 10^6 per ms", w.RateLimiter("k", 2_000_001, 2*time.Millisecond), 1, "ERR invalid count"},
		{"a period above a day", w.RateLimiter("k", 1, day+time.Millisecond), 1, "ERR invalid period"},
		{"a burst above 10^9", w.RateLimiter("k", 1, time.Second, warden.Burst(1_000_000_001)), 1, "ERR invalid BURST"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, aerr := c.l.AllowN(ctx, c.n)
			werr := c.l.WaitN(ctx, c.n)
			for _, err := range []error{aerr, werr} {
				if c.server == "" && !errors.Is(err, warden.ErrInvalid) ||
					c.server != "" && (err == nil || !strings.HasPrefix(err.Error(), c.server)) {
					t.Fatalf("%v, want %q", err, c.server)
				}
			}
		})
	}
	if _, err := w.RateLimiter("k", 1, time.Second).Info(ctx); err != nil {
		t.Fatal(err) // nothing was created
	}
}

// RateMaxQueue (QUEUE n): a wait behind n waiters is answered at once,
// limited.
func TestIntegrationRateMaxQueue(t *testing.T) {
	_, rdb, w := setup(t)
	ctx := context.Background()
	l := w.RateLimiter("shed", 1, time.Minute, warden.Burst(1))
	if !l.Allow() {
		t.Fatal("draining")
	}
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.Wait(wctx); !errors.Is(err, context.Canceled) {
				t.Errorf("a waiter: %v", err)
			}
		}()
	}
	waitFor(t, "two waiters", func() bool { return waiters(t, l) == 2 })
	// No deadline: without QUEUE it would wait three minutes.
	shed := w.RateLimiter("shed", 1, time.Minute, warden.Burst(1), warden.RateMaxQueue(2))
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	start := time.Now()
	err := shed.Wait(sctx)
	var limited *warden.RateLimitError
	if !errors.As(err, &limited) || time.Since(start) > 30*time.Second || limited.RetryAfter <= 2*time.Minute {
		t.Fatalf("shed: %v", err)
	}
	cancel()
	wg.Wait()
	if n := waiters(t, l); n != 0 {
		t.Fatalf("%d still waiting", n)
	}
	if calls(t, rdb, "RATE.REFUND") != 0 {
		t.Fatal("a refund without a grant")
	}
}

// The waiter connections' grants and the fast path's agree: a wait that
// conforms within its deadline is granted, not refused.
func TestIntegrationRateWaitGranted(t *testing.T) {
	_, _, w := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := w.RateLimiter("granted", 10, time.Second, warden.Burst(1))
	for range 5 {
		if err := l.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := waiters(t, l); n != 0 {
		t.Fatalf("%d still waiting", n)
	}
}
