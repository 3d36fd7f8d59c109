package warden_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	warden "github.com/warden-redis/warden/go"
)

// A lease shorter than the acquire's round trip ends before the hold is
// returned: its expiry must not race the hold's start (go test -race), and
// the hold reads as lost.
func TestLeaseEndsDuringStart(t *testing.T) {
	_, _, w := setup(t)
	ctx := context.Background()
	for _, ttl := range []time.Duration{time.Nanosecond, time.Microsecond, time.Millisecond} {
		for i := range 20 {
			h, err := w.TryLock(ctx, fmt.Sprint("k", ttl, i), warden.TTL(ttl))
			if err != nil {
				t.Fatal(ttl, err)
			}
			<-h.Context().Done()
			if err := h.Release(ctx); !errors.Is(err, warden.ErrNotHeld) {
				t.Fatalf("%v: Release of a lost hold: %v", ttl, err)
			}
		}
	}
}
