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
//
// A hold renews itself in two cases: without TTL (the watchdog, until
// Release), and when the lease asked for (TTL, Extend) is longer than the
// server's warden.max-lease (capped and renewed: the server is asked for at
// most the cap, and the hold is renewed until the lease asked for ends).
type Hold struct {
	w        *Warden
	kind     *kind
	key      string
	owner    string
	fence    int64
	watchdog bool
	asked    time.Duration // the lease asked for at acquire (not the watchdog's)

	ctx    context.Context
	cancel context.CancelCauseFunc

	// mu serialises EXTEND and RELEASE: no EXTEND is sent after Release's
	// reply, and a renewal never crosses a release.
	mu     sync.Mutex
	done   bool // released, lost, or abandoned by Warden.Close
	lost   bool
	lease  time.Duration // what each grant or renewal asks the server for: at most the cap
	end    time.Time     // without watchdog: the end of the lease asked for (>= leaseEnd)
	retry  time.Time     // after a failed renewal: when to try again
	stop   chan struct{} // a hold that renews: closed to end its renewer
	kick   chan struct{} // Extend changed the renewer's schedule
	exited chan struct{}

	// lapseMu guards the local lease end, which the hold's Context never
	// outlives. It is never held across a round trip (mu is): the Context
	// ends on time while a renewal or Extend still waits for the server.
	lapseMu  sync.Mutex
	leaseEnd time.Time   // the server's lease end as known here: never later than the server's (written under mu and lapseMu)
	lapsed   bool        // the Context ended at leaseEnd
	timer    *time.Timer // fires at leaseEnd: lapse
}

func (h *Hold) start(fence int64, sent time.Time) *Hold {
	h.fence = fence
	h.ctx, h.cancel = context.WithCancelCause(context.Background())
	// The lease is counted from when the acquire was sent: never later than the server's.
	h.leaseEnd = leaseEnd(sent, h.lease)
	h.end = sent.Add(h.asked)
	// Tracked before the timer starts, and the timer set under mu: a lease
	// already over when the reply came lapses the hold only after start.
	h.w.track(h, true)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.timer = time.AfterFunc(time.Until(h.leaseEnd), h.lapse)
	if h.renewsLocked() {
		h.startRenewerLocked()
	}
	return h
}

// renewsLocked: the lease runs out before the hold should (the watchdog, or
// a lease asked for beyond the cap).
func (h *Hold) renewsLocked() bool {
	return h.watchdog || h.end.After(h.leaseEnd)
}

func (h *Hold) startRenewerLocked() {
	h.stop, h.kick, h.exited = make(chan struct{}), make(chan struct{}, 1), make(chan struct{})
	h.w.bg.Add(1)
	go h.renew()
}

// Key is the locked key.
func (h *Hold) Key() string { return h.key }

// Owner is the hold's owner token on the server (LOCK.INFO's owner).
func (h *Hold) Owner() string { return h.owner }

// Fence is the fencing token: it strictly increases over the key's grants.
// Pass it to the store you write to and refuse writes carrying an older one.
func (h *Hold) Fence() int64 { return h.fence }

// Context is cancelled when the hold is lost or released; context.Cause
// tells which (ErrNotHeld for a loss). A hold is lost when its lease ends
// unrenewed (it ends on time even while a renewal still waits for the
// server), or a renewal finds it gone. It is not the context the hold was
// acquired with: cancelling that one after the grant does not end the hold.
func (h *Hold) Context() context.Context { return h.ctx }

// Extend resets the lease to ttl from now. ErrNotHeld when the hold was
// lost; ErrInvalid for ttl <= 0, which would end the lease. On a hold
// without TTL it sets the lease the watchdog renews. A ttl above the
// server's warden.max-lease is capped and renewed: the server gets the cap,
// and the hold is renewed until ttl from now, then lapses (unless Extended
// again or released).
func (h *Hold) Extend(ctx context.Context, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("%w: Extend with ttl %v: a lease needs at least 1 ms", ErrInvalid, ttl)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done || h.overLocked() {
		return ErrNotHeld
	}
	sent, lease, err := h.extendLocked(ctx, ttl)
	if err != nil {
		return err
	}
	if !h.renewedLocked(leaseEnd(sent, lease)) {
		return ErrNotHeld
	}
	h.lease = lease
	if !h.watchdog {
		h.end = sent.Add(ttl)
	}
	switch {
	case h.stop != nil:
		select { // the renewer reads the new schedule
		case h.kick <- struct{}{}:
		default:
		}
	case h.renewsLocked():
		h.startRenewerLocked()
	}
	return nil
}

