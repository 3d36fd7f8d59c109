package warden

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// kind is one of warden's lock types: its commands and what its release replies mean.
type kind struct {
	acquire, release, extend string
	// queue names the server's wait queue the kind's requests share on a
	// key (a reader and a writer of one key wait in one queue).
	queue string
	// sem: SEM.RELEASE answers 0 for "not held"; LOCK.RELEASE and
	// RWLOCK.UNLOCK answer 0 for "re-entrant holds remain" and -1 for "not held".
	sem bool
}

var (
	kindLock  = &kind{acquire: "LOCK.ACQUIRE", release: "LOCK.RELEASE", extend: "LOCK.EXTEND", queue: "LOCK"}
	kindRead  = &kind{acquire: "RWLOCK.READ", release: "RWLOCK.UNLOCK", extend: "RWLOCK.EXTEND", queue: "RWLOCK"}
	kindWrite = &kind{acquire: "RWLOCK.WRITE", release: "RWLOCK.UNLOCK", extend: "RWLOCK.EXTEND", queue: "RWLOCK"}
	kindSem   = &kind{acquire: "SEM.ACQUIRE", release: "SEM.RELEASE", extend: "SEM.EXTEND", queue: "SEM", sem: true}
)

// LockOption configures one acquire (locks, read-write locks, semaphores).
type LockOption func(*lockOptions)

type lockOptions struct {
	ttl      time.Duration
	ttlSet   bool
	maxQueue int64
	wait     time.Duration
}

// TTL sets the hold's lease: it ends d after the grant unless extended, and
// no watchdog renews it. Without TTL a watchdog renews a lease of DefaultTTL
// (WithWatchdogTTL), or the server's warden.max-lease if lower, at a third
// of it until the hold is released. A d above warden.max-lease is capped
// and renewed: the server holds at most the cap, renewed until d after the
// grant, when the hold lapses. A d <= 0 makes the call fail with
// ErrInvalid (it is not the watchdog).
func TTL(d time.Duration) LockOption {
	return func(o *lockOptions) { o.ttl, o.ttlSet = d, true }
}

// MaxQueue sheds the request when n or more requests already wait on the
// key (the server's QUEUE n): it returns ErrNotAcquired at once instead of
// queueing.
func MaxQueue(n int64) LockOption { return func(o *lockOptions) { o.maxQueue = n } }

// Wait bounds the wait to d on top of the context's own deadline; past it
// the call returns context.DeadlineExceeded.
func Wait(d time.Duration) LockOption { return func(o *lockOptions) { o.wait = d } }

func lockOpts(opts []LockOption) lockOptions {
	o := lockOptions{maxQueue: -1}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// millis is a lease in whole ms for the server, rounded up: the server's
// lease is never shorter than the one counted here.
func millis(d time.Duration) int64 {
	ms := int64((d + time.Millisecond - 1) / time.Millisecond)
	if ms < 1 {
		ms = 1
	}
	return ms
}

// waitArg is the WAIT for a command sent now: what remains of the deadline
// less a margin for the reply's way back (a tenth, 1..5 ms), at least 1 ms
// (WAIT 0 means forever); 0 without a deadline. ok is false once nothing
// remains: the command must not be sent.
func waitArg(deadline time.Time, has bool) (ms int64, ok bool) {
	if !has {
		return 0, true
	}
	remaining := time.Until(deadline)
	if remaining <= 0 {
		return 0, false
	}
	margin := min(max(remaining/10, time.Millisecond), 5*time.Millisecond)
	return max((remaining - margin).Milliseconds(), 1), true
}

// acquire runs the overload rule: a fast try without WAIT on rdb's pool,
// then (unless try) a wait on a waiter connection with the deadline as WAIT.
// A lease above the server's warden.max-lease is asked for at the cap (the
// server's refusal names it: the acquire, which changed nothing, is sent
// again at the cap) and renewed up to the lease asked for.
func (w *Warden) acquire(ctx context.Context, k *kind, key string, extra []any, opts []LockOption, try bool) (*Hold, error) {
	o := lockOpts(opts)
	if o.ttlSet && o.ttl <= 0 {
		// A zero TTL is more likely a missing value than a wish for the
		// watchdog: say so rather than hold for as long as the process lives.
		return nil, fmt.Errorf("%w: TTL %v: a lease needs at least 1 ms (omit TTL for the watchdog)", ErrInvalid, o.ttl)
	}
	if o.wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.wait)
		defer cancel()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := w.begin(); err != nil {
		return nil, err
	}
	defer w.calls.Done()
	asked, watchdog := o.ttl, !o.ttlSet
	if watchdog {
		asked = w.watchdogTTL
	}
	lease := w.capped(asked)
	for attempt := 0; ; attempt++ {
		h := &Hold{w: w, kind: k, key: key, owner: w.owner(), lease: lease, watchdog: watchdog}
		if !watchdog {
			h.asked = asked
		}
		got, err := w.acquireOnce(ctx, h, extra, o, try)
		if c, ok := leaseCapOf(err); ok && c < lease && attempt < 2 {
			w.learnCap(c)
			lease = c
			continue
		}
		return got, err
	}
}

