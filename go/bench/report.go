package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"time"
)

var (
	nan = math.NaN()
	inf = math.Inf(1)
)

func bg() context.Context { return context.Background() }

var lockNames = []string{"warden-lock", "redsync-default-lock", "redsync-tries-lock",
	"redislock-linear-lock", "redislock-exp-lock"}

var longNames = []string{"warden-lock", "redsync-default-lock", "redsync-tries-lock", "redislock-linear-lock"}

var semNames = []string{"warden-sem", "redsync-sem"}

// versions of the modules this binary was built with.
func moduleVersions() map[string]string {
	out := map[string]string{}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			v := d.Version
			if d.Replace != nil {
				v = "(this checkout)"
				if d.Replace.Version != "" {
					v = d.Replace.Version
				}
			}
			out[d.Path] = v
		}
	}
	return out
}

func (b *bench) run(binary, module string, port int, out string) error {
	before := machine()
	s, err := startServer(binary, module, port)
	if err != nil {
		return err
	}
	defer s.close()
	mods := moduleVersions()
	versions := map[string]string{
		"server":    fmt.Sprintf("Redis %s (%s)", s.version(), binary),
		"module":    fmt.Sprintf("%s (%s)", s.moduleVersion(), module),
		"go":        runtime.Version(),
		"go-redis":  mods["github.com/redis/go-redis/v9"],
		"redsync":   mods["github.com/go-redsync/redsync/v4"],
		"redislock": mods["github.com/bsm/redislock"],
	}
	lockRows := b.contended(s, lockNames, hold, b.seconds, b.rounds)
	// one slice: an acquisition may take the whole budget, a slice lasts until its last one ends
	longRows := b.contended(s, longNames, longHold, b.seconds, 1)
	semRows := b.contended(s, semNames, hold, b.seconds, b.rounds)
	var unc []uncontendedRow
	for _, n := range append(append([]string{}, lockNames...), semNames...) {
		if c, ok := find(n); ok && b.selected(n) {
			unc = append(unc, b.uncontended(s, c))
		}
	}
	after := machine()

	var md strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&md, format, a...) }
	w("## Go: warden's client against redsync and bsm/redislock\n\n")
	w("Server: %s; module: %s.  \n", versions["server"], versions["module"])
	w("Every client on %s with go-redis %s (its default pool); redsync %s (its go-redis v9 pool), bsm/redislock %s.  \n",
		versions["go"], versions["go-redis"], versions["redsync"], versions["redislock"])
	w("Machine at the start: %s  \n\n", before)

	w("**Lock, %d goroutines on one key**: each goroutine loops acquire, `time.Sleep(%s)` inside (measured %s ms), release, ",
		goroutines, hold, fmtNum(heldMs(lockRows)))
	w("for %s s", fmtNum(b.seconds))
	if b.rounds > 1 {
		w(": %d slices of %s s per client, the clients taking turns (every process started first), so that other work ",
			b.rounds, fmtNum(b.seconds/float64(b.rounds)))
		w("on the machine falls on all alike; in brackets the slowest and fastest slice's hand-offs/s")
	}
	w(" (held %%: hand-offs/s × the hold, the share of the run the lock was held; 100 %% is the ceiling). ")
	w("One process × %d goroutines, and 4 processes × %d goroutines (child processes of the harness, results summed). ",
		goroutines, goroutines/4)
	w("Each acquisition has a budget of %s s (its context's deadline); a library may give up sooner by itself: a failure. ", fmtNum(budget.Seconds()))
	w("Lease %s s for every client (redsync `WithExpiry`, redislock's ttl, warden `TTL`). ", fmtNum(lease.Seconds()))
	w("Wait: from the call to the grant, granted acquisitions only. Server CPU: `INFO cpu` used_cpu_sys + used_cpu_user over the run; ")
	w("commands: `INFO commandstats` over the run, those run inside scripts included, failed tries included.\n\n")
	table(&md, lockRows, 1)
	others(&md, lockRows)
	ratios(&md, lockRows, unc)
	w("\nHow the incumbents wait: redsync `LockContext` tries `SET NX PX`, then sleeps a random 50-250 ms (its default) ")
	w("and tries again, %s tries by default, then returns `ErrFailed`/`ErrTaken`; its release is an `EVALSHA` (GET + DEL). ", "32")
	w("bsm/redislock tries its obtain script (`MSETNX` + `PEXPIRE`) and, with a retry strategy, sleeps on a ticker between ")
	w("tries until the context's deadline (without one it does not retry). A goroutine that releases and asks again does not ")
	w("sleep first, so it often takes the lock back before a sleeping one wakes: none of them is FIFO. warden queues each waiter ")
	w("on the server (`LOCK.ACQUIRE ... WAIT`, the context's deadline) and grants in FIFO order in the release's event-loop turn.\n")

	if len(longRows) > 0 {
		w("\n**Lock, %d goroutines on one key, %s inside**: the same loop with `time.Sleep(%s)` (measured %s ms), for %s s in one slice ",
			goroutines, longHold, longHold, fmtNum(heldMs(longRows)), fmtNum(b.seconds))
		w("(acquisitions started in it run to their end): %d holds queue %s s of work, within the %s s budget for a FIFO queue, ",
			goroutines, fmtNum(goroutines*longHold.Seconds()), fmtNum(budget.Seconds()))
		w("longer than redsync's 32 default tries wait (about 5 s of sleeps). Failures are acquisitions that returned an error.\n\n")
		table(&md, longRows, 1)
		others(&md, longRows)
		longRatios(&md, longRows)
	}

	if len(semRows) > 0 {
		w("\n**Semaphore, limit %d, %d goroutines**: warden `Semaphore(key, %d).Acquire(ctx, 1)` against what a redsync user ",
			semLimit, goroutines, semLimit)
		w("builds (redsync has none): %d mutexes, a round of `TryLockContext` over them, then redsync's own 50-250 ms sleep, ", semLimit)
		w("for at most 32 rounds; same loop, acquisitions/s.\n\n")
		table(&md, semRows, semLimit)
		others(&md, semRows)
		semRatios(&md, semRows)
	}

	w("\n**Uncontended acquire + release**: one goroutine, %d times on a free key, counted with `MONITOR` ", uncontendedIterations)
	w("(sent: the client's commands; run: with those inside Lua scripts). Target for warden: ≤ 2 sent.\n\n")
	w("| client | workload | commands sent | commands run | which (per acquire + release) | target |\n|---|---|---|---|---|---|\n")
	for _, u := range unc {
		workload := "lock"
		if c, ok := find(u.Contender); ok && c.limit > 1 {
			workload = fmt.Sprintf("semaphore (limit %d)", c.limit)
		}
		if u.Failed != "" {
			w("| %s | %s | failed: %s | | | |\n", u.Label, workload, u.Failed)
			continue
		}
		target := "anchor"
		if strings.HasPrefix(u.Contender, "warden") {
			target = mark(u.Sent <= 2)
		}
		w("| %s | %s | %s | %s | %s | %s |\n", u.Label, workload, fmtNum(u.Sent), fmtNum(u.Run), u.Which, target)
	}
	w("\nMachine at the end: %s  \n", after)
	w("(%s s on %d cores.)\n", fmtNum(time.Since(b.started).Seconds()), runtime.NumCPU())

	fmt.Print(md.String())
	js := map[string]any{
		"versions": versions, "quick": b.quick, "rounds": b.rounds,
		"params": map[string]any{"goroutines": goroutines, "hold-ms": hold.Milliseconds(), "long-hold-ms": longHold.Milliseconds(),
			"lease-ms": lease.Milliseconds(), "budget-ms": budget.Milliseconds(), "seconds": b.seconds,
			"semaphore-limit": semLimit, "uncontended-iterations": uncontendedIterations,
			"redsync-tries": redsyncTries},
		"lock": cleanRows(lockRows), "lock-long-hold": cleanRows(longRows), "semaphore": cleanRows(semRows), "uncontended": unc,
		"machine": map[string]string{"start": before, "end": after},
	}
	j, err := json.MarshalIndent(js, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(out+".md", []byte(md.String()), 0o644); err != nil {
		return err
	}
	return os.WriteFile(out+".json", append(j, '\n'), 0o644)
}

