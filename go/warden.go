// Package warden is the Go client of warden, a Redis module with server-side
// locks, read-write locks, semaphores, rate limiters and cache leases. It
// works on a go-redis v9 client: standalone (*redis.Client), Sentinel
// (redis.NewFailoverClient) or Cluster (*redis.ClusterClient).
//
// Every call that may wait takes a context: its deadline becomes the
// server's WAIT, and cancelling it takes the waiter out of the server's
// queue. A grant that races a cancel is given back at once. The context
// bounds the wait only: a hold outlives it, until Release or its loss
// (Hold.Context).
//
// A hold without TTL is renewed by a watchdog until Release; a lease above
// the server's warden.max-lease is capped and renewed (see TTL).
package warden

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	// ErrNotAcquired: the lock or permits were busy (TryLock, TryAcquire),
	// or the server shed the request (MaxQueue).
	ErrNotAcquired = errors.New("warden: not acquired")
	// ErrNotHeld: the hold was lost (its lease ended, or it was taken away)
	// before Extend or Release.
	ErrNotHeld = errors.New("warden: not held")
	// ErrNotLoaded wraps the server's unknown-command error for warden's commands.
	ErrNotLoaded = errors.New("warden: unknown command (is warden loaded?)")
	// ErrInvalid: an argument out of range (TTL(d) or Extend with d <= 0,
	// permits outside 1..limit); nothing was sent to the server.
	ErrInvalid = errors.New("warden: invalid argument")
)

// DefaultTTL is the lease of a hold acquired without TTL(d); a watchdog
// renews it every DefaultTTL/3 until the hold is released. Under a server's
// warden.max-lease below it, the lease is the cap.
const DefaultTTL = 30 * time.Second

// Warden is a client of warden's commands on top of a go-redis client. It is
// safe for concurrent use.
type Warden struct {
	rdb         redis.UniversalClient
	waiters     int
	log         *slog.Logger
	watchdogTTL time.Duration
	prefix      string
	seq         atomic.Uint64
	// leaseCap is the server's warden.max-lease in ms, learned from its
	// refusal of a longer lease; 0 until then.
	leaseCap atomic.Int64

	mu     sync.Mutex
	pools  map[string]*pool
	holds  map[*Hold]struct{}
	closed bool
	// waiters of this Warden per server queue, for skipping a fast try
	// that the server would refuse (see waitingOn).
	queued map[queueKey]int
	done   chan struct{}  // closed by Close: calls under way stop waiting
	calls  sync.WaitGroup // calls under way (Add only under mu while open)
	bg     sync.WaitGroup // give-backs and refreshes that outlive a call
}

// Option configures New.
type Option func(*Warden)

// WithWaiters bounds the waiter connections warden opens per node (default
// 64). A waiting call that finds none free waits for one within its context.
func WithWaiters(n int) Option {
	return func(w *Warden) {
		if n > 0 {
			w.waiters = n
		}
	}
}

// WithLogger sets where warden logs what it cannot return (a watchdog's
// renewal errors, a give-back that failed).
func WithLogger(l *slog.Logger) Option {
	return func(w *Warden) {
		if l != nil {
			w.log = l
		}
	}
}

// WithWatchdogTTL sets the lease of holds acquired without TTL(d) (default
// DefaultTTL; the server's warden.max-lease if lower); the watchdog renews
// it at a third of it.
func WithWatchdogTTL(d time.Duration) Option {
	return func(w *Warden) {
		if d >= 3*time.Millisecond {
			w.watchdogTTL = d
		}
	}
}

// New returns a client on rdb: a *redis.Client (also one from
// redis.NewFailoverClient) or a *redis.ClusterClient. rdb stays the
// caller's: Close does not close it.
func New(rdb redis.UniversalClient, opts ...Option) *Warden {
	var token [12]byte
	_, _ = rand.Read(token[:])
	w := &Warden{
		rdb:         rdb,
		waiters:     64,
		log:         slog.Default(),
		watchdogTTL: DefaultTTL,
		prefix:      hex.EncodeToString(token[:]) + ":",
		pools:       map[string]*pool{},
		queued:      map[queueKey]int{},
		done:        make(chan struct{}),
	}
	for _, o := range opts {
		o(w)
	}
	return w
}

