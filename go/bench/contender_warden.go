package main

import (
	"context"

	"github.com/redis/go-redis/v9"
	warden "github.com/warden-redis/warden/go"
)

func init() {
	for _, sem := range []bool{false, true} {
		c := contender{name: "warden-lock", label: "warden", limit: 1}
		if sem {
			c = contender{name: "warden-sem", label: "warden", limit: semLimit}
		}
		c.open = func(addr string) (Contender, error) {
			rdb := goRedis(addr)
			return &wardenContender{rdb: rdb, w: warden.New(rdb), sem: sem}, nil
		}
		register(c)
	}
}

type wardenContender struct {
	rdb *redis.Client
	w   *warden.Warden
	// sem: a permit of a semaphore of semLimit instead of a lock
	sem bool
}

func (c *wardenContender) Locker(key string, _ int) Locker {
	if c.sem {
		return &wardenPermit{s: c.w.Semaphore(key, semLimit)}
	}
	return &wardenLock{w: c.w, key: key}
}

func (c *wardenContender) Close() error {
	err := c.w.Close()
	if e := c.rdb.Close(); err == nil {
		err = e
	}
	return err
}

type wardenLock struct {
	w    *warden.Warden
	key  string
	hold *warden.Hold
}

// Acquire: the context's deadline (the budget) becomes the server's WAIT.
func (l *wardenLock) Acquire(ctx context.Context) error {
	h, err := l.w.Lock(ctx, l.key, warden.TTL(lease))
	if err != nil {
		return err
	}
	l.hold = h
	return nil
}

func (l *wardenLock) Release(ctx context.Context) error { return l.hold.Release(ctx) }

type wardenPermit struct {
	s      *warden.Semaphore
	permit *warden.Permit
}

func (p *wardenPermit) Acquire(ctx context.Context) error {
	pm, err := p.s.Acquire(ctx, 1, warden.TTL(lease))
	if err != nil {
		return err
	}
	p.permit = pm
	return nil
}

func (p *wardenPermit) Release(ctx context.Context) error { return p.permit.Release(ctx) }
