package warden

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

var errReleased = errors.New("warden: released")

// Hold is a granted lock, read or write hold, or semaphore hold. Its methods
// are safe for concurrent use.
type Hold struct {
	w        *Warden
	kind     *kind
	key      string
	owner    string
	fence    int64
	ttl      time.Duration
	watchdog bool

	ctx    context.Context
	cancel context.CancelCauseFunc

	// mu serialises EXTEND and RELEASE: no EXTEND is sent after Release's
	// reply, and a watchdog renewal never crosses a release.
	mu       sync.Mutex
	done     bool // released, lost, or abandoned by Warden.Close
	lost     bool
	leaseEnd time.Time
	timer    *time.Timer
	stop     chan struct{}
	exited   chan struct{}
}

func (h *Hold) start(fence int64, sent time.Time) *Hold {
	h.fence = fence
	h.ctx, h.cancel = context.WithCancelCause(context.Background())
	// The lease is counted from when the acquire was sent: never later than the server's.
	h.leaseEnd = sent.Add(h.ttl)
	// Tracked before the timer starts, and the timer set under mu: a lease
	// already over when the reply came expires the hold only after start.
	h.w.track(h, true)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.watchdog {
		h.stop, h.exited = make(chan struct{}), make(chan struct{})
		go h.renew()
	} else {
		h.timer = time.AfterFunc(time.Until(h.leaseEnd), h.expire)
	}
	return h
}

// Key is the locked key.
func (h *Hold) Key() string { return h.key }

// Owner is the hold's owner token on the server (LOCK.INFO's owner).
func (h *Hold) Owner() string { return h.owner }

// Fence is the fencing token: it strictly increases over the key's grants.
// Pass it to the store you write to and refuse writes carrying an older one.
func (h *Hold) Fence() int64 { return h.fence }

// Context is cancelled when the hold is lost (its lease ended, a renewal
// found it gone) or released; context.Cause tells which (ErrNotHeld).
func (h *Hold) Context() context.Context { return h.ctx }

// Extend resets the lease to ttl from now (whole ms, at least 1). ErrNotHeld
// when the hold was lost; ErrInvalid for ttl <= 0, which would end the lease.
func (h *Hold) Extend(ctx context.Context, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("%w: Extend with ttl %v: a lease needs at least 1 ms", ErrInvalid, ttl)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lost || h.done {
		return ErrNotHeld
	}
	sent := time.Now()
	r, err := h.w.rdb.Do(ctx, h.kind.extend, h.key, h.owner, millis(ttl)).Int64()
	if err != nil {
		return serverErr(err)
	}
	if r != 1 {
		h.loseLocked()
		return ErrNotHeld
	}
	h.ttl = ttl
	h.leaseEnd = sent.Add(ttl)
	if h.timer != nil {
		h.timer.Reset(time.Until(h.leaseEnd))
	}
	return nil
}

// Release lets go of the hold. It is idempotent and may be called from any
// goroutine; ErrNotHeld when the hold was lost before it.
func (h *Hold) Release(ctx context.Context) error {
	h.mu.Lock()
	if h.done {
		lost := h.lost
		h.mu.Unlock()
		if lost {
			return ErrNotHeld
		}
		return nil
	}
	released, err := h.releaseCmd(ctx)
	if err != nil {
		h.mu.Unlock()
		return err // the hold stands: Release may be called again
	}
	h.done = true
	if !released {
		h.lost = true
	}
	h.mu.Unlock()
	h.finish()
	if !released {
		h.cancel(ErrNotHeld)
		return ErrNotHeld
	}
	h.cancel(errReleased)
	return nil
}

// releaseCmd sends the release; false when the owner held nothing. A LOCK
// reply of 0 (re-entrant holds remain) only happens when go-redis retried
// the acquire after it ran (owners are never reused): release again.
func (h *Hold) releaseCmd(ctx context.Context) (bool, error) {
	for range 16 {
		r, err := h.w.rdb.Do(ctx, h.kind.release, h.key, h.owner).Int64()
		if err != nil {
			return false, serverErr(err)
		}
		switch {
		case r == 1:
			return true, nil
		case h.kind.sem || r < 0:
			return false, nil
		}
	}
	return true, nil
}