// leaseEnd is the end of a lease asked for at sent, as counted here: the
// server counts it from its own ms clock, up to 1 ms before sent + lease.
func leaseEnd(sent time.Time, lease time.Duration) time.Time {
	return sent.Add(lease - time.Millisecond)
}

// reanchor sends EXTEND for the hold's lease before the hold starts (a grant
// that came after a wait) and returns when it was sent; a hold the server
// no longer has is ErrNotHeld.
func (h *Hold) reanchor(ctx context.Context) (time.Time, error) {
	sent := time.Now()
	r, err := h.w.rdb.Do(ctx, h.kind.extend, h.key, h.owner, millis(h.lease)).Int64()
	if err != nil {
		return sent, serverErr(err)
	}
	if r != 1 {
		return sent, ErrNotHeld
	}
	return sent, nil
}

// extendLocked sends EXTEND for ttl, or for the cap when ttl is above it
// (learned from the server's refusal, then resent). It returns when the
// EXTEND was sent and the lease it got; ErrNotHeld (the hold marked lost)
// when the server says the owner holds nothing.
func (h *Hold) extendLocked(ctx context.Context, ttl time.Duration) (time.Time, time.Duration, error) {
	lease := h.w.capped(ttl)
	for attempt := 0; ; attempt++ {
		sent := time.Now()
		r, err := h.w.rdb.Do(ctx, h.kind.extend, h.key, h.owner, millis(lease)).Int64()
		if c, ok := leaseCapOf(err); ok && c < lease && attempt < 2 {
			h.w.learnCap(c)
			lease = c
			continue
		}
		if err != nil {
			return sent, 0, serverErr(err)
		}
		if r != 1 {
			h.loseLocked()
			return sent, 0, ErrNotHeld
		}
		return sent, lease, nil
	}
}

// renewedLocked moves the local lease end to end after a successful EXTEND.
// A reply that came after the old end is too late: the Context has ended
// (or is ending) there, so the hold is lost and given back; false.
func (h *Hold) renewedLocked(end time.Time) bool {
	h.lapseMu.Lock()
	late := h.lapsed || !time.Now().Before(h.leaseEnd)
	if !late {
		h.leaseEnd = end
		h.timer.Reset(time.Until(end))
	} else {
		h.lapsed = true
		h.cancel(ErrNotHeld)
	}
	h.lapseMu.Unlock()
	if late {
		// Given back while still tracked: Close waits for mu before its
		// wait for the background give-back this may start.
		h.giveBack()
		h.loseLocked()
	}
	return !late
}

// overLocked tells whether the local lease has ended (the lease timer may
// not have run yet); then the hold is marked lost.
func (h *Hold) overLocked() bool {
	h.lapseMu.Lock()
	over := h.lapsed || !time.Now().Before(h.leaseEnd)
	h.lapsed = over
	h.lapseMu.Unlock()
	if over {
		h.loseLocked()
	}
	return over
}

