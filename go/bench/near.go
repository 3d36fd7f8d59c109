// The near-cache bench's Go driver ("near" as the first argument; bench/near_cache.py runs
// it, make bench SECTION=near-cache): warden's Go near cache, NewNearCache(w) with its
// defaults, one reader goroutine reading through warden.Load(ctx, w, key, ttl, loader,
// WithNear(near)) (T = int64: the keys are plain strings the writer SETs, decoded by Load's
// JSON codec; the loader, never expected to run, errs). One run against a server with the
// module.
//
// Flags: --client warden --port P --prefix K --keys 4 --seconds 5 --hits 200000; --version
// prints the packages' versions. Protocol as bench/near_cache_python.py: warm-up, the hit
// latency (hits reads of K:hit, each timed alone with time.Now, the timer included), READY; on
// GO the race, read starts on CLOCK_MONOTONIC (as every driver and the writer: Go's monotonic
// clock, offset once to it with clock_gettime), then RESULT {json} with the reads run-length
// coded and the near cache's stats.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"
	warden "github.com/warden-redis/warden/go"
)

const nearBucketNs = 2_000

// monoNs is CLOCK_MONOTONIC in ns by a system call (used once, to offset Go's clock).
func monoNs() int64 {
	var ts syscall.Timespec
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Nano()
}

func runNear(args []string) error {
	fs := flag.NewFlagSet("near", flag.ContinueOnError)
	client := fs.String("client", "warden", "warden")
	port := fs.Int("port", 0, "the server's port")
	prefix := fs.String("prefix", "near", "the keys' prefix")
	nKeys := fs.Int("keys", 4, "keys")
	seconds := fs.Float64("seconds", 5, "the race's length")
	hits := fs.Int("hits", 200_000, "timed hits")
	version := fs.Bool("version", false, "print the packages' versions")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version {
		out := map[string]string{}
		if bi, ok := debug.ReadBuildInfo(); ok {
			out["go"] = strings.TrimPrefix(bi.GoVersion, "go")
			for _, d := range bi.Deps {
				if d.Path == "github.com/redis/go-redis/v9" {
					out["go-redis"] = d.Version
				}
			}
		}
		b, _ := json.Marshal(out)
		fmt.Println(string(b))
		return nil
	}
	if *client != "warden" {
		return fmt.Errorf("--client: warden only")
	}
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", *port)})
	defer rdb.Close()
	w := warden.New(rdb)
	defer w.Close()
	near, err := warden.NewNearCache(w)
	if err != nil {
		return err
	}
	defer near.Close()
	ctx := context.Background()
	loader := func(context.Context) (int64, error) {
		return 0, errors.New("the loader ran: the key is missing")
	}
	read := func(key string) int64 {
		v, err := warden.Load(ctx, w, key, 5*time.Minute, loader, warden.WithNear(near))
		if err != nil {
			panic(fmt.Sprintf("%s: %v", key, err))
		}
		return v
	}
	keys := make([]string, *nKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s:%d", *prefix, i)
	}
	hit := *prefix + ":hit"
	for range 1000 {
		read(hit)
		for _, k := range keys {
			read(k)
		}
	}
	lat := make([]int64, *hits)
	for i := range lat {
		t0 := time.Now()
		read(hit)
		lat[i] = int64(time.Since(t0))
	}
	sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
	fmt.Println("READY")
	line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
	if strings.TrimSpace(line) != "GO" {
		return nil
	}
	// Go's monotonic clock, offset to CLOCK_MONOTONIC: the smallest bracket of a few tries.
	base := time.Now()
	var offset int64
	best := int64(1 << 62)
	for range 20 {
		a := time.Since(base)
		m := monoNs()
		b := time.Since(base)
		if int64(b-a) < best {
			best = int64(b - a)
			offset = m - int64(a+b)/2
		}
	}
	now := func() int64 { return offset + int64(time.Since(base)) }
	s0 := near.Stats()
	entries := [][5]int64{}
	cur := make([]int, *nKeys)
	for i := range cur {
		cur[i] = -1
	}
	reads := int64(0)
	tStart := now()
	end := tStart + int64(*seconds*1e9)
	i := 0
	for {
		t := now()
		if t >= end {
			break
		}
		v := read(keys[i])
		if j := cur[i]; j >= 0 && entries[j][1] == v && t-entries[j][2] <= nearBucketNs {
			entries[j][3] = t
			entries[j][4]++
		} else {
			entries = append(entries, [5]int64{int64(i), v, t, t, 1})
			cur[i] = len(entries) - 1
		}
		reads++
		i = (i + 1) % *nKeys
	}
	tEnd := now()
	s1 := near.Stats()
	pct := func(p float64) int64 { return lat[min(len(lat)-1, int(float64(len(lat))*p/100))] }
	out, err := json.Marshal(map[string]any{
		"reads":              reads,
		"seconds":            float64(tEnd-tStart) / 1e9,
		"hit_ns_p50":         pct(50),
		"hit_ns_p99":         pct(99),
		"hits":               *hits,
		"timer":              "time.Now/time.Since around each read",
		"info_hits":          s1.Hits - s0.Hits,
		"info_misses":        s1.Misses - s0.Misses,
		"info_invalidations": s1.Invalidations - s0.Invalidations,
		"entries":            entries,
	})
	if err != nil {
		return err
	}
	fmt.Println("RESULT " + string(out))
	return nil
}
