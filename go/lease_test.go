package warden_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	warden "github.com/warden-redis/warden/go"
	"github.com/warden-redis/warden/go/internal/testserver"
)

// maxLease is warden.max-lease on setupCapped's server: short, so that
// renewals come every third of a second.
const maxLease = 1000 * time.Millisecond

// setupCapped is setup on a server started with warden.max-lease maxLease.
func setupCapped(t *testing.T, opts ...warden.Option) (*testserver.Server, *redis.Client, *warden.Warden) {
	t.Helper()
	srv := testserver.Start(t, "--warden.max-lease", strconv.Itoa(int(maxLease.Milliseconds())))
	rdb := srv.Client(t)
	w := warden.New(rdb, opts...)
	t.Cleanup(func() { _ = w.Close() })
	return srv, rdb, w
}

// pttl is the key's lease on the server (PTTL), failing the test when it has none.
func pttl(t *testing.T, rdb *redis.Client, key string) time.Duration {
	t.Helper()
	d, err := rdb.PTTL(context.Background(), key).Result()
	if err != nil || d <= 0 {
		t.Fatalf("PTTL %s: %v %v", key, d, err)
	}
	return d
}

// held fails the test unless h is held: its Context alive and the server
// naming its owner.
func held(t *testing.T, rdb *redis.Client, h *warden.Hold) {
	t.Helper()
	if err := h.Context().Err(); err != nil {
		t.Fatalf("hold on %s ended: %v", h.Key(), context.Cause(h.Context()))
	}
	if got := info(t, rdb, "LOCK.INFO", h.Key())["owner"]; got != h.Owner() {
		t.Fatalf("LOCK.INFO %s owner %v, want %s", h.Key(), got, h.Owner())
	}
}

// lapsed waits for h's Context to end and checks that it was lost, not
// released: the cause and Release say ErrNotHeld.
func lapsed(t *testing.T, h *warden.Hold) {
	t.Helper()
	select {
	case <-h.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("hold on %s never ended", h.Key())
	}
	if cause := context.Cause(h.Context()); !errors.Is(cause, warden.ErrNotHeld) {
		t.Fatalf("cause %v, want ErrNotHeld", cause)
	}
	if err := h.Release(context.Background()); !errors.Is(err, warden.ErrNotHeld) {
		t.Fatalf("Release of a lost hold: %v", err)
	}
}

// extends records the EXTENDs go-redis sends: when, and the ttl asked for.
type extends struct {
	mu   sync.Mutex
	sent []extendSent
}

type extendSent struct {
	at  time.Time
	ttl time.Duration
}

func (e *extends) DialHook(next redis.DialHook) redis.DialHook { return next }
func (e *extends) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (e *extends) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) == 4 && strings.HasSuffix(strings.ToUpper(fmt.Sprint(a[0])), ".EXTEND") {
			ms, _ := strconv.ParseInt(fmt.Sprint(a[3]), 10, 64)
			e.mu.Lock()
			e.sent = append(e.sent, extendSent{time.Now(), time.Duration(ms) * time.Millisecond})
			e.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (e *extends) all() []extendSent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]extendSent(nil), e.sent...)
}