// Close ends the calls still waiting (they leave the server's queue, give
// back what raced, and return ErrClosed), then closes warden's own waiter
// connections (not rdb). Calls after Close return ErrClosed.
func (w *Warden) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	close(w.done)
	w.mu.Unlock()
	w.calls.Wait()
	w.mu.Lock()
	pools := w.pools
	holds := make([]*Hold, 0, len(w.holds))
	for h := range w.holds {
		holds = append(holds, h)
	}
	w.mu.Unlock()
	// Holds still held stop renewing; their leases run out on the server.
	for _, h := range holds {
		h.abandon()
	}
	w.bg.Wait()
	for _, p := range pools {
		p.close()
	}
	return nil
}

// begin counts a call under way; ErrClosed once Close has begun. The
// caller defers w.calls.Done().
func (w *Warden) begin() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	w.calls.Add(1)
	return nil
}

// closing tells whether Close has begun.
func (w *Warden) closing() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// queueKey names one of the server's wait queues: a kind's queue on a key.
type queueKey struct{ kind, key string }

// waiting counts a call of this Warden as waiting in q until the returned
// func is called. Entries go at zero: the map holds only keys waited on now.
func (w *Warden) waiting(q queueKey) func() {
	w.mu.Lock()
	w.queued[q]++
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		if w.queued[q]--; w.queued[q] <= 0 {
			delete(w.queued, q)
		}
		w.mu.Unlock()
	}
}

// waitingOn is how many calls of this Warden wait in q. It is a hint: a
// waiter counted a moment before its command reaches the server only costs
// the next call its fast try (a wait on a free key is granted at once).
func (w *Warden) waitingOn(q queueKey) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.queued[q]
}

// owner is a fresh owner token per hold: no two holds share one, so a
// release reply of 0 ("re-entrant holds remain") can only come from a
// go-redis retry that acquired twice.
func (w *Warden) owner() string {
	return w.prefix + fmt.Sprint(w.seq.Add(1))
}

// node is where a key lives: the go-redis client that reaches its master
// (for fast commands, WARDEN.WITHDRAW and CLIENT UNBLOCK) and the waiter
// pool for it.
type node struct {
	client *redis.Client
	pool   *pool
}

func (w *Warden) node(ctx context.Context, key string) (node, error) {
	var client *redis.Client
	switch c := w.rdb.(type) {
	case *redis.Client:
		client = c
	case *redis.ClusterClient:
		m, err := c.MasterForKey(ctx, key)
		if err != nil {
			return node{}, err
		}
		client = m
	default:
		return node{}, fmt.Errorf("warden: %T is not supported (use *redis.Client or *redis.ClusterClient)", w.rdb)
	}
	return w.nodeFor(client)
}

// nodeAt is the cluster master at addr, as a MOVED reply names it. The
// slot map is reloaded on the way (ForEachMaster does), so MasterForKey
// finds the new master next time.
func (w *Warden) nodeAt(ctx context.Context, addr string) (node, error) {
	c, ok := w.rdb.(*redis.ClusterClient)
	if !ok {
		return node{}, fmt.Errorf("warden: MOVED to %s outside a cluster client", addr)
	}
	var mu sync.Mutex
	var found *redis.Client
	_ = c.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
		if m.Options().Addr == addr {
			mu.Lock()
			found = m
			mu.Unlock()
		}
		return nil
	})
	if found == nil {
		return node{}, fmt.Errorf("warden: MOVED to %s, which the cluster client does not know", addr)
	}
	return w.nodeFor(found)
}

func (w *Warden) nodeFor(client *redis.Client) (node, error) {
	opt := client.Options()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return node{}, errClosed
	}
	p := w.pools[opt.Addr]
	if p == nil {
		p = newPool(opt, w.waiters, w.done)
		w.pools[opt.Addr] = p
	}
	return node{client: client, pool: p}, nil
}

