package warden_test

import (
	"context"
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

// A release whose connection breaks before the server ran it (writes
// paused, then CLIENT KILL) does not leave the key held by nobody until its
// lease ends: go-redis resends it (its MaxRetries), and without retries
// warden sends it once more on a new connection; Release reports the error.
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
			ttl := warden.TTL(30 * time.Second)
			var h *warden.Hold
			var err error
			switch kind {
			case "lock":
				h, err = w.Lock(ctx, key, ttl)
			case "write":
				h, err = w.WLock(ctx, key, ttl)
			case "read":
				h, err = w.RLock(ctx, key, ttl)
			case "semaphore":
				var p *warden.Permit
				p, err = w.Semaphore(key, 2).Acquire(ctx, 1, ttl)
				if err == nil {
					h = p.Hold
				}
			default:
				h, err = w.Lock(ctx, key)
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if err := admin.Do(ctx, "CLIENT", "PAUSE", 20000, "WRITE").Err(); err != nil {
				t.Fatal(err)
			}
			released := make(chan error, 1)
			go func() { released <- h.Release(ctx) }()
			// This Warden's connections whose last command is warden's, once one
			// shows the release, postponed by the pause (CLIENT KILL is no write).
			var mine []string
			deadline := time.Now().Add(10 * time.Second)
			for releasing := false; !releasing; {
				if time.Now().After(deadline) {
					t.Fatalf("%s: no release postponed by the pause", name)
				}
				time.Sleep(10 * time.Millisecond)
				mine = mine[:0]
				for id, cmd := range clientIDs(t, admin) {
					if _, old := others[id]; old || !regexp.MustCompile(`^(lock|rwlock|sem)\.`).MatchString(cmd) {
						continue
					}
					mine = append(mine, id)
					releasing = releasing || cmd == "lock.release" || cmd == "rwlock.unlock" || cmd == "sem.release"
				}
			}
			for _, id := range mine {
				admin.Do(ctx, "CLIENT", "KILL", "ID", id)
			}
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
			deadline = time.Now().Add(10 * time.Second)
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
