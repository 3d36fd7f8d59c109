package warden

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// NearCache keeps values read through Load in this process's memory and
// serves a hit with no round trip; the server's CLIENT TRACKING tells it
// when to drop one. Pass it to Load with WithNear. It is safe for
// concurrent use; Close releases its connection and goroutine.
//
// It has one connection of its own (RESP3, CLIENT TRACKING on, read by a
// goroutine at all times): a read it does not hold is sent there as
// CACHE.PEEK, so replies and the server's invalidations arrive in one
// ordered stream. Only fresh values are kept (a miss or a stale value goes
// through CACHE.GET … WAIT as without a near cache), each until its expiry
// by this process's clock, an invalidation, or a flush. Everything is
// dropped when the connection drops, fails or reconnects, and on
// FLUSHALL/FLUSHDB; while it is down, reads go to the server.
//
// A hit is served only when that goroutine has acted on every byte the
// server has delivered to the connection (none waiting in the kernel, none
// read and not applied): an invalidation that has arrived is never behind a
// hit. This holds on a TCP connection on Linux; over a Unix socket, TLS or
// elsewhere a hit does not wait for it.
type NearCache struct {
	w          *Warden
	opt        *redis.Options
	maxEntries int
	maxBytes   int64
	failover   bool

	mu       sync.Mutex
	items    map[string]*list.Element // of *nearEntry, most recently used first
	lru      list.List
	bytes    int64
	flushGen uint64             // moved on by every flush
	inflight map[string]*flight // CACHE.PEEKs sent and not answered, per key
	link     *nearLink          // nil while down
	up       chan struct{}      // closed while a link is up
	closed   bool

	hits, misses, invalidations, flushes atomic.Uint64

	live atomic.Pointer[nearLink] // link, read by hits without mu

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// beforeApply, when set, sees each frame the reader has read, before
	// the reader acts on it.
	beforeApply func(any)
}

type nearEntry struct {
	key       string
	raw       string
	expiresAt int64 // Unix ms, -1 none
	decoded   any   // the last Load's decoding of raw, shared by hits
}

// flight counts a key's CACHE.PEEKs under way; gen moves on when the key is
// invalidated, so a reply sent before the invalidation is not kept.
type flight struct {
	n   int
	gen uint64
}

// NearStats are a near cache's counters since it was made.
type NearStats struct {
	Hits          uint64 // reads served from memory
	Misses        uint64 // reads that went to the server
	Invalidations uint64 // keys the server (or Invalidate) invalidated
	Flushes       uint64 // times everything was dropped
}

// NearOption configures NewNearCache.
type NearOption func(*NearCache)

// NearMaxEntries bounds how many values are kept (default 10,000); the
// least recently used go first.
func NearMaxEntries(n int) NearOption {
	return func(nc *NearCache) {
		if n > 0 {
			nc.maxEntries = n
		}
	}
}

// NearMaxBytes bounds the bytes of values kept (default 64 MiB); the least
// recently used go first, and a larger value is not kept.
func NearMaxBytes(n int64) NearOption {
	return func(nc *NearCache) {
		if n > 0 {
			nc.maxBytes = n
		}
	}
}

// WithNear makes Load serve hits from nc, and keep what it reads there.
func WithNear(nc *NearCache) CacheOption {
	return func(o cacheOptions) cacheOptions { o.near = nc; return o }
}

// errNearDown: the tracking connection is down; the read goes to the server.
var errNearDown = errors.New("warden: near cache connection down")

