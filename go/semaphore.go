package warden

import (
	"context"
	"fmt"
)

// Semaphore is "at most limit permits at once" across processes (SEM.*), in
// the shape of golang.org/x/sync/semaphore.Weighted. Every user of a key must
// state the same limit.
type Semaphore struct {
	w     *Warden
	key   string
	limit int64
}

// Semaphore returns the semaphore on key with limit permits.
func (w *Warden) Semaphore(key string, limit int64) *Semaphore {
	return &Semaphore{w: w, key: key, limit: limit}
}

// Permit is a semaphore hold of N permits: Release gives them back.
type Permit struct {
	*Hold
	n int64
}

// N is the number of permits held.
func (p *Permit) N() int64 { return p.n }

// Acquire takes n permits, waiting in FIFO order until they are free or ctx
// is done (then it returns ctx.Err()). A large request is never overtaken by
// smaller ones.
func (s *Semaphore) Acquire(ctx context.Context, n int64, opts ...LockOption) (*Permit, error) {
	return s.acquire(ctx, n, opts, false)
}

// TryAcquire takes n permits if they are free now: ErrNotAcquired otherwise.
func (s *Semaphore) TryAcquire(ctx context.Context, n int64, opts ...LockOption) (*Permit, error) {
	return s.acquire(ctx, n, opts, true)
}

func (s *Semaphore) acquire(ctx context.Context, n int64, opts []LockOption, try bool) (*Permit, error) {
	if n < 1 || n > s.limit {
		return nil, fmt.Errorf("%w: %d permits of a semaphore of %d", ErrInvalid, n, s.limit)
	}
	h, err := s.w.acquire(ctx, kindSem, s.key, []any{"LIMIT", s.limit, "PERMITS", n}, opts, try)
	if err != nil {
		return nil, err
	}
	return &Permit{Hold: h, n: n}, nil
}
