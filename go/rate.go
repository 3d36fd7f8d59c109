package warden

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrRateLimited: WaitN's tokens were not taken (errors.Is; the error is a
// *RateLimitError, which says when they would conform).
var ErrRateLimited = errors.New("warden: rate limited")

// RateLimitError is WaitN's answer when its tokens cannot be taken in time:
// they conform only RetryAfter from now, past the context's deadline (the
// server answers such a request at once instead of holding it until the
// deadline), or the server shed it (RateMaxQueue), or, under
// warden.sync-replicas, the replicas did not acknowledge the grant in time
// (RetryAfter 0). Nothing was taken. It is x/time/rate's "would exceed
// context deadline", with the decision that says when to come back.
type RateLimitError struct {
	RateDecision
}

func (e *RateLimitError) Error() string {
	return fmt.Sprintf("warden: rate limited: the tokens conform in %v", e.RetryAfter)
}

// Is makes errors.Is(err, ErrRateLimited) true.
func (e *RateLimitError) Is(target error) bool { return target == ErrRateLimited }

// RateDecision is a limiter's answer to one request: RATE.ACQUIRE's five
// integers (CL.THROTTLE's, in ms), the times as time.Duration.
type RateDecision struct {
	// Allowed: the tokens were taken. Otherwise nothing was.
	Allowed bool
	// Limit is the limiter's burst, the bucket's size: the most tokens
	// taken at once (X-RateLimit-Limit).
	Limit int64
	// Remaining is the whole tokens left now (X-RateLimit-Remaining).
	Remaining int64
	// RetryAfter is, for a request not allowed, how long until it would
	// conform, counting the requests queued ahead of it: exact, not one
	// millisecond earlier (Retry-After). 0 when Allowed (the server's -1;
	// go-redis/redis_rate says -1 there).
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full again
	// (X-RateLimit-Reset).
	ResetAfter time.Duration
}

// RateInfo is what RATE.INFO reports of a limiter.
type RateInfo struct {
	Count  int64
	Period time.Duration
	Burst  int64
	// Remaining is the whole tokens available now.
	Remaining int64
	// ResetAfter is how long until the bucket is full again.
	ResetAfter time.Duration
	// Waiters is the requests queued on the key (from every client).
	Waiters int64
}

// RateOption configures a RateLimiter.
type RateOption func(*rateConfig)

// Burst sets the most tokens taken at once, the bucket's size (default
// count, at most 10^9). A limiter that was idle admits up to Burst at once,
// then count per period.
func Burst(n int64) RateOption {
	return func(c *rateConfig) { c.burst, c.burstSet = n, true }
}

// RateMaxQueue sheds a wait when n or more requests already wait on the key
// (the server's QUEUE n): WaitN returns a *RateLimitError at once instead
// of queueing.
func RateMaxQueue(n int64) RateOption {
	return func(c *rateConfig) { c.maxQueue, c.maxQueueSet = n, true }
}

// maxBurst is the server's largest burst, and the default burst's cap.
const maxBurst = 1_000_000_000

// rateConfig is a limiter's rate and options; replaced whole by SetRate.
type rateConfig struct {
	count    int64
	period   time.Duration
	burst    int64 // 0: the server's default, count (at most maxBurst)
	maxQueue int64 // -1: no QUEUE
	// Whether Burst / RateMaxQueue were given: a value given must be in
	// range (Burst(0) or RateMaxQueue(-5) is an error, not the default).
	burstSet, maxQueueSet bool
}

func newRateConfig(count int64, period time.Duration, opts []RateOption) *rateConfig {
	c := &rateConfig{count: count, period: period, maxQueue: -1}
	for _, o := range opts {
		o(c)
	}
	return c
}

// effectiveBurst is the burst the server uses.
func (c *rateConfig) effectiveBurst() int64 {
	if c.burst > 0 {
		return c.burst
	}
	return min(c.count, maxBurst)
}