// NewNearCache starts a near cache on w's server: a *redis.Client, also one
// from redis.NewFailoverClient (its connection follows the master Sentinel
// names). A cluster client is not supported. It connects in the background
// (Sync waits for the connection); until then reads go to the server.
func NewNearCache(w *Warden, opts ...NearOption) (*NearCache, error) {
	client, ok := w.rdb.(*redis.Client)
	if !ok {
		return nil, fmt.Errorf("warden: a near cache needs a *redis.Client, not %T", w.rdb)
	}
	nc := &NearCache{
		w:   w,
		opt: client.Options(),
		// go-redis names a failover client's address so; its Dialer asks
		// Sentinel for the master.
		failover:   client.Options().Addr == "FailoverClient",
		maxEntries: 10_000,
		maxBytes:   64 << 20,
		items:      map[string]*list.Element{},
		inflight:   map[string]*flight{},
		up:         make(chan struct{}),
	}
	for _, o := range opts {
		o(nc)
	}
	nc.ctx, nc.cancel = context.WithCancel(context.Background())
	nc.wg.Add(1)
	go nc.run()
	if nc.failover {
		nc.wg.Add(1)
		go nc.watch()
	}
	return nc, nil
}

// Stats returns the counters.
func (nc *NearCache) Stats() NearStats {
	return NearStats{
		Hits:          nc.hits.Load(),
		Misses:        nc.misses.Load(),
		Invalidations: nc.invalidations.Load(),
		Flushes:       nc.flushes.Load(),
	}
}

// Len is how many values are kept.
func (nc *NearCache) Len() int {
	nc.mu.Lock()
	defer nc.mu.Unlock()
	return len(nc.items)
}

// Sync makes one round trip (PING) on the tracking connection, waiting
// for it to connect within ctx. When it returns nil, every invalidation
// the server queued before it has been applied: after a write is
// acknowledged to its writer, a read that starts after Sync never returns
// the older value. On a failover client it first dials once (its dialer
// asks Sentinel for the master) to check that the connection still reaches
// the master, and reconnects if not.
func (nc *NearCache) Sync(ctx context.Context) error {
	for {
		nc.mu.Lock()
		up, closed := nc.up, nc.closed
		nc.mu.Unlock()
		if closed {
			return ErrClosed
		}
		select {
		case <-up:
		case <-ctx.Done():
			return ctx.Err()
		case <-nc.ctx.Done():
			return ErrClosed
		}
		if err := nc.checkMaster(ctx); err != nil {
			return err
		}
		r, err := nc.call(ctx, &nearCall{}, "PING")
		if errors.Is(err, errNearDown) {
			continue // dropped (and flushed) meanwhile: ask the next connection
		}
		if err != nil {
			return err
		}
		if e, ok := r.(serverError); ok {
			return e
		}
		return nil
	}
}

// Invalidate deletes key's cached value on the server (CACHE.INVALIDATE,
// which revokes a fill lease too) and drops it from this near cache at
// once, so this process reads its own write.
func (nc *NearCache) Invalidate(ctx context.Context, key string) error {
	if err := nc.w.rdb.Do(ctx, "CACHE.INVALIDATE", key).Err(); err != nil {
		return serverErr(err)
	}
	nc.mu.Lock()
	nc.invalidate(key)
	nc.mu.Unlock()
	return nil
}

// Close drops every value and closes the connection; it waits for the
// background goroutine to end. Loads with WithNear(nc) go to the server.
func (nc *NearCache) Close() error {
	nc.mu.Lock()
	if nc.closed {
		nc.mu.Unlock()
		return nil
	}
	nc.closed = true
	l := nc.link
	nc.mu.Unlock()
	nc.cancel()
	if l != nil {
		l.close()
	}
	nc.wg.Wait()
	nc.mu.Lock()
	nc.flush()
	nc.mu.Unlock()
	return nil
}