// cleanRows: JSON has no NaN or Inf: those become -1.
func cleanRows(rows []row) []row {
	out := make([]row, len(rows))
	for i, r := range rows {
		for _, f := range []*float64{&r.P50Ms, &r.P99Ms, &r.MaxMs, &r.Fairness, &r.FailMaxWaitMs,
			&r.CPUMsPer1000, &r.CommandsPerHandoff, &r.OthersCores} {
			if math.IsNaN(*f) || math.IsInf(*f, 0) {
				*f = -1
			}
		}
		out[i] = r
	}
	return out
}

func heldMs(rows []row) float64 {
	var sum float64
	n := 0
	for _, r := range rows {
		if r.Failed == "" && r.HeldMs > 0 {
			sum += r.HeldMs
			n++
		}
	}
	if n == 0 {
		return nan
	}
	return sum / float64(n)
}

func table(md *strings.Builder, rows []row, limit int) {
	md.WriteString("| client | processes × goroutines | hand-offs/s | held % | p50 wait ms | p99 wait ms | max wait ms | " +
		"per-goroutine max/min | failures (slowest, ms) | server CPU ms / 1,000 acquisitions | server commands / acquisition | " +
		"release errors | overlaps | other processes, cores |\n")
	md.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(md, "| %s | %d × %d | ", r.Label, r.Procs, goroutines/r.Procs)
		if r.Failed != "" {
			fmt.Fprintf(md, "failed: %s | | | | | | | | | | | |\n", r.Failed)
			continue
		}
		md.WriteString(fmtNum(r.HandoffsPerS))
		if len(r.Slices) > 1 {
			lo, hi := r.Slices[0], r.Slices[0]
			for _, v := range r.Slices {
				lo, hi = min(lo, v), max(hi, v)
			}
			fmt.Fprintf(md, " (%s–%s)", fmtInt(lo), fmtInt(hi))
		}
		fmt.Fprintf(md, " | %.0f | %s | %s | %s | ", r.HandoffsPerS*r.HeldMs/10/float64(limit),
			fmtNum(r.P50Ms), fmtNum(r.P99Ms), fmtNum(r.MaxMs))
		if math.IsInf(r.Fairness, 1) {
			md.WriteString("∞ (a goroutine got none) | ")
		} else {
			md.WriteString(fmtNum(r.Fairness) + " | ")
		}
		if r.Failures > 0 {
			fmt.Fprintf(md, "%d (%s) | ", r.Failures, fmtNum(r.FailMaxWaitMs))
		} else {
			md.WriteString("0 | ")
		}
		fmt.Fprintf(md, "%s | %s | %d | %d | %s |\n", fmtNum(r.CPUMsPer1000), fmtNum(r.CommandsPerHandoff),
			r.ReleaseErrors, r.Overlaps, fmtNum(r.OthersCores))
	}
	var samples []string
	for _, r := range rows {
		if r.Failed == "" && r.ErrorSample != "" {
			samples = append(samples, fmt.Sprintf("%s (%d × %d): `%s`", r.Label, r.Procs, goroutines/r.Procs, r.ErrorSample))
		}
	}
	if len(samples) > 0 {
		md.WriteString("\nFirst error of each row that had one: " + strings.Join(samples, "; ") + ".\n")
	}
	var cmds []string
	for _, r := range rows {
		if r.Failed == "" && r.Granted > 0 {
			var parts []string
			for _, k := range topKeys(r.CommandsByName, 5) {
				per := float64(r.CommandsByName[k]) / float64(r.Granted)
				if per < 0.01 {
					continue // a connection's handshake
				}
				parts = append(parts, fmt.Sprintf("%s %s", k, fmtNum(per)))
			}
			cmds = append(cmds, fmt.Sprintf("%s (%d × %d): %s", r.Label, r.Procs, goroutines/r.Procs, strings.Join(parts, ", ")))
		}
	}
	if len(cmds) > 0 {
		md.WriteString("\nServer commands per granted acquisition by name: " + strings.Join(cmds, "; ") + ".\n")
	}
}

