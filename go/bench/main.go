// Command bench is make bench SECTION=go: warden's Go client against go-redsync/redsync v4 and
// bsm/redislock on go-redis v9, side by side on one redis-server. Prints markdown and writes
// OUT.md and OUT.json.
//
//	bench [--quick] [--rounds N] [--out PREFIX] [--only name,name] [--port N]
//
// WARDEN_MODULE: the module (required); WARDEN_SERVER: the server (default redis-server). Workers
// are child processes of this binary, started with "worker" or "uncontended" as the first
// argument. "rate" as the first argument: make bench SECTION=rate's Go driver (rate.go), run by
// bench/rate.py. "near" as the first argument: make bench SECTION=near-cache's Go driver
// (near.go), run by bench/near_cache.py.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
)

const (
	goroutines = 16
	hold       = time.Millisecond
	// longHold: 16 holds of it queue 8 s of work, within the budget for a FIFO queue and past what
	// redsync's 32 tries of 50-250 ms sleeps wait (about 5 s).
	longHold = 500 * time.Millisecond
	lease    = 10 * time.Second
	// budget: each acquisition's context deadline; an incumbent may give up sooner by itself.
	budget                = 10 * time.Second
	semLimit              = 4
	warmupIterations      = 20
	uncontendedIterations = 200
	// startup: a worker's start and warm-up, or its last waiters after the window, on a busy box.
	startup = 60 * time.Second
)

func main() {
	if len(os.Args) > 1 {
		var err error
		switch os.Args[1] {
		case "worker":
			err = runWorker(os.Args[2:])
		case "uncontended":
			err = runUncontended(os.Args[2:])
		case "rate":
			err = runRate(os.Args[2:])
		case "near":
			err = runNear(os.Args[2:])
		default:
			err = harness(os.Args[1:])
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "go bench:", err)
			os.Exit(1)
		}
		return
	}
	if err := harness(nil); err != nil {
		fmt.Fprintln(os.Stderr, "go bench:", err)
		os.Exit(1)
	}
}

func harness(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "a short run: 3 s per row, one slice")
	rounds := fs.Int("rounds", 0, "slices per row (default 5, 1 with --quick)")
	out := fs.String("out", "bench/results/go", "prefix of the .md and .json written")
	only := fs.String("only", "", "comma-separated contenders to run (default all)")
	port := fs.Int("port", 0, "the server's port (default a free one)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	module := os.Getenv("WARDEN_MODULE")
	if module == "" {
		return fmt.Errorf("WARDEN_MODULE: the module to load")
	}
	binary := os.Getenv("WARDEN_SERVER")
	if binary == "" {
		binary = "redis-server"
	}
	b := &bench{quick: *quick, rounds: *rounds, seconds: 10, started: time.Now()}
	if b.quick {
		b.seconds = 3
	}
	if b.rounds == 0 {
		b.rounds = 5
		if b.quick {
			b.rounds = 1
		}
	}
	if *only != "" {
		b.only = strings.Split(*only, ",")
	}
	return b.run(binary, module, *port, *out)
}
