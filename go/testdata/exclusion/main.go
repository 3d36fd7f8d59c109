// Command exclusion is one process of the Go client's mutual-exclusion test:
// goroutines take one lock in turn and count, in a file all processes map,
// how many are inside at once and whether fences ever go backwards.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	warden "github.com/warden-redis/warden/go"
)

func main() {
	addr := flag.String("addr", "", "server")
	shared := flag.String("shared", "", "file of 16 bytes shared by the processes")
	goroutines := flag.Int("goroutines", 50, "")
	n := flag.Int("n", 25000, "acquisitions by this process")
	flag.Parse()
	f, err := os.OpenFile(*shared, os.O_RDWR, 0)
	if err != nil {
		panic(err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, 16, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		panic(err)
	}
	inside := (*int64)(unsafe.Pointer(&mem[0]))
	lastFence := (*int64)(unsafe.Pointer(&mem[8]))

	rdb := redis.NewClient(&redis.Options{Addr: *addr, PoolSize: *goroutines})
	w := warden.New(rdb)
	var acquired, overlaps, backwards, errs atomic.Int64
	var left atomic.Int64
	left.Store(int64(*n))
	var wg sync.WaitGroup
	for range *goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				h, err := w.Lock(ctx, "exclusion", warden.TTL(10*time.Second))
				cancel()
				if err != nil {
					errs.Add(1)
					continue
				}
				if atomic.AddInt64(inside, 1) != 1 {
					overlaps.Add(1)
				}
				if prev := atomic.SwapInt64(lastFence, h.Fence()); prev >= h.Fence() {
					backwards.Add(1)
				}
				acquired.Add(1)
				atomic.AddInt64(inside, -1)
				if err := h.Release(context.Background()); err != nil {
					errs.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	_ = w.Close()
	_ = rdb.Close()
	_ = json.NewEncoder(os.Stdout).Encode(map[string]int64{
		"acquired": acquired.Load(), "overlaps": overlaps.Load(), "backwards": backwards.Load(), "errors": errs.Load(),
	})
}
