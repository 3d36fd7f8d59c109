package warden

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Codec turns values into the bytes cached and back.
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

type jsonCodec struct{}

func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// CacheOption configures Load. Options pass by value: a Load that keeps
// nothing allocates nothing for them (a near-cache hit allocates nothing).
type CacheOption func(cacheOptions) cacheOptions

type cacheOptions struct {
	codec    Codec
	lease    time.Duration
	maxQueue int64
	near     *NearCache
}

// WithCodec sets how values are encoded (default encoding/json; []byte and
// string are stored raw).
func WithCodec(c Codec) CacheOption {
	return func(o cacheOptions) cacheOptions { o.codec = c; return o }
}

// Lease is how long a loader may take before another caller may load
// instead (default 10 s).
func Lease(d time.Duration) CacheOption {
	return func(o cacheOptions) cacheOptions { o.lease = d; return o }
}

// CacheMaxQueue sheds a miss that would wait behind n or more waiters
// (QUEUE n): Load returns ErrNotAcquired at once.
func CacheMaxQueue(n int64) CacheOption {
	return func(o cacheOptions) cacheOptions { o.maxQueue = n; return o }
}

// Load returns the value cached at key, or runs loader once across every
// process asking for key at the same time (CACHE.GET/FILL/ABANDON): the
// others wait for its value, within ctx. The value is stored as a plain
// Redis string for ttl (0: no expiry). A loader error abandons the lease (the
// next waiter loads) and is returned.
func Load[T any](ctx context.Context, w *Warden, key string, ttl time.Duration, loader func(ctx context.Context) (T, error), opts ...CacheOption) (T, error) {
	var zero T
	o := cacheOptions{codec: jsonCodec{}, lease: 10 * time.Second, maxQueue: -1}
	for _, f := range opts {
		o = f(o)
	}
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	c := cacheCall[T]{w: w, key: key, ttl: ttl, loader: loader, o: o}
	if nc := o.near; nc != nil && !w.closing() {
		if v, ok := nearHit(nc, c); ok {
			return v, nil
		}
		nc.misses.Add(1)
		// A fresh value in one round trip on the tracking connection; a
		// miss, a stale value or a dropped connection goes the usual way.
		if raw, ok := nc.peek(ctx, key); ok {
			if v, err := c.decode(raw); err == nil {
				return v, nil
			}
		}
	}
	if err := w.begin(); err != nil {
		return zero, err
	}
	defer w.calls.Done()
	q := queueKey{"CACHE", key}
	// Fast path: a hit, or the lease, in one round trip on the shared client.
	// Skipped while a call of this Warden waits on the key: a load is under
	// way, so the try would miss and the wait (which also answers a hit at
	// once) would follow.
	if w.waitingOn(q) == 0 {
		reply, err := w.rdb.Do(ctx, "CACHE.GET", key, millis(o.lease)).Slice()
		if err != nil {
			var rerr redis.Error
			if errors.As(err, &rerr) {
				return zero, serverErr(err)
			}
			// A lease granted in a reply that was lost lapses with its lease time.
			if lerr := late(ctx); lerr != nil {
				return zero, lerr
			}
			return zero, err
		}
		if v, done, err := c.handle(ctx, reply); done {
			return v, err
		}
	}
	n, err := w.node(ctx, key)
	if err != nil {
		return zero, err
	}
	build := func(waitMs int64) []any {
		cmd := []any{"CACHE.GET", key, millis(o.lease), "WAIT", waitMs}
		if o.maxQueue >= 0 {
			cmd = append(cmd, "QUEUE", o.maxQueue)
		}
		return cmd
	}
	left := w.waiting(q)
	r, err := w.waitMoved(ctx, n, build, nil, func(r any) {
		if token, ok := grantOf(r); ok {
			c.abandon(token)
		}
	})
	left()
	if err != nil {
		return zero, err
	}
	if e, ok := r.(serverError); ok {
		return zero, serverErr(e)
	}
	reply, _ := r.([]any)
	if token, ok := grantOf(reply); ok && reply[0] == nil {
		if err := late(ctx); err != nil {
			c.abandon(token)
			return zero, err
		}
	}
	if v, done, err := c.handle(ctx, reply); done {
		return v, err
	}
	return zero, w.noGrant(ctx, o.maxQueue)
}

type cacheCall[T any] struct {
	w      *Warden
	key    string
	ttl    time.Duration
	loader func(ctx context.Context) (T, error)
	o      cacheOptions
}

// handle acts on a CACHE.GET reply [value, lease]; done is false for [nil, nil].
func (c cacheCall[T]) handle(ctx context.Context, reply []any) (T, bool, error) {
	var zero T
	if len(reply) != 2 {
		return zero, false, nil
	}
	value, token := reply[0], reply[1]
	switch {
	case value != nil:
		v, err := c.decode(value)
		if err == nil && token != nil {
			// A stale value: serve it and reload in the background.
			c.w.bg.Add(1)
			go func() {
				defer c.w.bg.Done()
				// A loader's panic here has no caller to reach: it would end
				// the process. fill has abandoned the lease by now.
				defer func() {
					if r := recover(); r != nil {
						c.w.log.Error("warden: background refresh panicked", "key", c.key, "panic", r)
					}
				}()
				bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.o.lease)
				defer cancel()
				if _, err := c.fill(bg, token); err != nil {
					c.w.log.Warn("warden: background refresh failed", "key", c.key, "err", err)
				}
			}()
		}
		return v, true, err
	case token != nil:
		v, err := c.fill(ctx, token)
		return v, true, err
	}
	return zero, false, nil
}

// fill runs the loader under the lease and stores its value; a loader error
// or panic abandons the lease.
func (c cacheCall[T]) fill(ctx context.Context, token any) (v T, err error) {
	filled := false
	defer func() {
		if !filled {
			c.abandon(token)
		}
	}()
	v, err = c.loader(ctx)
	if err != nil {
		return v, err
	}
	data, err := c.encode(v)
	if err != nil {
		return v, err
	}
	args := []any{"CACHE.FILL", c.key, token, data}
	if c.ttl > 0 {
		args = append(args, "PX", millis(c.ttl))
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	// 0 (the lease lapsed or was revoked by a write): the value is still
	// this caller's answer, only not stored.
	if err := c.w.rdb.Do(fctx, args...).Err(); err != nil {
		return v, serverErr(err)
	}
	filled = true
	return v, nil
}

func (c cacheCall[T]) abandon(token any) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.w.rdb.Do(ctx, "CACHE.ABANDON", c.key, token).Err(); err != nil && !errors.Is(err, redis.Nil) {
		c.w.log.Warn("warden: abandoning a cache lease failed (it will lapse)", "key", c.key, "err", err)
	}
}

func (c cacheCall[T]) encode(v T) ([]byte, error) {
	switch x := any(v).(type) {
	case []byte:
		return x, nil
	case string:
		return []byte(x), nil
	}
	return c.o.codec.Marshal(v)
}

func (c cacheCall[T]) decode(value any) (T, error) {
	var v T
	s, ok := value.(string)
	if !ok {
		return v, fmt.Errorf("warden: cached value of %s is %T", c.key, value)
	}
	switch p := any(&v).(type) {
	case *[]byte:
		*p = []byte(s)
		return v, nil
	case *string:
		*p = s
		return v, nil
	}
	err := c.o.codec.Unmarshal([]byte(s), &v)
	return v, err
}