// Without TTL the watchdog's lease is DefaultTTL, above the server's cap:
// the hold is taken at the cap (learned from the server's refusal, which
// later acquires skip) and renewed until Release.
func TestIntegrationWatchdogUnderMaxLease(t *testing.T) {
	_, rdb, w := setupCapped(t)
	ctx := context.Background()
	h, err := w.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if d := pttl(t, rdb, "k"); d > maxLease {
		t.Fatalf("lease %v above the cap", d)
	}
	before := calls(t, rdb, "lock.extend")
	waitFor(t, "three renewals", func() bool { return calls(t, rdb, "lock.extend") >= before+3 })
	held(t, rdb, h) // more than a lease after the grant
	acquires := calls(t, rdb, "lock.acquire")
	h2, err := w.Lock(ctx, "k2")
	if err != nil {
		t.Fatal(err)
	}
	if n := calls(t, rdb, "lock.acquire") - acquires; n != 1 {
		t.Fatalf("%d LOCK.ACQUIREs for a lock once the cap is known, want 1", n)
	}
	for _, x := range []*warden.Hold{h, h2} {
		if err := x.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A lease asked for above the cap is capped and renewed, for every kind:
// the server never holds more than the cap, the hold lasts the lease asked
// for, then lapses at its end (no renewal after it; the server's lease
// runs out with it).
func TestIntegrationLeaseAboveMaxLease(t *testing.T) {
	_, rdb, w := setupCapped(t)
	rec := &extends{}
	rdb.AddHook(rec)
	ctx := context.Background()
	const asked = 2500 * time.Millisecond
	kinds := map[string]func(key string) (*warden.Hold, error){
		"Lock":  func(key string) (*warden.Hold, error) { return w.Lock(ctx, key, warden.TTL(asked)) },
		"RLock": func(key string) (*warden.Hold, error) { return w.RLock(ctx, key, warden.TTL(asked)) },
		"WLock": func(key string) (*warden.Hold, error) { return w.WLock(ctx, key, warden.TTL(asked)) },
		"Semaphore": func(key string) (*warden.Hold, error) {
			p, err := w.Semaphore(key, 2).Acquire(ctx, 1, warden.TTL(asked))
			if err != nil {
				return nil, err
			}
			return p.Hold, nil
		},
	}
	type run struct {
		name  string
		start time.Time
		h     *warden.Hold
	}
	var runs []run
	for name, acquire := range kinds {
		start := time.Now()
		h, err := acquire(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if d := pttl(t, rdb, name); d > maxLease {
			t.Fatalf("%s: lease %v above the cap", name, d)
		}
		runs = append(runs, run{name, start, h})
	}
	for _, r := range runs {
		lapsed(t, r.h)
		if took := time.Since(r.start); took < asked {
			t.Fatalf("%s: lapsed after %v, before the %v asked for", r.name, took, asked)
		}
	}
	after := len(rec.all())
	waitFor(t, "the server's leases to run out", func() bool {
		n, err := rdb.Exists(ctx, "Lock", "RLock", "WLock", "Semaphore").Result()
		return err == nil && n == 0
	})
	sent := rec.all()
	if len(sent) != after {
		t.Fatalf("%d EXTENDs after the holds lapsed", len(sent)-after)
	}
	if len(sent) < 2*len(kinds) {
		t.Fatalf("%d EXTENDs for %d holds of %v under a cap of %v", len(sent), len(kinds), asked, maxLease)
	}
	for _, s := range sent {
		if s.ttl > maxLease {
			t.Fatalf("an EXTEND asked for %v, above the cap", s.ttl)
		}
	}
}

// Extend above the cap turns a short lease into a capped-and-renewed one
// that ends ttl after the Extend.
func TestIntegrationExtendAboveMaxLease(t *testing.T) {
	_, rdb, w := setupCapped(t)
	ctx := context.Background()
	h, err := w.Lock(ctx, "k", warden.TTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := h.Extend(ctx, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := pttl(t, rdb, "k"); d > maxLease {
		t.Fatalf("lease %v above the cap", d)
	}
	lapsed(t, h)
	if took := time.Since(start); took < 2*time.Second {
		t.Fatalf("lapsed %v after Extend(2s)", took)
	}
}

// The last renewal of a capped lease asks only for what remains of the
// lease asked for: the server's lease ends with it, not a cap later.
func TestIntegrationCappedLeaseEndsAtTheEndAskedFor(t *testing.T) {
	_, rdb, w := setupCapped(t)
	rec := &extends{}
	rdb.AddHook(rec)
	ctx := context.Background()
	const asked = 1800 * time.Millisecond
	before := time.Now()
	h, err := w.Lock(ctx, "k", warden.TTL(asked))
	if err != nil {
		t.Fatal(err)
	}
	end := time.Now().Add(asked) // the acquire was sent before now
	lapsed(t, h)
	sent := rec.all()
	if len(sent) == 0 {
		t.Fatal("no renewal")
	}
	last := sent[len(sent)-1]
	// The renewal's own clock reading came before the hook's: its lease,
	// counted from the hook, reaches at least the end asked for.
	if last.at.Add(last.ttl).Before(before.Add(asked)) {
		t.Fatalf("the last renewal's lease ends %v before the end asked for", before.Add(asked).Sub(last.at.Add(last.ttl)))
	}
	// A full cap as the last renewal would reach up to a cap past the end;
	// what remains, rounded up to the ms, reaches the end, rounded. (The
	// remainder is the cap itself only when the renewal came a cap before
	// the end.)
	if last.ttl == maxLease && last.at.Add(last.ttl).After(end.Add(50*time.Millisecond)) {
		t.Fatalf("the last renewal asked for the full cap %v past the end", last.at.Add(last.ttl).Sub(end))
	}
}

// A hold whose key is deleted, while capped and renewed: the next renewal
// finds it gone, ends the hold's Context (ErrNotHeld) and sends no more.
func TestIntegrationCappedHoldDeleted(t *testing.T) {
	_, rdb, w := setupCapped(t)
	ctx := context.Background()
	for _, opts := range [][]warden.LockOption{nil, {warden.TTL(time.Minute)}} {
		h, err := w.Lock(ctx, "k", opts...)
		if err != nil {
			t.Fatal(err)
		}
		rdb.Del(ctx, "k")
		lapsed(t, h)
		before := calls(t, rdb, "lock.extend")
		time.Sleep(maxLease / 2) // more than a renewal's interval
		if n := calls(t, rdb, "lock.extend") - before; n != 0 {
			t.Fatalf("%d EXTENDs after the hold was lost", n)
		}
	}
}

// go-redis's connections killed under a renewing hold: the renewal goes
// out on a new connection and the hold stays.
func TestIntegrationRenewalAfterConnectionsDropped(t *testing.T) {
	srv, _, w := setupCapped(t)
	admin := srv.Client(t)
	ctx := context.Background()
	h, err := w.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
			t.Fatal(err)
		}
		before := calls(t, admin, "lock.extend")
		waitFor(t, "a renewal", func() bool { return calls(t, admin, "lock.extend") > before })
	}
	held(t, admin, h)
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A server that answers nothing for longer than the lease: the hold's
// Context ends at the lease's end while the renewal still waits (go-redis's
// read timeout here is a minute), and the hold reads as lost (Context,
// Release), also once the server answers again.
func TestIntegrationRenewalServerUnreachable(t *testing.T) {
	srv := testserver.Start(t, "--warden.max-lease", strconv.Itoa(int(maxLease.Milliseconds())))
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	defer rdb.Close()
	w := warden.New(rdb)
	defer w.Close()
	ctx := context.Background()
	h, err := w.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	srv.Freeze()
	select {
	case <-h.Context().Done():
	case <-time.After(10 * time.Second):
		srv.Thaw()
		t.Fatal("a hold whose renewals failed past its lease is still held")
	}
	srv.Thaw()
	lapsed(t, h)
	h2, err := w.Lock(ctx, "k", warden.Wait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := h2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// The context given to Lock bounds the wait only: cancelled after the
// grant, the hold stays and the watchdog goes on renewing it.
func TestIntegrationLockContextBoundsOnlyTheWait(t *testing.T) {
	_, rdb, w := setupCapped(t)
	ctx, cancel := context.WithCancel(context.Background())
	h, err := w.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	before := calls(t, rdb, "lock.extend")
	waitFor(t, "two renewals", func() bool { return calls(t, rdb, "lock.extend") >= before+2 })
	held(t, rdb, h)
	if err := h.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// warden.max-lease lowered while holds renew: the next renewal is refused,
// names the new cap, and is sent again at it; the holds stay.
func TestIntegrationMaxLeaseLoweredUnderHold(t *testing.T) {
	_, rdb, w := setupCapped(t)
	ctx := context.Background()
	h, err := w.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	capped, err := w.Lock(ctx, "capped", warden.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigSet(ctx, "warden.max-lease", "300").Err(); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"k", "capped"} {
		waitFor(t, key+" renewed at the new cap", func() bool {
			d, err := rdb.PTTL(ctx, key).Result()
			return err == nil && d > 0 && d <= 300*time.Millisecond
		})
	}
	before := calls(t, rdb, "lock.extend")
	waitFor(t, "renewals at the new cap", func() bool { return calls(t, rdb, "lock.extend") >= before+4 })
	held(t, rdb, h)
	held(t, rdb, capped)
	for _, x := range []*warden.Hold{h, capped} {
		if err := x.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Release and Extend racing renewals of 10 ms: after every Release has
// returned, no EXTEND reaches the server.
func TestIntegrationReleaseRacesRenewal(t *testing.T) {
	srv := testserver.Start(t, "--warden.max-lease", "30")
	rdb := srv.Client(t)
	w := warden.New(rdb)
	defer w.Close()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var opts []warden.LockOption
			if i%2 == 1 {
				opts = append(opts, warden.TTL(time.Minute)) // capped and renewed
			}
			h, err := w.Lock(ctx, fmt.Sprint("k", i), opts...)
			if err != nil {
				errs <- err
				return
			}
			time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond)
			go func() { _ = h.Extend(ctx, time.Duration(1+rand.IntN(100))*time.Millisecond) }()
			// ErrNotHeld: a renewal came too late for a 30 ms lease on a
			// busy machine; what is checked is that no EXTEND follows.
			if err := h.Release(ctx); err != nil && !errors.Is(err, warden.ErrNotHeld) {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the racing Extends return (ErrNotHeld)
	before := calls(t, rdb, "lock.extend")
	time.Sleep(100 * time.Millisecond)
	if n := calls(t, rdb, "lock.extend") - before; n != 0 {
		t.Fatalf("%d EXTENDs after every Release returned", n)
	}
}

// Close ends every renewer (goleak): the holds stop renewing, their leases
// run out on the server, and their Contexts end.
func TestIntegrationCloseEndsRenewers(t *testing.T) {
	_, rdb, _ := setupCapped(t)
	ignore := goleak.IgnoreCurrent()
	w := warden.New(rdb)
	ctx := context.Background()
	var holds []*warden.Hold
	for i, opts := range [][]warden.LockOption{nil, {warden.TTL(time.Minute)}, {warden.TTL(time.Second)}} {
		h, err := w.Lock(ctx, fmt.Sprint("k", i), opts...)
		if err != nil {
			t.Fatal(err)
		}
		holds = append(holds, h)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for _, h := range holds {
		if h.Context().Err() == nil {
			t.Fatalf("hold on %s still alive after Close", h.Key())
		}
	}
	goleak.VerifyNone(t, ignore)
	before := calls(t, rdb, "lock.extend")
	waitFor(t, "the leases to run out", func() bool {
		n, err := rdb.Exists(ctx, "k0", "k1", "k2").Result()
		return err == nil && n == 0
	})
	if n := calls(t, rdb, "lock.extend") - before; n != 0 {
		t.Fatalf("%d EXTENDs after Close", n)
	}
}

// slowReply holds back the reply to the first EXTEND for a while after the
// server answered it.
type slowReply struct {
	delay   time.Duration
	once    sync.Once
	replied chan struct{}
}

func (s *slowReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s *slowReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (s *slowReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if strings.EqualFold(fmt.Sprint(cmd.Args()[0]), "LOCK.EXTEND") {
			s.once.Do(func() {
				time.Sleep(s.delay)
				close(s.replied)
			})
		}
		return err
	}
}

// A renewal whose reply comes after the local lease end: the hold's
// Context ended at that end, while the renewal still waited; the late
// success does not revive it (Release says ErrNotHeld), and no EXTEND
// follows.
func TestIntegrationRenewalReplyAfterLeaseEnd(t *testing.T) {
	_, rdb, w := setupCapped(t)
	slow := &slowReply{delay: 2 * maxLease, replied: make(chan struct{})}
	rdb.AddHook(slow)
	ctx := context.Background()
	h, err := w.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.Context().Done():
	case <-slow.replied:
		t.Fatal("the hold's Context outlived its lease, waiting for a renewal's reply")
	}
	<-slow.replied
	lapsed(t, h)
	before := calls(t, rdb, "lock.extend")
	time.Sleep(maxLease / 2)
	if n := calls(t, rdb, "lock.extend") - before; n != 0 {
		t.Fatalf("%d EXTENDs after the hold lapsed", n)
	}
	h2, err := w.Lock(ctx, "k", warden.Wait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := h2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A grant that comes after a wait in the queue longer than its lease is
// held for a lease from the grant, not from the request: the local lease is
// anchored again (an EXTEND after the grant), so the hold is alive when it
// is returned, renews, and its Release frees the key. Every way a hold is
// asked for: the watchdog, a lease under the cap, one above it.
func TestIntegrationAGrantAfterALongWaitIsHeldFromTheGrant(t *testing.T) {
	_, rdb, w := setupCapped(t)
	ctx := context.Background()
	cases := map[string][]warden.LockOption{
		"watchdog":      nil,
		"under the cap": {warden.TTL(900 * time.Millisecond)},
		"above the cap": {warden.TTL(10 * time.Second)},
	}
	for name, opts := range cases {
		a, err := w.Lock(ctx, name, warden.TTL(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		released := make(chan error, 1)
		go func() {
			time.Sleep(1400 * time.Millisecond) // longer than any lease B asks for under the cap
			released <- a.Release(ctx)
		}()
		b, err := w.Lock(ctx, name, opts...)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := <-released; err != nil {
			t.Fatalf("%s: A's release: %v", name, err)
		}
		time.Sleep(100 * time.Millisecond)
		held(t, rdb, b)
		if err := b.Release(ctx); err != nil {
			t.Fatalf("%s: B's release: %v", name, err)
		}
		if n, err := rdb.Exists(ctx, name).Result(); err != nil || n != 0 {
			t.Fatalf("%s: the key after B's release: %d %v", name, n, err)
		}
	}
}