// others: what the rest of the machine used while these rows ran.
func others(md *strings.Builder, rows []row) {
	lo, hi := inf, -inf
	for _, r := range rows {
		if r.Failed == "" && !math.IsNaN(r.OthersCores) {
			lo, hi = min(lo, r.OthersCores), max(hi, r.OthersCores)
		}
	}
	if hi >= 0 {
		fmt.Fprintf(md, "\nOther processes (not this server or these workers) used %s–%s of the cores during these runs "+
			"(/proc/stat less the bench's processes).\n", fmtNum(lo), fmtNum(hi))
	}
}

func findRow(rows []row, name string, procs int) *row {
	for i := range rows {
		if rows[i].Contender == name && rows[i].Procs == procs && rows[i].Failed == "" {
			return &rows[i]
		}
	}
	return nil
}

// ratios: warden's lock rows against the targets, redsync with enough tries the anchor.
func ratios(md *strings.Builder, rows []row, unc []uncontendedRow) {
	md.WriteString("\n")
	for _, procs := range []int{1, 4} {
		me := findRow(rows, "warden-lock", procs)
		anchor := findRow(rows, "redsync-tries-lock", procs)
		def := findRow(rows, "redsync-default-lock", procs)
		if me == nil {
			continue
		}
		fmt.Fprintf(md, "- warden, %d process%s:", procs, map[bool]string{true: "es", false: ""}[procs > 1])
		if anchor != nil {
			rate := me.HandoffsPerS / anchor.HandoffsPerS
			fmt.Fprintf(md, " ÷ redsync (%d tries): **%s×** hand-offs/s (≥ 2 %s", redsyncTries, fmtNum(rate), mark(rate >= 2))
			// A lock cannot hand off faster than 1 / hold: say when the target lies above that.
			if ceiling, want := 1000/me.HeldMs, 2*anchor.HandoffsPerS; want > ceiling {
				fmt.Fprintf(md, "; 2× would be %s/s, above the ceiling of %s/s that the %s ms hold allows",
					fmtInt(want), fmtInt(ceiling), fmtNum(me.HeldMs))
			}
			p99 := anchor.P99Ms / me.P99Ms
			fmt.Fprintf(md, "), p99 wait **1/%s** (≤ 1/5 %s), server CPU per hand-off %s×;", fmtNum(p99), mark(p99 >= 5),
				fmtNum(me.CPUMsPer1000/anchor.CPUMsPer1000))
		}
		if def != nil {
			fmt.Fprintf(md, " ÷ redsync's defaults: **%s×** hand-offs/s, p99 wait **1/%s**; failures %d against redsync's defaults' %d",
				fmtNum(me.HandoffsPerS/def.HandoffsPerS), fmtNum(def.P99Ms/me.P99Ms), me.Failures, def.Failures)
			if def.Failures > 0 {
				fmt.Fprintf(md, " (0 where redsync's defaults fail %s);", mark(me.Failures == 0))
			} else {
				fmt.Fprintf(md, " (redsync's defaults did not fail in this run; warden's 0 %s);", mark(me.Failures == 0))
			}
		}
		for _, n := range []string{"redislock-linear-lock", "redislock-exp-lock"} {
			if r := findRow(rows, n, procs); r != nil {
				fmt.Fprintf(md, " ÷ %s: **%s×** hand-offs/s, p99 wait **1/%s**;", shortLabel(n),
					fmtNum(me.HandoffsPerS/r.HandoffsPerS), fmtNum(r.P99Ms/me.P99Ms))
			}
		}
		fmt.Fprintf(md, " per-goroutine max/min %s (≤ 1.1 %s), server commands per acquisition %s (≤ 2 %s",
			fmtNum(me.Fairness), mark(me.Fairness <= 1.1), fmtNum(me.CommandsPerHandoff), mark(me.CommandsPerHandoff <= 2.0))
		for _, u := range unc {
			if u.Contender == "warden-lock" && u.Failed == "" {
				fmt.Fprintf(md, "; uncontended %s %s", fmtNum(u.Sent), mark(u.Sent <= 2))
			}
		}
		md.WriteString(").\n")
	}
}