// check refuses what the server would refuse for want of a meaning (the
// ranges' upper bounds are the server's to state), and a period that is not
// whole milliseconds, which the server could only get rounded: another rate.
func (c *rateConfig) check() error {
	switch {
	case c.count < 1:
		return fmt.Errorf("%w: rate count %d: at least 1 token per period", ErrInvalid, c.count)
	case c.period < time.Millisecond || c.period%time.Millisecond != 0:
		return fmt.Errorf("%w: rate period %v: whole milliseconds, at least 1 ms", ErrInvalid, c.period)
	case c.burst < 0 || c.burstSet && c.burst < 1:
		return fmt.Errorf("%w: burst %d: at least 1", ErrInvalid, c.burst)
	case c.maxQueueSet && c.maxQueue < 0:
		return fmt.Errorf("%w: max queue %d: at least 0", ErrInvalid, c.maxQueue)
	}
	return nil
}

// args is the rate every request states: key count period [BURST b].
func (c *rateConfig) args(cmd, key string) []any {
	args := []any{cmd, key, c.count, c.period.Milliseconds()}
	if c.burst > 0 {
		args = append(args, "BURST", c.burst)
	}
	return args
}

// RateLimiter is "at most count tokens per period, burst at once" across
// processes (RATE.*), computed by the server (GCRA, exact), in the shape of
// golang.org/x/time/rate.Limiter: Wait/WaitN wait for tokens, Allow/AllowN
// take them only if they conform now. It is safe for concurrent use.
//
// Every request states the rate: while the limiter exists the server
// refuses another one (a redis.Error, "ERR limiter rate is ..."), so that
// two versions of a service cannot silently disagree on the bound; SetRate
// changes it on purpose.
type RateLimiter struct {
	w   *Warden
	key string
	cfg atomic.Pointer[rateConfig]
}

// RateLimiter returns the limiter on key: count tokens every period (whole
// ms, 1 ms to a day), at most Burst at once (default count). Nothing is sent
// until a call; arguments out of range make each call fail (ErrInvalid, or
// the server's error).
func (w *Warden) RateLimiter(key string, count int64, period time.Duration, opts ...RateOption) *RateLimiter {
	l := &RateLimiter{w: w, key: key}
	l.cfg.Store(newRateConfig(count, period, opts))
	return l
}

// Key is the limiter's key.
func (l *RateLimiter) Key() string { return l.key }

// Burst is the most tokens taken at once: Burst's, or count.
func (l *RateLimiter) Burst() int64 { return l.cfg.Load().effectiveBurst() }

// acquireArgs checks c and n and returns RATE.ACQUIRE's arguments for n tokens.
func (l *RateLimiter) acquireArgs(c *rateConfig, n int64) ([]any, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if b := c.effectiveBurst(); n < 1 || n > b {
		return nil, fmt.Errorf("%w: %d tokens of a limiter of burst %d", ErrInvalid, n, b)
	}
	return append(c.args("RATE.ACQUIRE", l.key), "COST", n), nil
}

// Allow takes one token if it conforms now and nobody waits ahead. It is
// x/time/rate's Allow: no context, and false on any error too (fail
// closed); AllowN says which.
func (l *RateLimiter) Allow() bool {
	d, err := l.AllowN(context.Background(), 1)
	return err == nil && d.Allowed
}

// AllowN takes n tokens if they conform now and nobody waits ahead (it
// never overtakes a waiter), without waiting: the decision says whether,
// and when to retry. One command on rdb.
func (l *RateLimiter) AllowN(ctx context.Context, n int64) (RateDecision, error) {
	args, err := l.acquireArgs(l.cfg.Load(), n)
	if err != nil {
		return RateDecision{}, err
	}
	if err := l.w.begin(); err != nil {
		return RateDecision{}, err
	}
	defer l.w.calls.Done()
	return l.try(ctx, args)
}

// try is RATE.ACQUIRE without WAIT on rdb. Tokens a lost reply took are
// not given back (nobody knows whether it ran): fewer admitted, never more.
func (l *RateLimiter) try(ctx context.Context, args []any) (RateDecision, error) {
	words, err := l.w.rdb.Do(ctx, args...).Slice()
	if err != nil {
		var rerr redis.Error
		if errors.As(err, &rerr) {
			return RateDecision{}, serverErr(err)
		}
		if lerr := late(ctx); lerr != nil {
			return RateDecision{}, lerr
		}
		return RateDecision{}, fmt.Errorf("warden: RATE.ACQUIRE: %w", err)
	}
	return decisionOf(words)
}