// Release lets go of the hold. It is idempotent and may be called from any
// goroutine; ErrNotHeld when the hold was lost before it. A release that gets
// no reply (its connection broke, go-redis' retries spent, it timed out, ctx
// ended) may or may not have run: it returns the error, and the hold ends
// here at once as released (its Context is cancelled, the renewer stops, a
// later Release returns nil, Extend says ErrNotHeld) while the release is
// resent in the background, with backoff, until one is answered, the lease
// would have ended, or Close. An error reply from the server (READONLY,
// NOPERM) leaves the hold standing: Release may be called again.
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
	if h.overLocked() {
		h.mu.Unlock()
		return ErrNotHeld
	}
	released, err := h.releaseCmd(ctx)
	if err != nil {
		var reply redis.Error
		if errors.As(err, &reply) {
			h.mu.Unlock()
			return err // refused, not run: the hold stands, Release may be called again
		}
		// No reply: handed to the background. The owner is this hold's
		// alone, so a resend can only free what this hold took.
		h.done = true
		h.mu.Unlock()
		h.finish()
		h.cancel(errReleased)
		h.releaseLater()
		return err
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

// releaseLater resends, in the background (giveBackLater), a release that
// got no reply. It counts as a call, so Close waits for it to start before
// its wait for the background; not once Close has begun (holds are
// abandoned then).
func (h *Hold) releaseLater() {
	if h.w.begin() != nil {
		return
	}
	defer h.w.calls.Done()
	h.giveBackLater()
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
	end := time.Now().Add(h.lease)
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

// finish stops the lease timer and the renewer.
func (h *Hold) finish() {
	h.timer.Stop()
	if h.stop != nil {
		close(h.stop)
		<-h.exited
	}
	h.w.track(h, false)
}

// loseLocked marks the hold lost and ends its renewer, without waiting for
// it (the renewer may be the caller, or waiting for mu).
func (h *Hold) loseLocked() {
	h.lost, h.done = true, true
	h.cancel(ErrNotHeld)
	h.timer.Stop()
	if h.stop != nil {
		close(h.stop)
	}
	h.w.track(h, false)
}

// lapse runs at the local lease end: the Context ends at once, even while
// a renewal or Extend holds mu waiting for the server; then the hold is
// marked lost.
func (h *Hold) lapse() {
	h.lapseMu.Lock()
	if h.lapsed || time.Now().Before(h.leaseEnd) {
		h.lapseMu.Unlock()
		return // renewed meanwhile: the timer was reset
	}
	h.lapsed = true
	h.cancel(ErrNotHeld)
	h.lapseMu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.done {
		h.loseLocked()
	}
}

// renew renews the lease a third of the way into it until the hold is
// released (the watchdog) or the lease asked for ends (capped and renewed:
// the last renewal asks for what remains of it, and the hold lapses at its
// end). A failed renewal is retried until the lease ends; a renewal that
// finds the hold gone marks it lost.
func (h *Hold) renew() {
	defer h.w.bg.Done()
	defer close(h.exited)
	for {
		h.mu.Lock()
		at, due := h.nextLocked()
		h.mu.Unlock()
		renew, ok := h.sleep(at, due)
		if !ok || renew && !h.renewOnce() {
			return
		}
	}
}

// sleep waits until at (when due), a kick (Extend changed the schedule) or
// stop. renew: at came; ok: false on stop.
func (h *Hold) sleep(at time.Time, due bool) (renew, ok bool) {
	var fire <-chan time.Time // nil: not due, only a kick or stop wakes it
	if due {
		t := time.NewTimer(time.Until(at))
		defer t.Stop()
		fire = t.C
	}
	select {
	case <-h.stop:
		return false, false
	case <-h.kick:
		return false, true
	case <-fire:
		return true, true
	}
}

// nextLocked is when the renewer renews next: a third into the lease, or
// soon after a failed renewal. Not due: the last lease runs to the end
// asked for (the lease timer ends the hold there).
func (h *Hold) nextLocked() (time.Time, bool) {
	if !h.renewsLocked() {
		return time.Time{}, false
	}
	at := h.leaseEnd.Add(-2 * h.lease / 3)
	if h.retry.After(at) {
		at = h.retry
	}
	return at, true
}

// renewOnce is one renewal; false once the hold is done.
func (h *Hold) renewOnce() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done {
		return false
	}
	if !h.renewsLocked() {
		return true // Extend shortened the lease meanwhile
	}
	ttl := h.lease
	if !h.watchdog {
		// The last renewal asks for what remains of the lease asked for,
		// rounded up to whole ms: the server's never ends before the hold's.
		ttl = min(ttl, ceilMillis(time.Until(h.end)))
	}
	// No use waiting past the lease: the hold lapses there anyway.
	ctx, cancel := context.WithDeadline(context.Background(), h.leaseEnd)
	sent, lease, err := h.extendLocked(ctx, ttl)
	cancel()
	switch {
	case err == nil:
		end := leaseEnd(sent, lease)
		if !h.watchdog && end.After(h.end) {
			end = h.end // the hold lapses at the end asked for
		}
		if !h.renewedLocked(end) {
			return false
		}
		if lease < ttl {
			h.lease = lease // the cap was lowered: the server refused ttl
		}
		h.retry = time.Time{}
		return true
	case errors.Is(err, ErrNotHeld):
		return false // extendLocked marked it lost
	}
	h.w.log.Warn("warden: renewing a lease failed", "key", h.key, "err", err)
	h.retry = time.Now().Add(max(h.lease/10, time.Millisecond))
	return true
}

// abandon stops a hold's renewer without releasing it (Warden.Close).
func (h *Hold) abandon() {
	h.mu.Lock()
	if h.done {
		h.mu.Unlock()
		return
	}
	h.done = true
	h.mu.Unlock()
	h.timer.Stop()
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

// ceilMillis rounds d up to whole milliseconds, the server's unit.

// ceilMillis rounds d up to whole milliseconds, the server's unit.
func ceilMillis(d time.Duration) time.Duration {
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}
