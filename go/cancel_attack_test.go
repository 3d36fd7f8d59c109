package warden_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	warden "github.com/warden-redis/warden/go"
)

// Cancels at every instant of a wait's start (before, during and just after
// the WAIT is sent): each call returns its context's error soon after the
// cancel, and nothing is left waiting. A cancel that reaches the server
// before the waiter's command must not stall the call (WARDEN.WITHDRAW
// answers 0 then, and so does CLIENT UNBLOCK).
func TestIntegrationCancelReturnsPromptly(t *testing.T) {
	for _, c := range withdrawCases {
		t.Run(c.name, func(t *testing.T) {
			_, rdb, w := setupCancel(t, c.deny)
			ctx := context.Background()
			holder, err := w.TryLock(ctx, "k", warden.TTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Release(ctx)
			r := rand.New(rand.NewPCG(1, 2))
			var worst time.Duration
			for range 300 {
				cctx, cancel := context.WithCancel(ctx)
				var cancelled time.Time
				time.AfterFunc(time.Duration(r.IntN(1500))*time.Microsecond, func() { cancelled = time.Now(); cancel() })
				_, err := w.Lock(cctx, "k")
				back := time.Now()
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("cancelled: %v", err)
				}
				worst = max(worst, back.Sub(cancelled))
			}
			t.Logf("slowest return after a cancel: %v", worst)
			// Generous for a busy box; a stall waits 1 s for a reply that never comes.
			if worst > 700*time.Millisecond {
				t.Fatalf("a call returned %v after its cancel", worst)
			}
			if n := infoField(t, rdb, "warden", "warden_waiting_clients"); n != 0 {
				t.Fatalf("%d clients still waiting", n)
			}
		})
	}
}
