package warden_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	warden "github.com/warden-redis/warden/go"
	"github.com/warden-redis/warden/go/internal/testserver"
)

// TestMain starts a server for the Example functions unless REDIS_URL names
// one, and checks that no goroutine outlives the tests.
func TestMain(m *testing.M) {
	var srv *testserver.Server
	if os.Getenv("REDIS_URL") == "" {
		var err error
		if srv, err = testserver.Launch(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Setenv("REDIS_URL", "redis://"+srv.Addr())
	}
	code := m.Run()
	if srv != nil {
		srv.Stop()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// setup starts a server and returns a go-redis client and a Warden on it.
func setup(t *testing.T, opts ...warden.Option) (*testserver.Server, *redis.Client, *warden.Warden) {
	t.Helper()
	srv := testserver.Start(t)
	rdb := srv.Client(t)
	w := warden.New(rdb, opts...)
	t.Cleanup(func() { _ = w.Close() })
	return srv, rdb, w
}

// info reads one field of a map reply (LOCK.INFO, SEM.INFO) under RESP3 or RESP2.
func info(t *testing.T, rdb *redis.Client, cmd, key string) map[string]any {
	t.Helper()
	r, err := rdb.Do(context.Background(), cmd, key).Result()
	if err == redis.Nil {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]any{}
	switch v := r.(type) {
	case map[any]any:
		for k, x := range v {
			out[fmt.Sprint(k)] = x
		}
	case []any:
		for i := 0; i+1 < len(v); i += 2 {
			out[fmt.Sprint(v[i])] = v[i+1]
		}
	}
	return out
}
