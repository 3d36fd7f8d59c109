package warden_test

import (
	"context"
	"testing"
	"time"

	warden "github.com/warden-redis/warden/go"
)

// A loader that panics while refreshing a stale value in the background
// must not crash the process: the caller was already served, the lease is
// abandoned.
func TestLoadBackgroundRefreshPanics(t *testing.T) {
	_, rdb, w := setup(t)
	ctx := context.Background()
	v, err := warden.Load(ctx, w, "c", time.Minute, func(context.Context) (string, error) { return "old", nil })
	if err != nil || v != "old" {
		t.Fatal(v, err)
	}
	if err := rdb.Do(ctx, "CACHE.INVALIDATE", "c", "STALE", 60000).Err(); err != nil {
		t.Fatal(err)
	}
	loaded := make(chan struct{})
	v, err = warden.Load(ctx, w, "c", time.Minute, func(context.Context) (string, error) {
		defer close(loaded)
		panic("loader bug")
	})
	if err != nil || v != "old" {
		t.Fatalf("stale read: %q %v", v, err)
	}
	<-loaded
	// The lease was abandoned: the next reader gets the refresh lease.
	waitFor(t, "the lease abandoned", func() bool {
		r, err := rdb.Do(ctx, "CACHE.GET", "c", 1000).Slice()
		if err != nil || len(r) != 2 || r[1] == nil {
			return false
		}
		return rdb.Do(ctx, "CACHE.ABANDON", "c", r[1]).Err() == nil
	})
}