// Wait is WaitN(ctx, 1).
func (l *RateLimiter) Wait(ctx context.Context) error { return l.WaitN(ctx, 1) }

// WaitN takes n tokens, waiting in the server's FIFO queue until they
// conform (a request is never overtaken, not even by a smaller one) or ctx
// is done. The context's deadline is the server's WAIT: tokens that cannot
// conform before it are answered at once with a *RateLimitError
// (errors.Is ErrRateLimited) carrying the retry-after, not at the deadline.
// A cancel takes the request out of the queue and returns ctx.Err(): it
// takes nothing, and tokens a grant took as the cancel raced it are given
// back (RATE.REFUND). Without a deadline it waits until granted or
// cancelled.
func (l *RateLimiter) WaitN(ctx context.Context, n int64) error {
	c := l.cfg.Load()
	args, err := l.acquireArgs(c, n)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	w := l.w
	if err := w.begin(); err != nil {
		return err
	}
	defer w.calls.Done()

	// 1. The fast try, as for locks: one command on rdb, no waiter
	// connection. Skipped while a call of this Warden waits on the key: the
	// server would answer it limited (it never overtakes a waiter).
	q := queueKey{"RATE", l.key}
	if w.waitingOn(q) == 0 {
		d, err := l.try(ctx, args)
		if err != nil || d.Allowed {
			return err
		}
		// Cannot conform within the deadline: the server would answer the
		// same at once.
		if deadline, has := ctx.Deadline(); has {
			ms, _ := waitArg(deadline, true)
			if d.RetryAfter > time.Duration(ms)*time.Millisecond {
				return &RateLimitError{d}
			}
		}
	}

	// 2. Wait on a waiter connection, the context's deadline as WAIT.
	node, err := w.node(ctx, l.key)
	if err != nil {
		return err
	}
	build := func(waitMs int64) []any {
		cmd := append(append([]any{}, args...), "WAIT", waitMs)
		if c.maxQueue >= 0 {
			cmd = append(cmd, "QUEUE", c.maxQueue)
		}
		return cmd
	}
	left := w.waiting(q)
	// giveBack runs when the caller gave up: only a grant read from the
	// server is refunded (never a guess), so a cancel never gives back more
	// than it took. A grant lost with a killed connection stays taken.
	reply, err := w.waitMoved(ctx, node, build, nil, func(r any) {
		if _, granted := grantOf(r); granted {
			l.refundTaken(n)
		}
	})
	left()
	if err != nil {
		return err
	}
	switch r := reply.(type) {
	case serverError:
		return serverErr(r)
	case []any:
		d, err := decisionOf(r)
		if err != nil {
			return err
		}
		if !d.Allowed {
			return &RateLimitError{d}
		}
		if err := late(ctx); err != nil {
			l.refundTaken(n) // a grant past the caller's deadline is never kept
			return err
		}
		return nil
	}
	// nil: the wait ended unanswered (its deadline, or CLIENT UNBLOCK).
	return w.noGrant(ctx, -1)
}

// refundTaken gives back the tokens of a grant its caller did not get, once:
// a refund that may have run is not sent again (after Close, or with no
// waiter connection to be had within 5 s, the tokens stay taken: fewer
// admitted, never more).
func (l *RateLimiter) refundTaken(n int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// On a waiter connection of warden's own, never through rdb: go-redis
	// resends a command whose connection dropped before its reply (its
	// MaxRetries), and a refund that ran and was resent gives back twice.
	node, err := l.w.node(ctx, l.key)
	if err == nil {
		var c *conn
		if c, err = node.pool.get(ctx); err == nil {
			var r any
			if r, err = c.do(5*time.Second, "RATE.REFUND", l.key, n); err != nil {
				node.pool.discard(c)
			} else {
				node.pool.put(c)
				if e, ok := r.(serverError); ok {
					err = e
				}
			}
		}
	}
	if err != nil {
		l.w.log.Warn("warden: giving back a rate grant failed or its reply was lost (fewer admitted)", "key", l.key, "tokens", n, "err", err)
	}
}