// nearHit serves key from memory: ok false when it is not held (or its
// value does not decode as T; the server path then says why), or when the
// server has delivered bytes the reader has not acted on yet.
func nearHit[T any](nc *NearCache, c cacheCall[T]) (T, bool) {
	var zero T
	// No hit while a delivered invalidation is unapplied: checked before
	// the lookup, so an invalidation applied meanwhile is seen by it.
	if l := nc.live.Load(); l != nil && !l.settled() {
		return zero, false
	}
	nc.mu.Lock()
	el := nc.items[c.key]
	if el == nil {
		nc.mu.Unlock()
		return zero, false
	}
	e := el.Value.(*nearEntry)
	if e.expiresAt >= 0 && time.Now().UnixMilli() >= e.expiresAt {
		nc.remove(el)
		nc.mu.Unlock()
		return zero, false
	}
	nc.lru.MoveToFront(el)
	if v, ok := e.decoded.(T); ok {
		nc.mu.Unlock()
		nc.hits.Add(1)
		return v, true
	}
	raw := e.raw
	nc.mu.Unlock()
	v, err := c.decode(raw)
	if err != nil {
		return zero, false
	}
	nc.mu.Lock()
	if nc.items[c.key] == el {
		e.decoded = v
	}
	nc.mu.Unlock()
	nc.hits.Add(1)
	return v, true
}

// peek sends CACHE.PEEK key on the tracking connection and returns the value
// when the server holds a fresh one (the reader kept it, unless an
// invalidation or flush came first); ok false sends the read to CACHE.GET.
func (nc *NearCache) peek(ctx context.Context, key string) (string, bool) {
	r, err := nc.call(ctx, &nearCall{key: key}, "CACHE.PEEK", key)
	if err != nil {
		return "", false
	}
	raw, _, fresh := peekReply(r)
	return raw, fresh
}

// peekReply reads [value, expires_at, stale]: fresh is false for nil, a
// stale value, an error or a reply of another shape.
func peekReply(r any) (raw string, expiresAt int64, fresh bool) {
	a, ok := r.([]any)
	if !ok || len(a) != 3 {
		return "", 0, false
	}
	raw, ok1 := a[0].(string)
	expiresAt, ok2 := a[1].(int64)
	stale, ok3 := a[2].(int64)
	return raw, expiresAt, ok1 && ok2 && ok3 && stale == 0
}

type nearCall struct {
	key        string // the key a CACHE.PEEK reads; "" for PING
	gen        uint64 // the key's flight generation when sent
	flushGen   uint64
	registered bool
	reply      chan nearReply
}

type nearReply struct {
	v   any
	err error
}

// nearLink is one tracking connection. Replies come back in the order the
// commands were written, so the queue of calls owed a reply is appended to
// in the same critical section as the write.
type nearLink struct {
	c     *conn
	un    *unread    // nil: not a TCP connection on Linux, no check
	wmu   sync.Mutex // one writer at a time, queue order = write order
	qmu   sync.Mutex
	queue []*nearCall
	dead  bool // under qmu: dropped, no more calls
}

// settled tells whether the reader has acted on every byte the server has
// delivered on the connection: each push it sent before is applied. With
// no check (not a TCP connection on Linux: a Unix socket, TLS) it says
// yes, and a push read or waiting unread does not stop a hit.
func (l *nearLink) settled() bool {
	return l.un == nil || l.un.settled()
}

// acted: the reader has acted on a frame; with none left buffered, it
// holds nothing.
func (l *nearLink) acted() {
	if l.un != nil && l.c.br.Buffered() == 0 {
		l.un.acted()
	}
}

func (l *nearLink) close() {
	if l.un != nil {
		l.un.shut()
	}
	l.c.close()
}

