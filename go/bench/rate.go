package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// rateResult is what one run of the rate bench reports (bench/rate.py reads it).
type rateResult struct {
	// Admits: per goroutine, ms from the run's start of each admission.
	Admits [][]float64 `json:"admits"`
	// Waits: ms from wanting an admission to having it, in the order of Admits flattened.
	Waits []float64 `json:"waits"`
	// Sent: commands go-redis sent during the run (a hook counts them).
	Sent int64 `json:"sent"`
	// Refused: replies that admitted nothing (for warden-wait: answers limited despite WAIT).
	Refused     int64  `json:"refused"`
	Errors      int64  `json:"errors"`
	ErrorSample string `json:"error_sample"`
}

// countHook counts the commands a go-redis client sends while on.
type countHook struct {
	on   atomic.Bool
	sent atomic.Int64
}

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.on.Load() {
			h.sent.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.on.Load() {
			h.sent.Add(int64(len(cmds)))
		}
		return next(ctx, cmds)
	}
}

// runRate is make bench SECTION=rate's Go driver (bench/rate.py runs it as "go-bench rate ..."):
// --callers goroutines, each wanting to be admitted by one rate limiter as soon as possible, again
// and again, for --seconds, on one go-redis client (its pool: a connection per goroutine in
// flight). Clients:
//
//   - warden-wait: RATE.ACQUIRE key count period BURST b WAIT 10000, one command per admission.
//   - warden-retry: RATE.ACQUIRE without WAIT; when limited, sleep retry_after ms and ask again.
//   - redis-rate: go-redis/redis_rate v10 (GCRA in Lua), Limit{Rate: count, Period: period,
//     Burst: b}; when refused, sleep Result.RetryAfter and Allow again.
//
// After a warm-up on KEY:warm it prints READY; on a line GO it runs and prints RESULT {json}
// (rateResult), then waits for the end of stdin. A goroutine stops asking at --seconds; an
// admission it already asked for still counts.
func runRate(args []string) error {
	fs := flag.NewFlagSet("rate", flag.ContinueOnError)
	client := fs.String("client", "", "warden-wait, warden-retry or redis-rate")
	port := fs.Int("port", 0, "the server's port")
	key := fs.String("key", "", "the limiter's key")
	count := fs.Int("count", 200, "tokens per period")
	periodMs := fs.Int("period", 1000, "the period, ms")
	burst := fs.Int("burst", 10, "the burst")
	callers := fs.Int("callers", 16, "goroutines")
	seconds := fs.Float64("seconds", 10, "the run's length")
	version := fs.Bool("version", false, "print the packages' versions")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version {
		return rateVersions()
	}
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", *port),
		PoolSize: *callers + 4, MinIdleConns: *callers, ReadTimeout: 15 * time.Second})
	defer rdb.Close()
	hook := &countHook{}
	rdb.AddHook(hook)
	ctx := context.Background()
	var refused atomic.Int64
	var admit func(key string) error
	switch *client {
	case "warden-wait", "warden-retry":
		args := []any{*count, *periodMs, "BURST", *burst}
		if *client == "warden-wait" {
			args = append(args, "WAIT", 10000)
		}
		admit = func(key string) error {
			for {
				reply, err := rdb.Do(ctx, append([]any{"RATE.ACQUIRE", key}, args...)...).Int64Slice()
				if err != nil {
					return err
				}
				if len(reply) != 5 {
					return fmt.Errorf("RATE.ACQUIRE: %v", reply)
				}
				if reply[0] == 0 {
					return nil
				}
				refused.Add(1)
				if *client == "warden-retry" {
					time.Sleep(time.Duration(reply[3]) * time.Millisecond)
				}
			}
		}
	case "redis-rate":
		limiter := redis_rate.NewLimiter(rdb)
		limit := redis_rate.Limit{Rate: *count, Period: time.Duration(*periodMs) * time.Millisecond, Burst: *burst}
		admit = func(key string) error {
			for {
				res, err := limiter.Allow(ctx, key, limit)
				if err != nil {
					return err
				}
				if res.Allowed > 0 {
					return nil
				}
				refused.Add(1)
				time.Sleep(res.RetryAfter)
			}
		}
	default:
		return fmt.Errorf("unknown --client %q", *client)
	}

	// Warm-up: the pool's connections open, the script loaded.
	var wg sync.WaitGroup
	for range *callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = admit(*key + ":warm")
		}()
	}
	wg.Wait()
	fmt.Println("READY")
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() || strings.TrimSpace(in.Text()) != "GO" {
		return nil
	}

	res := rateResult{Admits: make([][]float64, *callers)}
	waits := make([][]float64, *callers)
	var errs atomic.Int64
	var firstErr atomic.Value
	hook.on.Store(true)
	refused.Store(0)
	t0 := time.Now()
	end := t0.Add(time.Duration(*seconds * float64(time.Second)))
	for i := range *callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				asked := time.Now()
				if !asked.Before(end) {
					return
				}
				if err := admit(*key); err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					time.Sleep(10 * time.Millisecond)
					continue
				}
				now := time.Now()
				res.Admits[i] = append(res.Admits[i], float64(now.Sub(t0).Microseconds())/1000)
				waits[i] = append(waits[i], float64(now.Sub(asked).Microseconds())/1000)
			}
		}()
	}
	wg.Wait()
	hook.on.Store(false)
	res.Sent = hook.sent.Load()
	res.Refused = refused.Load()
	res.Errors = errs.Load()
	if s, ok := firstErr.Load().(string); ok {
		res.ErrorSample = s
	}
	for _, w := range waits {
		res.Waits = append(res.Waits, w...)
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	fmt.Printf("RESULT %s\n", b)
	in.Scan()
	return nil
}

// rateVersions prints the redis_rate and go-redis versions this binary was built with, as JSON.
func rateVersions() error {
	all := moduleVersions()
	b, err := json.Marshal(map[string]string{
		"redis_rate": all["github.com/go-redis/redis_rate/v10"],
		"go-redis":   all["github.com/redis/go-redis/v9"],
	})
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	return nil
}