// Refund gives n tokens back (RATE.REFUND), never beyond a full bucket, and
// the server serves the waiters that now conform: reserve with AllowN or
// WaitN, then give back what was not used. false: there is no limiter (its
// bucket is full), nothing changed.
//
// go-redis resends a command whose reply was lost (rdb's MaxRetries): a
// refund resent after it ran gives back twice (still never beyond full).
func (l *RateLimiter) Refund(ctx context.Context, n int64) (bool, error) {
	if n < 1 || n > maxBurst {
		return false, fmt.Errorf("%w: refund of %d tokens", ErrInvalid, n)
	}
	if err := l.w.begin(); err != nil {
		return false, err
	}
	defer l.w.calls.Done()
	r, err := l.w.rdb.Do(ctx, "RATE.REFUND", l.key, n).Int64()
	if err != nil {
		return false, serverErr(err)
	}
	return r == 1, nil
}

// SetRate changes the limiter's rate (RATE.CONFIG), keeping the tokens it
// owes, and makes this handle as w.RateLimiter(key, count, period, opts...)
// would: its later requests state the new rate. Waiters that stated the old
// rate are answered the server's error ("... rate was changed while this
// request waited"); other handles on the key must be given the new rate
// too. false: there is no limiter (its bucket is full), and the next
// request creates it at the rate it states. On an error the handle is
// unchanged.
func (l *RateLimiter) SetRate(ctx context.Context, count int64, period time.Duration, opts ...RateOption) (bool, error) {
	c := newRateConfig(count, period, opts)
	if err := c.check(); err != nil {
		return false, err
	}
	if err := l.w.begin(); err != nil {
		return false, err
	}
	defer l.w.calls.Done()
	r, err := l.w.rdb.Do(ctx, c.args("RATE.CONFIG", l.key)...).Int64()
	if err != nil {
		return false, serverErr(err)
	}
	l.cfg.Store(c)
	return r == 1, nil
}

// Info is the limiter's state (RATE.INFO); nil when there is no limiter on
// the key: its bucket is full (Remaining would be the burst) and nobody waits.
func (l *RateLimiter) Info(ctx context.Context) (*RateInfo, error) {
	if err := l.w.begin(); err != nil {
		return nil, err
	}
	defer l.w.calls.Done()
	reply, err := l.w.rdb.Do(ctx, "RATE.INFO", l.key).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, serverErr(err)
	}
	f, err := fieldsOf(reply)
	if err != nil {
		return nil, err
	}
	return &RateInfo{
		Count:      f["count"],
		Period:     time.Duration(f["period"]) * time.Millisecond,
		Burst:      f["burst"],
		Remaining:  f["remaining"],
		ResetAfter: time.Duration(f["reset_after"]) * time.Millisecond,
		Waiters:    f["waiters"],
	}, nil
}

// decisionOf reads RATE.ACQUIRE's [limited, burst, remaining, retry_after,
// reset_after].
func decisionOf(words []any) (RateDecision, error) {
	if len(words) != 5 {
		return RateDecision{}, fmt.Errorf("warden: RATE.ACQUIRE answered %d values, not 5", len(words))
	}
	var v [5]int64
	for i, x := range words {
		n, ok := x.(int64)
		if !ok {
			return RateDecision{}, fmt.Errorf("warden: RATE.ACQUIRE answered %v", words)
		}
		v[i] = n
	}
	ms := func(n int64) time.Duration { return time.Duration(max(n, 0)) * time.Millisecond }
	d := RateDecision{Allowed: v[0] == 0, Limit: v[1], Remaining: v[2], ResetAfter: ms(v[4])}
	if !d.Allowed {
		d.RetryAfter = ms(v[3])
	}
	return d, nil
}

// fieldsOf reads a map reply of integers: a RESP3 map or a RESP2 flat array.
func fieldsOf(reply any) (map[string]int64, error) {
	out := map[string]int64{}
	put := func(k, v any) {
		if n, ok := v.(int64); ok {
			out[fmt.Sprint(k)] = n
		}
	}
	switch r := reply.(type) {
	case map[any]any:
		for k, v := range r {
			put(k, v)
		}
	case []any:
		for i := 0; i+1 < len(r); i += 2 {
			put(r[i], r[i+1])
		}
	default:
		return nil, fmt.Errorf("warden: RATE.INFO answered %T", reply)
	}
	return out, nil
}