// acquireOnce is one acquire of h's lease.
func (w *Warden) acquireOnce(ctx context.Context, h *Hold, extra []any, o lockOptions, try bool) (*Hold, error) {
	k, key := h.kind, h.key
	args := append([]any{k.acquire, key, h.owner, millis(h.lease)}, extra...)

	q := queueKey{k.queue, key}
	if try || w.waitingOn(q) == 0 {
		if got, err := w.tryFast(ctx, h, args); got != nil || err != nil {
			return got, err
		}
		if try {
			return nil, ErrNotAcquired
		}
	}
	// else a call of this Warden waits on the key: the server's queue is
	// not empty and a try never overtakes a queued waiter (SPEC), so it
	// would be refused. Straight to the wait, a round trip sooner.

	// 2. Wait on a waiter connection, the context's deadline as WAIT.
	n, err := w.node(ctx, key)
	if err != nil {
		return nil, err
	}
	build := func(waitMs int64) []any {
		cmd := append(append([]any{}, args...), "WAIT", waitMs)
		if o.maxQueue >= 0 {
			cmd = append(cmd, "QUEUE", o.maxQueue)
		}
		return cmd
	}
	sent := time.Now()
	left := w.waiting(q)
	reply, err := w.waitMoved(ctx, n, build, &withdrawal{key: key, owner: h.owner}, func(any) { h.giveBack() })
	left()
	if err != nil {
		return nil, err
	}
	if e, ok := reply.(serverError); ok {
		return nil, serverErr(e)
	}
	if fence, ok := reply.(int64); ok {
		if err := late(ctx); err != nil {
			h.giveBack() // a grant past the caller's deadline is never kept
			return nil, err
		}
		if w.closing() {
			h.giveBack()
			return nil, ErrClosed
		}
		// The server counts the lease from the grant, after a wait that may
		// have used much of it: the local lease is anchored again by an
		// EXTEND sent now, after the grant.
		if time.Since(sent) > h.lease/3 {
			anchored, err := h.reanchor(ctx)
			if err != nil {
				h.giveBack()
				return nil, err
			}
			sent = anchored
		}
		return h.start(fence, sent), nil
	}
	return nil, w.noGrant(ctx, o.maxQueue)
}

// tryFast is the fast path: the acquire without WAIT on rdb's pool, one
// round trip and no waiter connection. Both results nil: the key is busy.
func (w *Warden) tryFast(ctx context.Context, h *Hold, args []any) (*Hold, error) {
	sent := time.Now()
	fence, err := w.rdb.Do(ctx, args...).Int64()
	switch {
	case err == nil:
		if w.closing() {
			h.giveBack() // Close began during the call: nothing outlives it
			return nil, ErrClosed
		}
		return h.start(fence, sent), nil
	case errors.Is(err, redis.Nil):
		return nil, nil
	}
	var rerr redis.Error
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		// go-redis gave up waiting for its pool, a dial or a retry's
		// pause: the command most likely never ran. The caller is not
		// kept waiting for a give-back that may itself wait for the pool.
		h.giveBackLater()
	case !errors.As(err, &rerr) || h.kind.sem && strings.Contains(err.Error(), "already holds"):
		// The command may have run (a lost reply, or go-redis retried it
		// after it did): give back whatever the owner holds.
		h.giveBack()
	}
	if errors.As(err, &rerr) {
		return nil, serverErr(err)
	}
	if lerr := late(ctx); lerr != nil {
		return nil, lerr // go-redis cut the read at the context's deadline
	}
	return nil, fmt.Errorf("warden: %s: %w", h.kind.acquire, err)
}

