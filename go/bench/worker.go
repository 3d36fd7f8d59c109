package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// sliceResult is what one process reports for one slice of a contended run.
type sliceResult struct {
	// Counts: hand-offs per goroutine whose grant came inside the window.
	Counts []int64 `json:"counts"`
	// Granted: acquisitions per goroutine granted at all (those that end after the window too).
	Granted []int64 `json:"granted"`
	// Waits: µs from the call to the grant, every acquisition started in the window (those that
	// finish after it too: leaving them out would hide the slowest).
	Waits []int64 `json:"waits"`
	// Failures: acquisitions that returned an error (the library gave up, or the budget ended).
	Failures   int64   `json:"failures"`
	FailWaitUs []int64 `json:"fail_waits"`
	// ReleaseErrors: releases that returned an error.
	ReleaseErrors int64  `json:"release_errors"`
	Overlaps      int64  `json:"overlaps"`
	HeldNs        int64  `json:"held_ns"`
	FirstError    string `json:"first_error"`
}

// runWorker is a child process of the harness: opens the contender, warms up, prints READY, then
// runs one slice per "GO seconds" line on stdin and prints "RESULT {json}" after each.
func runWorker(args []string) error {
	if len(args) != 5 {
		return fmt.Errorf("worker: contender goroutines addr key hold-µs")
	}
	c, ok := find(args[0])
	if !ok {
		return fmt.Errorf("unknown contender %q", args[0])
	}
	n, err := strconv.Atoi(args[1])
	if err != nil {
		return err
	}
	holdUs, err := strconv.Atoi(args[4])
	if err != nil {
		return err
	}
	con, err := c.open(args[2])
	if err != nil {
		return err
	}
	defer con.Close()
	lockers := make([]Locker, n)
	for i := range lockers {
		lockers[i] = con.Locker(args[3], i)
	}
	// Warm-up: connections opened, scripts loaded (no hold: a long one would only take time).
	var wg sync.WaitGroup
	var warmErr atomic.Value
	for _, l := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < warmupIterations; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), budget)
				err := l.Acquire(ctx)
				cancel()
				if err != nil {
					continue // an incumbent may give up under contention; the run counts that
				}
				if err := l.Release(context.Background()); err != nil {
					warmErr.Store(err)
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := warmErr.Load().(error); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	fmt.Println("READY")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		line := in.Text()
		if !strings.HasPrefix(line, "GO ") {
			break
		}
		secs, err := strconv.ParseFloat(line[3:], 64)
		if err != nil {
			return err
		}
		b, _ := json.Marshal(slice(lockers, c.limit, time.Duration(secs*float64(time.Second)), time.Duration(holdUs)*time.Microsecond))
		fmt.Printf("RESULT %s\n", b)
	}
	return nil
}

// slice runs every goroutine's loop for d: acquire (its own budget), hold (time.Sleep of the
// hold: the box has 2 shared cores, a busy-spin would take one from the server), release.
func slice(lockers []Locker, limit int, d, hold time.Duration) sliceResult {
	var (
		mu       sync.Mutex
		res      = sliceResult{Counts: make([]int64, len(lockers)), Granted: make([]int64, len(lockers))}
		inside   atomic.Int64
		overlaps atomic.Int64
		held     atomic.Int64
		holds    atomic.Int64
		wg       sync.WaitGroup
	)
	end := time.Now().Add(d)
	for g, l := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var waits, failWaits []int64
			var count, failures, relErrs int64
			var first string
			for time.Now().Before(end) {
				t0 := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), budget)
				err := l.Acquire(ctx)
				cancel()
				t1 := time.Now()
				if err != nil {
					failures++
					failWaits = append(failWaits, t1.Sub(t0).Microseconds())
					if first == "" {
						first = oneLine(err.Error())
					}
					continue
				}
				if inside.Add(1) > int64(limit) {
					overlaps.Add(1)
				}
				time.Sleep(hold)
				inside.Add(-1)
				held.Add(int64(time.Since(t1)))
				holds.Add(1)
				if err := l.Release(context.Background()); err != nil {
					relErrs++
					if first == "" {
						first = "release: " + oneLine(err.Error())
					}
				}
				waits = append(waits, max(1, t1.Sub(t0).Microseconds()))
				if !t1.After(end) {
					count++
				}
			}
			mu.Lock()
			defer mu.Unlock()
			res.Counts[g] = count
			res.Granted[g] = int64(len(waits))
			res.Waits = append(res.Waits, waits...)
			res.FailWaitUs = append(res.FailWaitUs, failWaits...)
			res.Failures += failures
			res.ReleaseErrors += relErrs
			if res.FirstError == "" {
				res.FirstError = first
			}
		}()
	}
	wg.Wait()
	res.Overlaps = overlaps.Load()
	if n := holds.Load(); n > 0 {
		res.HeldNs = held.Load() / n
	}
	return res
}

// runUncontended: one goroutine, acquire + release on a free key, after READY and GO; prints DONE
// and waits for stdin to close (the harness counts MONITOR's lines meanwhile).
func runUncontended(args []string) error {
	if len(args) != 4 {
		return fmt.Errorf("uncontended: contender iterations addr key")
	}
	c, ok := find(args[0])
	if !ok {
		return fmt.Errorf("unknown contender %q", args[0])
	}
	n, err := strconv.Atoi(args[1])
	if err != nil {
		return err
	}
	con, err := c.open(args[2])
	if err != nil {
		return err
	}
	defer con.Close()
	ctx := context.Background()
	warm := con.Locker(args[3]+"-warm", 0)
	for i := 0; i < warmupIterations; i++ {
		if err := warm.Acquire(ctx); err != nil {
			return err
		}
		if err := warm.Release(ctx); err != nil {
			return err
		}
	}
	l := con.Locker(args[3], 0)
	fmt.Println("READY")
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() || in.Text() != "GO" {
		return nil
	}
	for i := 0; i < n; i++ {
		if err := l.Acquire(ctx); err != nil {
			return err
		}
		if err := l.Release(ctx); err != nil {
			return err
		}
	}
	fmt.Println("DONE")
	in.Scan()
	return nil
}

// oneLine: an error's text as one table cell (errors.Join puts a newline between its parts).
func oneLine(s string) string {
	return strings.ReplaceAll(strings.Join(strings.Fields(s), " "), "|", "/")
}
