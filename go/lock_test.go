package warden_test

import (
	"context"
	"errors"
	"testing"
	"time"

	warden "github.com/warden-redis/warden/go"
)

func TestIntegrationLockBasics(t *testing.T) {
	_, rdb, w := setup(t)
	ctx := context.Background()
	h, err := w.TryLock(ctx, "k", warden.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.TryLock(ctx, "k"); !errors.Is(err, warden.ErrNotAcquired) {
		t.Fatalf("second TryLock: %v", err)
	}
	if got := info(t, rdb, "LOCK.INFO", "k")["owner"]; got != h.Owner() {
		t.Fatalf("owner %v, want %s", got, h.Owner())
	}
	if err := h.Extend(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	if h.Context().Err() == nil {
		t.Fatal("Context not cancelled by Release")
	}
	if err := h.Extend(ctx, time.Minute); !errors.Is(err, warden.ErrNotHeld) {
		t.Fatalf("Extend after release: %v", err)
	}
	h2, err := w.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if h2.Fence() <= h.Fence() {
		t.Fatalf("fence %d after %d", h2.Fence(), h.Fence())
	}
	if err := h2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := info(t, rdb, "LOCK.INFO", "k"); got != nil {
		t.Fatalf("LOCK.INFO after release: %v", got)
	}
}