// longRatios: failures within the budget where redsync's defaults give up.
func longRatios(md *strings.Builder, rows []row) {
	md.WriteString("\n")
	for _, procs := range []int{1, 4} {
		me := findRow(rows, "warden-lock", procs)
		if me == nil {
			continue
		}
		fmt.Fprintf(md, "- warden, %d process%s: failures %d", procs, map[bool]string{true: "es", false: ""}[procs > 1], me.Failures)
		if def := findRow(rows, "redsync-default-lock", procs); def != nil {
			fmt.Fprintf(md, " where redsync's defaults had %d (0 where they fail %s)", def.Failures, mark(me.Failures == 0 && def.Failures > 0))
		}
		for _, n := range []string{"redsync-tries-lock", "redislock-linear-lock"} {
			if r := findRow(rows, n, procs); r != nil {
				fmt.Fprintf(md, ", %s %d", shortLabel(n), r.Failures)
			}
		}
		// each goroutine gets one or two 500 ms holds in the window: max/min says nothing here
		fmt.Fprintf(md, "; p99 wait %s ms, max %s ms; goroutines granted nothing: %d", fmtNum(me.P99Ms), fmtNum(me.MaxMs), me.GrantedNone)
		for _, n := range []string{"redsync-default-lock", "redsync-tries-lock", "redislock-linear-lock"} {
			if r := findRow(rows, n, procs); r != nil {
				fmt.Fprintf(md, ", %s %d", shortLabel(n), r.GrantedNone)
			}
		}
		md.WriteString(".\n")
	}
}

