package warden

import (
	"context"
	"errors"
	"time"
)

// Lock acquires the exclusive lock on key (LOCK.ACQUIRE), waiting until it
// is granted or ctx is done; then it returns ctx.Err() itself. The context's
// deadline is the server's WAIT.
//
// ctx bounds the wait only: once Lock has returned, cancelling ctx does not
// end the hold, which stays until Release (renewed by its watchdog without
// TTL) or until it is lost; the hold's Context tells when it ends.
func (w *Warden) Lock(ctx context.Context, key string, opts ...LockOption) (*Hold, error) {
	return w.acquire(ctx, kindLock, key, nil, opts, false)
}

// TryLock acquires the lock if it is free, without waiting: ErrNotAcquired
// when it is busy.
func (w *Warden) TryLock(ctx context.Context, key string, opts ...LockOption) (*Hold, error) {
	return w.acquire(ctx, kindLock, key, nil, opts, true)
}

// RLock acquires a read hold on a read-write lock (RWLOCK.READ): readers
// share, a writer excludes them; a waiting writer queues new readers behind it.
func (w *Warden) RLock(ctx context.Context, key string, opts ...LockOption) (*Hold, error) {
	return w.acquire(ctx, kindRead, key, nil, opts, false)
}

// WLock acquires the write hold on a read-write lock (RWLOCK.WRITE).
func (w *Warden) WLock(ctx context.Context, key string, opts ...LockOption) (*Hold, error) {
	return w.acquire(ctx, kindWrite, key, nil, opts, false)
}

// TryRLock is RLock without waiting: ErrNotAcquired when a writer holds or waits.
func (w *Warden) TryRLock(ctx context.Context, key string, opts ...LockOption) (*Hold, error) {
	return w.acquire(ctx, kindRead, key, nil, opts, true)
}

// TryWLock is WLock without waiting: ErrNotAcquired when anyone holds it.
func (w *Warden) TryWLock(ctx context.Context, key string, opts ...LockOption) (*Hold, error) {
	return w.acquire(ctx, kindWrite, key, nil, opts, true)
}

// WithLock runs fn while holding the lock on key. fn's context is cancelled
// when the hold is lost (lease ended, renewal failed) or ctx is; the hold is
// released when fn returns. fn's error comes back as it is; a hold lost
// under fn makes a nil error ErrNotHeld.
func (w *Warden) WithLock(ctx context.Context, key string, fn func(ctx context.Context) error, opts ...LockOption) error {
	h, err := w.Lock(ctx, key, opts...)
	if err != nil {
		return err
	}
	fnCtx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(h.Context(), func() { cancel(context.Cause(h.Context())) })
	err = fn(fnCtx)
	stop()
	cancel(nil)
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer rcancel()
	if rerr := h.Release(rctx); rerr != nil && (err == nil || !errors.Is(rerr, ErrNotHeld)) {
		return errors.Join(err, rerr)
	}
	return err
}
