package warden_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	warden "github.com/warden-redis/warden/go"
	"github.com/warden-redis/warden/go/internal/testserver"
)

// Careless input: every call either works as documented or returns a clear
// error; none panics, hangs, or leaves anything held.
func TestCarelessInput(t *testing.T) {
	_, rdb, w := setup(t)
	ctx := context.Background()
	rdb.Set(ctx, "str", "x", 0)
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 2*time.Second) }
	for _, c := range []struct {
		name string
		call func() error
		want func(error) bool
	}{
		{"empty key", func() error {
			h, err := w.TryLock(ctx, "")
			if err == nil {
				err = h.Release(ctx)
			}
			return err
		}, func(err error) bool { return err == nil }},
		{"negative TTL", func() error {
			h, err := w.TryLock(ctx, "neg", warden.TTL(-time.Second))
			if err == nil {
				err = h.Release(ctx)
			}
			return err
		}, isInvalid},
		{"huge TTL", func() error {
			h, err := w.TryLock(ctx, "huge", warden.TTL(math.MaxInt64))
			if err == nil {
				err = h.Release(ctx)
			}
			return err
		}, func(err error) bool { return err == nil }},
		{"Extend with 0", func() error {
			h, err := w.TryLock(ctx, "ext0", warden.TTL(time.Minute))
			if err != nil {
				return err
			}
			defer h.Release(ctx)
			return h.Extend(ctx, 0)
		}, isInvalid},
		{"n > limit", func() error { _, err := w.Semaphore("s", 2).Acquire(ctx, 3); return err }, isInvalid},
		{"limit 0", func() error { _, err := w.Semaphore("s0", 0).TryAcquire(ctx, 1); return err }, isInvalid},
		{"n 0", func() error { _, err := w.Semaphore("s", 2).TryAcquire(ctx, 0); return err }, isInvalid},
		{"WRONGTYPE on the wait path", func() error {
			c, cancel := short()
			defer cancel()
			_, err := w.Lock(c, "str")
			return err
		}, func(err error) bool {
			var rerr redis.Error
			return err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE") && errors.As(err, &rerr)
		}},
		{"WRONGTYPE for Load", func() error {
			h, err := w.TryLock(ctx, "lockkey", warden.TTL(time.Minute))
			if err != nil {
				return err
			}
			defer h.Release(ctx)
			_, err = warden.Load(ctx, w, "lockkey", time.Minute, func(context.Context) (string, error) { return "v", nil })
			return err
		}, func(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			t.Logf("%v", err)
			if !c.want(err) {
				t.Errorf("%s: %v", c.name, err)
			}
		})
	}
	for _, key := range []string{"", "neg", "huge", "ext0", "s", "s0"} {
		for _, cmd := range []string{"LOCK.INFO", "SEM.INFO"} {
			if got := info(t, rdb, cmd, key); got != nil && got["holds"] != int64(0) && got["used"] != int64(0) {
				t.Errorf("%s %q left: %v", cmd, key, got)
			}
		}
	}
}

func isInvalid(err error) bool { return errors.Is(err, warden.ErrInvalid) }

// TTL(d) with d <= 0 is an error from every acquire (not the watchdog), and
// nothing is sent to the server.
func TestIntegrationInvalidTTL(t *testing.T) {
	_, rdb, w := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	type acquire func(o warden.LockOption) error
	hold := func(h *warden.Hold, err error) error {
		if err == nil {
			err = h.Release(ctx)
		}
		return err
	}
	permit := func(p *warden.Permit, err error) error {
		if err == nil {
			err = p.Release(ctx)
		}
		return err
	}
	calls := map[string]acquire{
		"Lock":       func(o warden.LockOption) error { return hold(w.Lock(ctx, "k", o)) },
		"TryLock":    func(o warden.LockOption) error { return hold(w.TryLock(ctx, "k", o)) },
		"RLock":      func(o warden.LockOption) error { return hold(w.RLock(ctx, "rw", o)) },
		"TryRLock":   func(o warden.LockOption) error { return hold(w.TryRLock(ctx, "rw", o)) },
		"WLock":      func(o warden.LockOption) error { return hold(w.WLock(ctx, "rw", o)) },
		"TryWLock":   func(o warden.LockOption) error { return hold(w.TryWLock(ctx, "rw", o)) },
		"Acquire":    func(o warden.LockOption) error { return permit(w.Semaphore("s", 2).Acquire(ctx, 1, o)) },
		"TryAcquire": func(o warden.LockOption) error { return permit(w.Semaphore("s", 2).TryAcquire(ctx, 1, o)) },
		"WithLock": func(o warden.LockOption) error {
			return w.WithLock(ctx, "k", func(context.Context) error { return errors.New("fn ran") }, o)
		},
	}
	for name, call := range calls {
		for _, d := range []time.Duration{0, -time.Millisecond, -time.Hour} {
			if err := call(warden.TTL(d)); !isInvalid(err) {
				t.Errorf("%s with TTL(%v): %v", name, d, err)
			}
		}
	}
	if n := wardenCalls(t, rdb); n != 0 {
		t.Fatalf("%d commands sent for invalid TTLs", n)
	}
}

// A key overwritten with another type while a call waits on it: the wait
// ends with the server's WRONGTYPE, not ErrNotAcquired or a timeout.
func TestWrongTypeDuringWait(t *testing.T) {
	_, rdb, w := setup(t)
	ctx := context.Background()
	if _, err := w.TryLock(ctx, "k", warden.TTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := w.Lock(dctx, "k")
		errc <- err
	}()
	waitFor(t, "a waiter", func() bool { return info(t, rdb, "LOCK.INFO", "k")["waiters"] == int64(1) })
	rdb.Set(ctx, "k", "x", 0)
	err := <-errc
	if err == nil || !strings.HasPrefix(err.Error(), "WRONGTYPE") || errors.Is(err, warden.ErrNotAcquired) {
		t.Fatalf("overwritten during the wait: %v", err)
	}
}

// Without the module every entry point says so (ErrNotLoaded).
func TestWithoutModule(t *testing.T) {
	plain := testserver.StartPlain(t)
	w := warden.New(plain.Client(t))
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err1 := w.Lock(ctx, "k")
	_, err2 := w.Semaphore("s", 2).Acquire(ctx, 1)
	_, err3 := w.RLock(ctx, "k")
	_, err4 := warden.Load(ctx, w, "c", time.Minute, func(context.Context) (string, error) { return "v", nil })
	err5 := w.RateLimiter("r", 10, time.Second).Wait(ctx)
	for i, err := range []error{err1, err2, err3, err4, err5} {
		if !errors.Is(err, warden.ErrNotLoaded) {
			t.Errorf("call %d without the module: %v", i, err)
		}
	}
}