// capped is the lease to ask the server for: d, or the cap when d is above it.
func (w *Warden) capped(d time.Duration) time.Duration {
	if c := w.leaseCap.Load(); c > 0 && d > time.Duration(c)*time.Millisecond {
		return time.Duration(c) * time.Millisecond
	}
	return d
}

// learnCap records the cap a server's refusal named (the latest wins: a
// cap lowered at runtime is learned at the next refusal).
func (w *Warden) learnCap(c time.Duration) { w.leaseCap.Store(c.Milliseconds()) }

// leaseCapOf reads warden.max-lease from the server's refusal of a longer
// lease: "ERR ttl exceeds warden.max-lease: expected an integer from 1 to N (ms)".
func leaseCapOf(err error) (time.Duration, bool) {
	if err == nil {
		return 0, false
	}
	_, rest, ok := strings.Cut(err.Error(), "ttl exceeds warden.max-lease: expected an integer from 1 to ")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSuffix(rest, " (ms)"), 10, 64)
	if err != nil || n < 1 {
		return 0, false
	}
	return time.Duration(n) * time.Millisecond, true
}

// serverErr turns an unknown-command reply for a warden command into
// ErrNotLoaded; other errors keep the server's text.
func serverErr(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if strings.HasPrefix(msg, "ERR unknown command") {
		for _, prefix := range []string{"'lock.", "'rwlock.", "'sem.", "'rate.", "'cache."} {
			if strings.Contains(strings.ToLower(msg), prefix) {
				return fmt.Errorf("%w: %w", ErrNotLoaded, err)
			}
		}
	}
	return err
}

// pool is the bounded set of waiter connections to one node.
type pool struct {
	opt   *redis.Options
	slots chan struct{}
	done  <-chan struct{} // the Warden's: closed by Close

	mu      sync.Mutex
	idle    []*conn
	unblock int32 // 0 unknown, 1 CLIENT UNBLOCK works, -1 it does not (Redis < 7.4)
	// noWithdraw: the node refused WARDEN.WITHDRAW (a module before 1.1.0,
	// an ACL); cancels go straight to CLIENT UNBLOCK or CLIENT KILL.
	noWithdraw bool
}

func newPool(opt *redis.Options, n int, done <-chan struct{}) *pool {
	return &pool{opt: opt, slots: make(chan struct{}, n), done: done}
}

// get takes a slot (within ctx: never a queue past the caller's deadline),
// then an idle connection or a new one.
func (p *pool) get(ctx context.Context) (*conn, error) {
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.done:
		return nil, ErrClosed
	}
	for {
		p.mu.Lock()
		n := len(p.idle)
		if n == 0 {
			break
		}
		c := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		// An idle connection the server closed (restart, CLIENT KILL,
		// timeout) would fail the wait sent on it: drop it, dial anew.
		if c.alive() {
			return c, nil
		}
		c.close()
	}
	known := p.unblock != 0
	p.mu.Unlock()
	c, err := dial(ctx, p.opt)
	if err != nil {
		<-p.slots
		return nil, err
	}
	if !known {
		info, err := c.do(5*time.Second, "INFO", "server")
		if s, ok := info.(string); ok && err == nil {
			p.mu.Lock()
			p.unblock = -1
			if unblockSupported(s) {
				p.unblock = 1
			}
			p.mu.Unlock()
		}
	}
	return c, nil
}

func (p *pool) canUnblock() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.unblock == 1
}

// canWithdraw: the node has not refused WARDEN.WITHDRAW.
func (p *pool) canWithdraw() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.noWithdraw
}

// refuseWithdraw records that the node refused WARDEN.WITHDRAW.
func (p *pool) refuseWithdraw() {
	p.mu.Lock()
	p.noWithdraw = true
	p.mu.Unlock()
}

// put returns a connection whose every reply was read.
func (p *pool) put(c *conn) {
	p.mu.Lock()
	p.idle = append(p.idle, c)
	p.mu.Unlock()
	<-p.slots
}

// discard closes a connection that may still owe a reply.
func (p *pool) discard(c *conn) {
	c.close()
	<-p.slots
}

// flush closes the idle connections (after a failover they reach the old master).
func (p *pool) flush() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		c.close()
	}
}

func (p *pool) close() { p.flush() }
