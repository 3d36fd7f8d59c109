package warden_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	warden "github.com/warden-redis/warden/go"
	"github.com/warden-redis/warden/go/internal/testserver"
)

// clientIDs lists the server's clients: id -> the name of its last command.
func clientIDs(t *testing.T, admin *redis.Client) map[string]string {
	t.Helper()
	list, err := admin.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	line := regexp.MustCompile(`^id=(\d+) .* cmd=(\S+) `)
	for _, l := range strings.Split(list, "\n") {
		if m := line.FindStringSubmatch(l); m != nil {
			ids[m[1]] = m[2]
		}
	}
	return ids
}

// acquire takes a hold of kind on key: a lease of ttl, or the watchdog.
func acquire(ctx context.Context, w *warden.Warden, kind, key string, ttl time.Duration) (*warden.Hold, error) {
	lease := warden.TTL(ttl)
	switch kind {
	case "lock":
		return w.Lock(ctx, key, lease)
	case "write":
		return w.WLock(ctx, key, lease)
	case "read":
		return w.RLock(ctx, key, lease)
	case "semaphore":
		p, err := w.Semaphore(key, 2).Acquire(ctx, 1, lease)
		if err != nil {
			return nil, err
		}
		return p.Hold, nil
	default:
		return w.Lock(ctx, key)
	}
}

var wardenCmd = regexp.MustCompile(`^(lock|rwlock|sem)\.`)

// killReleasing waits (writes paused) until a connection opened since
// others shows a release, postponed by the pause (CLIENT KILL is no write),
// then kills the new connections whose last command is warden's.
func killReleasing(t *testing.T, admin *redis.Client, others map[string]string, name string) {
	t.Helper()
	var mine []string
	deadline := time.Now().Add(10 * time.Second)
	for releasing := false; !releasing; {
		if time.Now().After(deadline) {
			t.Fatalf("%s: no release postponed by the pause", name)
		}
		time.Sleep(10 * time.Millisecond)
		mine = mine[:0]
		for id, cmd := range clientIDs(t, admin) {
			if _, old := others[id]; old || !wardenCmd.MatchString(cmd) {
				continue
			}
			mine = append(mine, id)
			releasing = releasing || cmd == "lock.release" || cmd == "rwlock.unlock" || cmd == "sem.release"
		}
	}
	for _, id := range mine {
		admin.Do(context.Background(), "CLIENT", "KILL", "ID", id)
	}
}

// A release whose connection breaks before the server ran it (writes
// paused, then CLIENT KILL) does not leave the key held by nobody until its
// lease ends: go-redis resends it (its MaxRetries), and without retries
// warden resends it in the background; Release reports the error.
// Each kind of hold, with go-redis' retries and without.
func TestIntegrationReleaseCutOffIsSentAgain(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	for _, retries := range []int{0, -1} {
		for _, kind := range []string{"lock", "write", "read", "semaphore", "watchdog"} {
			name := fmt.Sprintf("%s, MaxRetries %d", kind, retries)
			key := fmt.Sprintf("cut:%d:%s", retries, kind)
			others := clientIDs(t, admin)
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: retries})
			w := warden.New(rdb)
			h, err := acquire(ctx, w, kind, key, 30*time.Second)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if err := admin.Do(ctx, "CLIENT", "PAUSE", 20000, "WRITE").Err(); err != nil {
				t.Fatal(err)
			}
			released := make(chan error, 1)
			go func() { released <- h.Release(ctx) }()
			killReleasing(t, admin, others, name)
			var outcome error
			if retries < 0 {
				outcome = <-released
			}
			held, _ := admin.Exists(ctx, key).Result()
			admin.Do(ctx, "CLIENT", "UNPAUSE")
			if retries < 0 {
				if outcome == nil {
					t.Errorf("%s: the release did not fail", name)
				}
				if held != 1 {
					t.Errorf("%s: the first release ran", name)
				}
			} else {
				<-released
			}
			deadline := time.Now().Add(10 * time.Second)
			for admin.Exists(ctx, key).Val() != 0 {
				if time.Now().After(deadline) {
					t.Fatalf("%s: still held: %v", name, admin.Do(ctx, "PTTL", key).Val())
				}
				time.Sleep(10 * time.Millisecond)
			}
			_ = w.Close()
			_ = rdb.Close()
		}
	}
}