// giveBack releases a grant the caller will not get (raced a cancel, came
// past the deadline, or its reply was lost). When that fails (a paused or
// restarting server) it goes on in the background: an acquire whose reply
// was lost may run on the server later, and its lease would otherwise keep
// the key from everyone.
func (h *Hold) giveBack() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err := h.releaseCmd(ctx)
	cancel()
	if err != nil {
		h.giveBackLater()
	}
}

// giveBackLater releases in the background, retrying until the lease would
// have ended anyway or Close; the owner is this hold's alone, so a late
// release can only free what this call took. It runs within a call (before
// Close's wait for w.bg).
func (h *Hold) giveBackLater() {
	end := time.Now().Add(h.ttl)
	h.w.bg.Add(1)
	go func() {
		defer h.w.bg.Done()
		pause := 50 * time.Millisecond
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := h.releaseCmd(ctx)
			cancel()
			if err == nil {
				return
			}
			if errors.Is(err, redis.ErrClosed) || h.w.closing() || time.Now().Add(pause).After(end) {
				h.w.log.Warn("warden: giving back a grant failed (its lease will end)", "key", h.key, "owner", h.owner, "err", err)
				return
			}
			t := time.NewTimer(pause)
			select {
			case <-t.C:
			case <-h.w.done:
			}
			t.Stop()
			pause = min(2*pause, time.Second)
		}
	}()
}

// finish stops the watchdog or the lease timer.
func (h *Hold) finish() {
	if h.timer != nil {
		h.timer.Stop()
	}
	if h.stop != nil {
		close(h.stop)
		<-h.exited
	}
	h.w.track(h, false)
}

func (h *Hold) loseLocked() {
	h.lost, h.done = true, true
	h.cancel(ErrNotHeld)
	if h.timer != nil {
		h.timer.Stop()
	}
}

// expire runs at the local lease end of a hold without watchdog.
func (h *Hold) expire() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done || time.Now().Before(h.leaseEnd) {
		return // released, or extended meanwhile (Extend reset the timer)
	}
	h.loseLocked()
	h.w.track(h, false)
}

// renew is the watchdog: it extends the lease at a third of its length
// until the hold is released, and marks it lost when an extend finds it
// gone or the lease ends without a successful renewal.
func (h *Hold) renew() {
	defer close(h.exited)
	t := time.NewTicker(h.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
		h.mu.Lock()
		if h.done {
			h.mu.Unlock()
			return
		}
		sent := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), h.ttl/3)
		r, err := h.w.rdb.Do(ctx, h.kind.extend, h.key, h.owner, millis(h.ttl)).Int64()
		cancel()
		lost := false
		switch {
		case err == nil && r == 1:
			h.leaseEnd = sent.Add(h.ttl)
		case err == nil:
			lost = true
		default:
			h.w.log.Warn("warden: renewing a lease failed", "key", h.key, "err", err)
			lost = !time.Now().Before(h.leaseEnd)
		}
		if lost {
			h.loseLocked()
		}
		h.mu.Unlock()
		if lost {
			h.w.track(h, false)
			return
		}
	}
}

// abandon stops a hold's watchdog without releasing it (Warden.Close).
func (h *Hold) abandon() {
	h.mu.Lock()
	if h.done {
		h.mu.Unlock()
		return
	}
	h.done = true
	h.mu.Unlock()
	if h.timer != nil {
		h.timer.Stop()
	}
	if h.stop != nil {
		close(h.stop)
		<-h.exited
	}
	h.cancel(errClosed)
}

func (w *Warden) track(h *Hold, add bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.holds == nil {
		w.holds = map[*Hold]struct{}{}
	}
	if add {
		w.holds[h] = struct{}{}
	} else {
		delete(w.holds, h)
	}
}