func semRatios(md *strings.Builder, rows []row) {
	md.WriteString("\n")
	for _, procs := range []int{1, 4} {
		me, r := findRow(rows, "warden-sem", procs), findRow(rows, "redsync-sem", procs)
		if me == nil || r == nil {
			continue
		}
		fmt.Fprintf(md, "- warden, %d process%s, ÷ redsync as a semaphore: **%s×** acquisitions/s, p99 wait **1/%s**, "+
			"failures %d against %d, per-goroutine max/min %s (≤ 1.1 %s), server commands per acquisition %s (≤ 2 %s).\n",
			procs, map[bool]string{true: "es", false: ""}[procs > 1], fmtNum(me.HandoffsPerS/r.HandoffsPerS),
			fmtNum(r.P99Ms/me.P99Ms), me.Failures, r.Failures, fmtNum(me.Fairness), mark(me.Fairness <= 1.1),
			fmtNum(me.CommandsPerHandoff), mark(me.CommandsPerHandoff <= 2.0))
	}
}

func shortLabel(name string) string {
	if c, ok := find(name); ok && c.short != "" {
		return c.short
	}
	return name
}

func sortedKeys(m map[string]int64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func topKeys(m map[string]int64, n int) []string {
	keys := sortedKeys(m)
	sort.SliceStable(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] })
	if len(keys) > n {
		keys = keys[:n]
	}
	return keys
}

func mark(ok bool) string {
	if ok {
		return "✓"
	}
	return "✗"
}

// fmtCount: 2 for 2.00, 1.5 for 1.50: a count per iteration.
func fmtCount(v float64) string {
	if v == math.Round(v) {
		return fmt.Sprint(int64(v))
	}
	return fmtNum(v)
}

// fmtInt: 1,234.
func fmtInt(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return fmtNum(v)
	}
	s := fmt.Sprintf("%.0f", v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

// fmtNum: three significant figures or so, as the other sections print.
func fmtNum(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v):
		return "–"
	case math.IsInf(v, 0):
		return "∞"
	case a >= 100:
		return fmtInt(v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}
