package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// A Locker is one goroutine's handle on the key: Acquire waits until it holds the lock (or one
// permit) or fails; Release gives it back.
type Locker interface {
	Acquire(ctx context.Context) error
	Release(ctx context.Context) error
}

// A Contender is one library in one process: the client it opened and a Locker per goroutine.
type Contender interface {
	Locker(key string, goroutine int) Locker
	Close() error
}

// contender describes one row of the bench: how to open it, which workload it runs, its label.
type contender struct {
	name  string
	label string
	// short names it in the ratio lines
	short string
	// limit is how many may hold at once: 1 for a lock, the limit for a semaphore.
	limit int
	open  func(addr string) (Contender, error)
}

// registry holds every contender this binary was built with, in the order the tables list them.
var registry []contender

func register(c contender) {
	registry = append(registry, c)
	sort.SliceStable(registry, func(i, j int) bool { return order(registry[i].name) < order(registry[j].name) })
}

// order puts warden first, then the incumbents, locks before semaphores.
func order(name string) int {
	for i, n := range []string{"warden-lock", "redsync-default-lock", "redsync-tries-lock",
		"redislock-linear-lock", "redislock-exp-lock", "warden-sem", "redsync-sem"} {
		if n == name {
			return i
		}
	}
	return math.MaxInt
}

func find(name string) (contender, bool) {
	for _, c := range registry {
		if c.name == name {
			return c, true
		}
	}
	return contender{}, false
}

// goRedis is the client every contender of a process shares, as an application would: go-redis v9
// with its default pool (10 connections per GOMAXPROCS).
func goRedis(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr})
}

// redsyncTries is "enough tries not to fail": with redsync's shortest sleep (50 ms) 200 tries
// last at least the 10 s budget, so the budget (the context) ends a wait, not the count.
const redsyncTries = int(budget / (50 * time.Millisecond))

func init() {
	for _, v := range []struct {
		name, label string
		opts        []redsync.Option
	}{
		{"redsync-default-lock", "redsync v4.17.0, defaults (32 tries, 50-250 ms sleeps)", nil},
		{"redsync-tries-lock", fmt.Sprintf("redsync v4.17.0, %d tries (50-250 ms sleeps)", redsyncTries),
			[]redsync.Option{redsync.WithTries(redsyncTries)}},
	} {
		short := "redsync's defaults"
		if v.opts != nil {
			short = fmt.Sprintf("redsync (%d tries)", redsyncTries)
		}
		opts := append([]redsync.Option{redsync.WithExpiry(lease)}, v.opts...)
		register(contender{name: v.name, label: v.label, short: short, limit: 1, open: func(addr string) (Contender, error) {
			rdb := goRedis(addr)
			return &redsyncContender{rdb: rdb, rs: redsync.New(goredis.NewPool(rdb)), opts: opts}, nil
		}})
	}
	register(contender{name: "redislock-linear-lock", label: "bsm/redislock v0.10.0, LinearBackoff(10 ms)",
		short: "redislock (linear)", limit: 1,
		open: func(addr string) (Contender, error) {
			rdb := goRedis(addr)
			return &redislockContender{rdb: rdb, c: redislock.New(rdb),
				retry: func() redislock.RetryStrategy { return redislock.LinearBackoff(10 * time.Millisecond) }}, nil
		}})
	register(contender{name: "redislock-exp-lock", label: "bsm/redislock v0.10.0, ExponentialBackoff(16 ms, 256 ms)",
		short: "redislock (exponential)", limit: 1,
		open: func(addr string) (Contender, error) {
			rdb := goRedis(addr)
			return &redislockContender{rdb: rdb, c: redislock.New(rdb),
				// a strategy counts its attempts: a new one per Obtain
				retry: func() redislock.RetryStrategy {
					return redislock.ExponentialBackoff(16*time.Millisecond, 256*time.Millisecond)
				}}, nil
		}})
	register(contender{name: "redsync-sem", label: fmt.Sprintf("redsync v4.17.0 as a semaphore (%d mutexes)", semLimit),
		limit: semLimit, open: func(addr string) (Contender, error) {
			rdb := goRedis(addr)
			return &redsyncSemContender{redsyncContender{rdb: rdb, rs: redsync.New(goredis.NewPool(rdb)),
				opts: []redsync.Option{redsync.WithExpiry(lease)}}}, nil
		}})
}

type redsyncContender struct {
	rdb  *redis.Client
	rs   *redsync.Redsync
	opts []redsync.Option
}

func (c *redsyncContender) Locker(key string, _ int) Locker {
	return &redsyncLocker{m: c.rs.NewMutex(key, c.opts...)}
}

func (c *redsyncContender) Close() error { return c.rdb.Close() }

type redsyncLocker struct{ m *redsync.Mutex }

func (l *redsyncLocker) Acquire(ctx context.Context) error { return l.m.LockContext(ctx) }

func (l *redsyncLocker) Release(ctx context.Context) error {
	_, err := l.m.UnlockContext(ctx)
	return err
}

// redsyncSem is what a redsync user builds for "at most N at once" (redsync has no semaphore):
// N mutexes key:0..N-1, one round of TryLock over them, then redsync's own sleep (50-250 ms)
// before the next round, for at most redsync's 32 rounds or the budget.
type redsyncSem struct {
	slots []*redsync.Mutex
	held  *redsync.Mutex
	first int
}

type redsyncSemContender struct{ redsyncContender }

func (c *redsyncSemContender) Locker(key string, goroutine int) Locker {
	s := &redsyncSem{first: goroutine}
	for i := 0; i < semLimit; i++ {
		s.slots = append(s.slots, c.rs.NewMutex(fmt.Sprintf("%s:%d", key, i), c.opts...))
	}
	return s
}

func (s *redsyncSem) Acquire(ctx context.Context) error {
	for round := 0; ; round++ {
		// start each round at another slot, so the goroutines do not all hit slot 0 first
		s.first = (s.first + 1) % len(s.slots)
		for i := range s.slots {
			m := s.slots[(s.first+i)%len(s.slots)]
			if err := m.TryLockContext(ctx); err == nil {
				s.held = m
				return nil
			}
		}
		if round == 31 {
			return redsync.ErrFailed
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(50+rand.IntN(200)) * time.Millisecond):
		}
	}
}

func (s *redsyncSem) Release(ctx context.Context) error {
	_, err := s.held.UnlockContext(ctx)
	s.held = nil
	return err
}

type redislockContender struct {
	rdb   *redis.Client
	c     *redislock.Client
	retry func() redislock.RetryStrategy
}

func (c *redislockContender) Locker(key string, _ int) Locker {
	return &redislockLocker{c: c, key: key}
}

func (c *redislockContender) Close() error { return c.rdb.Close() }

type redislockLocker struct {
	c    *redislockContender
	key  string
	lock *redislock.Lock
}

func (l *redislockLocker) Acquire(ctx context.Context) error {
	lock, err := l.c.c.Obtain(ctx, l.key, lease, &redislock.Options{RetryStrategy: l.c.retry()})
	if err != nil {
		return err
	}
	l.lock = lock
	return nil
}

func (l *redislockLocker) Release(ctx context.Context) error { return l.lock.Release(ctx) }