// late is the caller's context error, or DeadlineExceeded once its deadline
// passed even if the context has not noticed yet.
func late(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// noGrant explains a nil reply to a WAIT: shed by QUEUE (early), or the
// deadline (the WAIT ends a margin before the context does).
func (w *Warden) noGrant(ctx context.Context, maxQueue int64) error {
	d, has := ctx.Deadline()
	if !has {
		return ErrNotAcquired
	}
	remaining := time.Until(d)
	if maxQueue >= 0 && remaining > 10*time.Millisecond+remaining/10 {
		return fmt.Errorf("%w: shed (more than %d waiting)", ErrNotAcquired, maxQueue)
	}
	t := time.NewTimer(max(remaining, 0))
	defer t.Stop()
	select {
	case <-w.done:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return context.DeadlineExceeded
	}
}

// waitMoved is wait, following MOVED replies (a slot that moved since the
// cluster client's slot map was read): the command did not run there, so
// it is sent again to the master that owns the slot now, within ctx.
func (w *Warden) waitMoved(ctx context.Context, n node, build func(waitMs int64) []any, wd *withdrawal, giveBack func(reply any)) (any, error) {
	for range 3 {
		reply, err := w.wait(ctx, n, build, wd, giveBack)
		e, ok := reply.(serverError)
		if err != nil || !ok || !strings.HasPrefix(string(e), "MOVED ") {
			return reply, err
		}
		f := strings.Fields(string(e))
		if len(f) != 3 {
			return reply, nil
		}
		if n, err = w.nodeAt(ctx, f[2]); err != nil {
			return reply, nil
		}
	}
	return w.wait(ctx, n, build, wd, giveBack)
}

type result struct {
	reply any
	err   error
}

// withdrawal names a waiting request to WARDEN.WITHDRAW: its key and its
// owner. Only a lock, read-write lock or semaphore request has one (a rate
// limiter's or a cache reader's wait has no owner), and only with an owner
// of its own: Warden.owner makes a fresh one per acquire, so a withdrawal
// can only take out the request this call is waiting on.
type withdrawal struct{ key, owner string }

// wait sends build(WAIT) on a waiter connection of n and returns the reply.
// When ctx ends first (or Close begins) it takes the waiter out of the
// server's queue (WARDEN.WITHDRAW for wd, else CLIENT UNBLOCK, else CLIENT
// KILL), hands any grant that raced it to giveBack (nil when the reply is
// unknown) and returns ctx.Err() (ErrClosed). wd is nil for a request
// without an owner.
func (w *Warden) wait(ctx context.Context, n node, build func(waitMs int64) []any, wd *withdrawal, giveBack func(reply any)) (any, error) {
	c, err := n.pool.get(ctx)
	if err != nil {
		if lerr := late(ctx); lerr != nil {
			return nil, lerr // the dial was cut by the context
		}
		return nil, err
	}
	deadline, has := ctx.Deadline()
	waitMs, ok := waitArg(deadline, has)
	if !ok {
		n.pool.put(c)
		return nil, late(ctx)
	}
	if err := c.send(build(waitMs)...); err != nil {
		n.pool.discard(c)
		giveBack(nil)
		return nil, err
	}
	// The server answers by WAIT; ReadTimeout bounds how much later the
	// reply may come. Past that the connection is dropped and the call
	// fails: a wait is never sent twice.
	if rt := n.pool.opt.ReadTimeout; waitMs > 0 && rt > 0 {
		_ = c.nc.SetReadDeadline(time.Now().Add(time.Duration(waitMs)*time.Millisecond + rt))
	} else {
		_ = c.nc.SetReadDeadline(time.Time{})
	}
	ch := make(chan result, 1)
	go func() {
		r, err := c.read()
		ch <- result{r, err}
	}()
	select {
	case r := <-ch:
		_ = c.nc.SetReadDeadline(time.Time{})
		if r.err != nil {
			w.kill(n, c)
			giveBack(nil)
			return nil, fmt.Errorf("warden: waiting (WAIT %d ms): %w", waitMs, r.err)
		}
		if e, ok := r.reply.(serverError); ok && strings.HasPrefix(string(e), "READONLY") {
			n.pool.flush() // a failover: the idle connections reach a replica now
			n.pool.discard(c)
			return r.reply, nil
		}
		n.pool.put(c)
		return r.reply, nil
	case <-ctx.Done():
	case <-w.done:
		w.cancelWait(n, c, ch, wd, giveBack)
		return nil, ErrClosed
	}
	w.cancelWait(n, c, ch, wd, giveBack)
	return nil, ctx.Err()
}

// cancelWait takes an abandoned waiter out: WARDEN.WITHDRAW for a request
// with an owner (wd) on every server that accepts it, else CLIENT UNBLOCK
// where the server supports it for module waiters (either way the
// connection is kept once its nil reply is read), else CLIENT KILL and a
// give-back by owner.
func (w *Warden) cancelWait(n node, c *conn, ch chan result, wd *withdrawal, giveBack func(reply any)) {
	if wd != nil && w.withdraw(n, c, ch, wd, giveBack) {
		return
	}
	bg, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if n.pool.canUnblock() {
		// UNBLOCK 1: the waiter is answered nil (or a grant decided in the
		// same turn): read it. 0: its reply is on its way, or the command
		// has not reached the server yet (a cancel right after the send):
		// ask again shortly rather than wait for a reply that is not coming.
		end := time.Now().Add(time.Second)
		pause := time.Millisecond
		for {
			unblocked, err := n.client.Do(bg, "CLIENT", "UNBLOCK", c.id).Int64()
			if err != nil {
				break
			}
			wait := pause
			if unblocked == 1 {
				wait = time.Until(end)
			}
			t := time.NewTimer(max(wait, 0))
			select {
			case r := <-ch:
				t.Stop()
				_ = c.nc.SetReadDeadline(time.Time{})
				if r.err != nil {
					w.kill(n, c)
					giveBack(nil)
					return
				}
				n.pool.put(c)
				if _, granted := grantOf(r.reply); granted {
					giveBack(r.reply)
				}
				return
			case <-t.C:
			}
			if unblocked == 1 || time.Now().After(end) {
				break
			}
			pause = min(2*pause, 50*time.Millisecond)
		}
	}
	giveBack(w.killReading(n, c, ch).reply)
}

// withdraw takes the waiter on c out of the server's queue with
// WARDEN.WITHDRAW key owner, sent on the node's ordinary client: true once
// it did and c's reply is dealt with (read and the connection kept, or
// killed if it does not come). False, with c untouched, when the server
// found nothing queued (a grant on its way, or the request not arrived
// yet) or refused the command (a module before 1.1.0, an ACL: the pool
// remembers that and sends it no more): the caller falls back to CLIENT
// UNBLOCK or CLIENT KILL.
func (w *Warden) withdraw(n node, c *conn, ch chan result, wd *withdrawal, giveBack func(reply any)) bool {
	if !n.pool.canWithdraw() {
		return false
	}
	bg, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	taken, err := n.client.Do(bg, "WARDEN.WITHDRAW", wd.key, wd.owner).Int64()
	if err != nil {
		var rerr redis.Error
		if errors.As(err, &rerr) && refusesCommand(err) {
			n.pool.refuseWithdraw()
		}
		return false
	}
	if taken < 1 {
		return false
	}
	// The server has answered the waiter nil on c: read it (bounded, as
	// after an UNBLOCK), then c owes nothing and goes back to the pool.
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case r := <-ch:
		_ = c.nc.SetReadDeadline(time.Time{})
		if r.err != nil {
			w.kill(n, c)
			giveBack(nil)
			return true
		}
		n.pool.put(c)
		if _, granted := grantOf(r.reply); granted {
			giveBack(r.reply) // not expected after a withdrawal: never kept
		}
	case <-t.C:
		giveBack(w.killReading(n, c, ch).reply)
	}
	return true
}