// call sends one command on the tracking connection and waits for its reply.
func (nc *NearCache) call(ctx context.Context, call *nearCall, args ...any) (any, error) {
	call.reply = make(chan nearReply, 1)
	nc.mu.Lock()
	l := nc.link
	if l == nil {
		nc.mu.Unlock()
		return nil, errNearDown
	}
	// The generation is noted before the command is sent.
	call.flushGen = nc.flushGen
	if call.key != "" {
		f := nc.inflight[call.key]
		if f == nil {
			f = &flight{}
			nc.inflight[call.key] = f
		}
		f.n++
		call.gen = f.gen
		call.registered = true
	}
	nc.mu.Unlock()
	l.wmu.Lock()
	l.qmu.Lock()
	if l.dead {
		l.qmu.Unlock()
		l.wmu.Unlock()
		nc.settle(call, nil, errNearDown)
		return nil, errNearDown
	}
	l.queue = append(l.queue, call)
	l.qmu.Unlock()
	err := l.c.send(args...)
	l.wmu.Unlock()
	if err != nil {
		// The reader fails on the closed connection and answers the queue.
		l.close()
	}
	select {
	case r := <-call.reply:
		return r.v, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// settle answers a call; a fresh CACHE.PEEK value is kept if its
// generation has not moved since it was sent.
func (nc *NearCache) settle(call *nearCall, r any, err error) {
	if call.registered {
		nc.mu.Lock()
		f := nc.inflight[call.key]
		if err == nil && f.gen == call.gen && nc.flushGen == call.flushGen && !nc.closed {
			if raw, expiresAt, fresh := peekReply(r); fresh {
				nc.keep(call.key, raw, expiresAt)
			}
		}
		if f.n--; f.n == 0 {
			delete(nc.inflight, call.key)
		}
		nc.mu.Unlock()
	}
	call.reply <- nearReply{r, err}
}

// run keeps a tracking connection up until Close, reconnecting with a
// backoff; each drop flushes.
func (nc *NearCache) run() {
	defer nc.wg.Done()
	backoff := 20 * time.Millisecond
	for nc.ctx.Err() == nil {
		l, err := nc.connect()
		if err != nil {
			select {
			case <-time.After(backoff):
			case <-nc.ctx.Done():
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 20 * time.Millisecond
		nc.serve(l)
		nc.drop(l)
	}
}

func (nc *NearCache) connect() (*nearLink, error) {
	ctx, cancel := context.WithTimeout(nc.ctx, 5*time.Second)
	defer cancel()
	c, err := dial(ctx, nc.opt)
	if err != nil {
		return nil, err
	}
	_ = c.nc.SetDeadline(time.Now().Add(5 * time.Second))
	c.write("HELLO", "3")
	c.write("CLIENT", "TRACKING", "on")
	err = c.bw.Flush()
	for range 2 {
		if err != nil {
			break
		}
		var r any
		if r, err = c.read(); err == nil {
			if e, ok := r.(serverError); ok {
				err = e
			}
		}
	}
	_ = c.nc.SetDeadline(time.Time{})
	if err != nil {
		c.close()
		return nil, err
	}
	l := &nearLink{c: c, un: newUnread(c)}
	nc.mu.Lock()
	defer nc.mu.Unlock()
	if nc.closed {
		l.close()
		return nil, ErrClosed
	}
	// A new connection: whatever was kept before it may have been written
	// while no connection tracked it.
	nc.flush()
	nc.link = l
	nc.live.Store(l)
	close(nc.up)
	return l, nil
}

// serve reads the connection until it fails: pushes are applied, replies
// answer the calls in order. Bytes it has read count as unapplied until
// it has acted on every frame they hold (hits wait for that, see settled).
func (nc *NearCache) serve(l *nearLink) {
	for {
		r, err := l.c.read()
		if err != nil {
			return
		}
		if nc.beforeApply != nil {
			nc.beforeApply(r)
		}
		if p, ok := r.(push); ok {
			nc.apply(p)
			l.acted()
			continue
		}
		l.qmu.Lock()
		if len(l.queue) == 0 {
			l.qmu.Unlock()
			nc.w.log.Warn("warden: near cache got a reply it did not ask for; reconnecting", "reply", r)
			return
		}
		call := l.queue[0]
		l.queue[0] = nil
		l.queue = l.queue[1:]
		l.qmu.Unlock()
		// A reply is no invalidation: acted on before the caller wakes, so
		// a hit right after sync() is not refused for the sync's own reply
		// (pushes still buffered behind it keep the reader's hold).
		l.acted()
		nc.settle(call, r, nil)
	}
}

// apply acts on a push: ["invalidate", [key, …]] drops the keys,
// ["invalidate", nil] (FLUSHALL, FLUSHDB) drops everything.
func (nc *NearCache) apply(p push) {
	if len(p) != 2 {
		return
	}
	if kind, _ := p[0].(string); kind != "invalidate" {
		return
	}
	nc.mu.Lock()
	defer nc.mu.Unlock()
	keys, ok := p[1].([]any)
	if !ok {
		nc.flush()
		return
	}
	for _, k := range keys {
		if key, ok := k.(string); ok {
			nc.invalidate(key)
		}
	}
}

// drop ends a link (once): everything kept goes, the calls owed a reply fail.
func (nc *NearCache) drop(l *nearLink) {
	l.close()
	l.qmu.Lock()
	if l.dead {
		l.qmu.Unlock()
		return
	}
	l.dead = true
	queue := l.queue
	l.queue = nil
	l.qmu.Unlock()
	nc.mu.Lock()
	if nc.link == l {
		nc.link = nil
		nc.live.Store(nil)
		nc.up = make(chan struct{})
	}
	nc.flush()
	nc.mu.Unlock()
	for _, call := range queue {
		nc.settle(call, nil, errNearDown)
	}
}

// checkMaster drops the link when a failover client's dialer (the master
// Sentinel names now) reaches another server than the link does.
// A failed-over master keeps its connections until Sentinel reconfigures it,
// and writers have moved on: its invalidations would never come.
func (nc *NearCache) checkMaster(ctx context.Context) error {
	if !nc.failover {
		return nil
	}
	nc.mu.Lock()
	l := nc.link
	nc.mu.Unlock()
	if l == nil {
		return nil
	}
	network := nc.opt.Network
	if network == "" {
		network = "tcp"
	}
	c, err := nc.opt.Dialer(ctx, network, nc.opt.Addr)
	if err != nil {
		return err
	}
	now := c.RemoteAddr().String()
	_ = c.Close()
	if now != l.c.nc.RemoteAddr().String() {
		nc.drop(l)
	}
	return nil
}

// watch checks every second that the link reaches the current master.
func (nc *NearCache) watch() {
	defer nc.wg.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			ctx, cancel := context.WithTimeout(nc.ctx, 5*time.Second)
			_ = nc.checkMaster(ctx)
			cancel()
		case <-nc.ctx.Done():
			return
		}
	}
}

// The methods below run under nc.mu.

func (nc *NearCache) keep(key, raw string, expiresAt int64) {
	if el := nc.items[key]; el != nil {
		nc.remove(el)
	}
	if int64(len(raw)) > nc.maxBytes || (expiresAt >= 0 && time.Now().UnixMilli() >= expiresAt) {
		return
	}
	nc.items[key] = nc.lru.PushFront(&nearEntry{key: key, raw: raw, expiresAt: expiresAt})
	nc.bytes += int64(len(raw))
	for len(nc.items) > nc.maxEntries || nc.bytes > nc.maxBytes {
		nc.remove(nc.lru.Back())
	}
}

func (nc *NearCache) remove(el *list.Element) {
	e := nc.lru.Remove(el).(*nearEntry)
	delete(nc.items, e.key)
	nc.bytes -= int64(len(e.raw))
}

func (nc *NearCache) invalidate(key string) {
	nc.invalidations.Add(1)
	if f := nc.inflight[key]; f != nil {
		f.gen++
	}
	if el := nc.items[key]; el != nil {
		nc.remove(el)
	}
}

func (nc *NearCache) flush() {
	nc.flushGen++
	nc.flushes.Add(1)
	clear(nc.items)
	nc.lru.Init()
	nc.bytes = 0
}