// async runs f in a goroutine; its result comes on the channel.
func async(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

// A release that gets no reply (writes paused, its connection killed,
// MaxRetries -1, no ReadTimeout) ends the hold here at once: Release returns
// the error, the hold's Context ends as released (not lost), a second
// Release returns nil and Extend says ErrNotHeld, each within its own short
// ctx while the server is still paused (nothing waits on a resend), and the
// watchdog sends no LOCK.EXTEND after it, even when the resends are cut too;
// the resends free the key once writes resume.
func TestIntegrationReleaseWithoutReplyEndsTheHold(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	const watchdogTTL = 6 * time.Second // renewed 2 s after the grant
	for _, tc := range []struct {
		name     string
		kind     string
		cutAgain bool // the resends' connections killed too, for a second
		shortCtx bool // a second Release and an Extend with a short ctx, while paused
	}{
		{name: "lease", kind: "lock", shortCtx: true},
		{name: "watchdog", kind: "watchdog", shortCtx: true},
		{name: "watchdog, the resends cut too", kind: "watchdog", cutAgain: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "noreply:" + tc.name
			others := clientIDs(t, admin)
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, ReadTimeout: -1})
			defer rdb.Close()
			w := warden.New(rdb, warden.WithWatchdogTTL(watchdogTTL))
			defer w.Close()
			granted := time.Now()
			h, err := acquire(ctx, w, tc.kind, key, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			extends := calls(t, admin, "lock.extend")
			if err := admin.Do(ctx, "CLIENT", "PAUSE", 60000, "WRITE").Err(); err != nil {
				t.Fatal(err)
			}
			paused := true
			unpause := func() {
				if paused {
					admin.Do(ctx, "CLIENT", "UNPAUSE")
					paused = false
				}
			}
			defer unpause()
			var pending []<-chan error // calls still blocked: waited for after the pause
			defer func() {
				unpause()
				for _, ch := range pending {
					<-ch
				}
			}()

			released := async(func() error { return h.Release(ctx) })
			killReleasing(t, admin, others, tc.name)
			select {
			case err := <-released:
				if err == nil {
					t.Fatal("the release did not fail")
				}
			case <-time.After(10 * time.Second):
				pending = append(pending, released)
				t.Fatal("the release did not return once its connection was killed")
			}
			if held := admin.Exists(ctx, key).Val(); held != 1 {
				t.Fatal("the first release ran")
			}
			if h.Context().Err() == nil {
				t.Error("the hold's Context did not end with the release")
			} else if cause := context.Cause(h.Context()); errors.Is(cause, warden.ErrNotHeld) {
				t.Errorf("the hold's Context ended as lost: %v", cause)
			}

			if tc.cutAgain {
				// The resends wait on the pause: kill their connections too.
				cut := 0
				for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
					for id, cmd := range clientIDs(t, admin) {
						if _, old := others[id]; !old && cmd == "lock.release" {
							admin.Do(ctx, "CLIENT", "KILL", "ID", id)
							cut++
						}
					}
				}
				if cut == 0 {
					t.Fatal("no resend came to cut")
				}
				t.Logf("%d resends cut", cut)
			}

			if tc.shortCtx {
				const short = 500 * time.Millisecond
				for _, op := range []struct {
					name string
					want error
					call func(context.Context) error
				}{
					{"a second Release", nil, h.Release},
					{"Extend", warden.ErrNotHeld, func(ctx context.Context) error { return h.Extend(ctx, 10*time.Second) }},
				} {
					cctx, cancel := context.WithTimeout(ctx, short)
					ch := async(func() error { return op.call(cctx) })
					select {
					case err := <-ch:
						if !errors.Is(err, op.want) {
							t.Errorf("%s: %v, want %v", op.name, err, op.want)
						}
					case <-time.After(short + 5*time.Second):
						pending = append(pending, ch)
						t.Errorf("%s with a %v ctx did not return while the server was paused", op.name, short)
					}
					cancel()
				}
			}

			unpause()
			deadline := time.Now().Add(10 * time.Second)
			for admin.Exists(ctx, key).Val() != 0 {
				if time.Now().After(deadline) {
					t.Errorf("still held after the pause: PTTL %v", admin.Do(ctx, "PTTL", key).Val())
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if tc.kind == "watchdog" {
				// Past the watchdog's first renewal.
				time.Sleep(time.Until(granted.Add(watchdogTTL/3 + time.Second)))
				if n := calls(t, admin, "lock.extend"); n != extends {
					t.Errorf("LOCK.EXTEND ran %d times after the release failed", n-extends)
				}
			}
		})
	}
}

// A release that times out (ReadTimeout 500 ms, MaxRetries -1) under a pause
// longer than it (3 s) is resent, with backoff, until writes resume: the key
// is freed then, not left to its lease (or a watchdog).
func TestIntegrationReleaseTimedOutIsResentUntilAnswered(t *testing.T) {
	srv := testserver.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	const pause = 1500 * time.Millisecond // three of the client's read timeouts
	for _, tc := range []struct{ name, kind string }{
		{"lease", "lock"},
		{"semaphore", "semaphore"},
		{"watchdog", "watchdog"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "timedout:" + tc.name
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, ReadTimeout: 500 * time.Millisecond})
			defer rdb.Close()
			w := warden.New(rdb)
			defer w.Close()
			h, err := acquire(ctx, w, tc.kind, key, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if err := admin.Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), "WRITE").Err(); err != nil {
				t.Fatal(err)
			}
			defer admin.Do(ctx, "CLIENT", "UNPAUSE")
			resumed := time.Now().Add(pause)
			if err := h.Release(ctx); err == nil {
				t.Fatal("the release did not time out")
			}
			if admin.Exists(ctx, key).Val() != 1 {
				t.Fatal("the key was freed during the pause")
			}
			for admin.Exists(ctx, key).Val() != 0 {
				if time.Now().After(resumed.Add(10 * time.Second)) {
					t.Fatalf("still held after the pause: PTTL %v", admin.Do(ctx, "PTTL", key).Val())
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