// redirect tells whether a server's error is a cluster redirect (MOVED,
// ASK): the node does not serve the key's slot, which says nothing of
// whether it accepts a command.
func redirect(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "ASK ")
}

// refusesCommand tells whether a server's error refuses the command itself
// there: an ACL (NOPERM), or a server without it (a module before 1.1.0, a
// renamed command). A passing state (BUSY, LOADING, a redirect) is not: the
// command is sent again next time.
func refusesCommand(err error) bool {
	msg := err.Error()
	return !redirect(err) && (strings.HasPrefix(msg, "NOPERM") ||
		strings.Contains(strings.ToLower(msg), "unknown command"))
}

// killReading ends a waiter connection whose reply is still unread (ch):
// CLIENT KILL, then the reply the server wrote before the kill, read up to
// the server's close, then the local close. Closing first would drop a grant
// already on its way (tokens a rate limiter took and nobody gives back).
func (w *Warden) killReading(n node, c *conn, ch chan result) result {
	bg, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.client.Do(bg, "CLIENT", "KILL", "ID", c.id).Err(); err == nil {
		// The server has closed it: the read ends at once with the reply
		// or EOF. A second bounds it should the close be slow to arrive.
		_ = c.nc.SetReadDeadline(time.Now().Add(time.Second))
	} else {
		c.close()
	}
	r := <-ch
	n.pool.discard(c)
	return r
}

// kill ends a waiter connection on the server before closing it here: once
// CLIENT KILL has answered, the server has dropped the waiter, so a
// give-back sent after it cannot be overtaken by a late grant.
func (w *Warden) kill(n node, c *conn) {
	bg, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = n.client.Do(bg, "CLIENT", "KILL", "ID", c.id).Err()
	n.pool.discard(c)
}

// grantOf tells whether a reply granted something: a fence, a cache lease
// token, or a rate limiter's tokens (RATE.ACQUIRE's five integers, limited 0).
func grantOf(reply any) (any, bool) {
	switch r := reply.(type) {
	case int64:
		return r, true
	case []any:
		if len(r) == 2 && r[1] != nil {
			return r[1], true
		}
		if len(r) == 5 && r[0] == int64(0) {
			return r, true
		}
	}
	return nil, false
}
