package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"
)

type bench struct {
	quick   bool
	rounds  int
	seconds float64
	only    []string
	started time.Time
}

func (b *bench) selected(name string) bool { return b.only == nil || slices.Contains(b.only, name) }

// child is a worker process: its stdout read line by line, stderr kept in a file for failures.
type child struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	err   *os.File
}

func startChild(args ...string) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	errf, err := os.CreateTemp("", "warden-go-bench-*.err")
	if err != nil {
		return nil, err
	}
	c := &child{cmd: exec.Command(self, args...), lines: make(chan string, 16), err: errf}
	c.cmd.Stderr = errf
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if c.in, err = c.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	return c, nil
}

func (c *child) send(line string) { _, _ = io.WriteString(c.in, line+"\n") }

// await: the next line starting with prefix within timeout; other lines skipped. A worker that
// hangs or dies fails its row, not the bench.
func (c *child) await(prefix string, timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				return "", fmt.Errorf("worker exited%s", c.stderr())
			}
			if strings.HasPrefix(line, prefix) {
				return line, nil
			}
		case <-t.C:
			_ = c.cmd.Process.Kill()
			return "", fmt.Errorf("no %s within %s%s", prefix, timeout, c.stderr())
		}
	}
}

func (c *child) stderr() string {
	b, _ := os.ReadFile(c.err.Name())
	tail := strings.Join(strings.Fields(strings.ReplaceAll(string(b), "|", "/")), " ")
	if len(tail) > 300 {
		tail = tail[:300]
	}
	if tail == "" {
		return ""
	}
	return " (" + tail + ")"
}

func (c *child) close() {
	c.in.Close()
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
	c.err.Close()
	os.Remove(c.err.Name())
}

// group is one contender's processes across the rounds, and what its slices add up to.
type group struct {
	c        contender
	procs    int
	hold     time.Duration
	children []*child
	counts   []int64
	granted  []int64
	waits    []int64
	failWait []int64
	calls    map[string]int64
	perSlice []float64
	others   []float64
	seconds  float64
	cpu      float64
	failures int64
	relErrs  int64
	overlaps int64
	heldNs   float64
	heldN    int
	errText  string
	failed   string
}

func newGroup(s *server, c contender, procs int, hold time.Duration) *group {
	g := &group{c: c, procs: procs, hold: hold, counts: make([]int64, goroutines), granted: make([]int64, goroutines), calls: map[string]int64{}}
	key := fmt.Sprintf("%s-%d-%d", c.name, procs, time.Now().UnixNano())
	for i := 0; i < procs; i++ {
		ch, err := startChild("worker", c.name, strconv.Itoa(goroutines/procs), s.addr(), key,
			strconv.FormatInt(hold.Microseconds(), 10))
		if err != nil {
			g.fail(err)
			return g
		}
		g.children = append(g.children, ch)
	}
	for _, ch := range g.children {
		if _, err := ch.await("READY", startup); err != nil {
			g.fail(err)
			return g
		}
	}
	return g
}

func (g *group) fail(err error) {
	g.failed = err.Error()
	fmt.Fprintf(os.Stderr, "go bench: %s failed: %s\n", g.c.name, g.failed)
	for _, ch := range g.children {
		_ = ch.cmd.Process.Kill()
	}
}

func (g *group) slice(s *server, secs float64) {
	if g.failed != "" {
		return
	}
	pids := []int{os.Getpid(), s.pid()}
	for _, ch := range g.children {
		pids = append(pids, ch.cmd.Process.Pid)
	}
	m0 := sampleCPU(pids)
	cpu0 := s.cpuSeconds()
	calls0 := s.commandCalls()
	for _, ch := range g.children {
		ch.send(fmt.Sprintf("GO %g", secs))
	}
	var results []sliceResult
	for _, ch := range g.children {
		line, err := ch.await("RESULT ", time.Duration(secs*float64(time.Second))+budget+startup)
		if err != nil {
			g.fail(err)
			return
		}
		var r sliceResult
		if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "RESULT ")), &r); err != nil {
			g.fail(err)
			return
		}
		results = append(results, r)
	}
	g.cpu += s.cpuSeconds() - cpu0
	for k, v := range delta(calls0, s.commandCalls()) {
		g.calls[k] += v
	}
	g.others = append(g.others, othersCores(m0, sampleCPU(pids)))
	g.seconds += secs
	var total int64
	t := 0
	for _, r := range results {
		for i, n := range r.Counts {
			g.counts[t] += n
			g.granted[t] += r.Granted[i]
			total += n
			t++
		}
		g.waits = append(g.waits, r.Waits...)
		g.failWait = append(g.failWait, r.FailWaitUs...)
		g.failures += r.Failures
		g.relErrs += r.ReleaseErrors
		g.overlaps += r.Overlaps
		if r.HeldNs > 0 {
			g.heldNs += float64(r.HeldNs)
			g.heldN++
		}
		if g.errText == "" {
			g.errText = r.FirstError
		}
	}
	g.perSlice = append(g.perSlice, float64(total)/secs)
}

func (g *group) close() {
	for _, ch := range g.children {
		ch.close()
	}
}

// row is one table line, as written to the .json.
type row struct {
	Contender          string           `json:"contender"`
	Label              string           `json:"label"`
	Procs              int              `json:"processes"`
	HoldMsSet          float64          `json:"hold_ms_set"`
	Goroutines         int              `json:"goroutines"`
	Failed             string           `json:"failed,omitempty"`
	Seconds            float64          `json:"seconds"`
	Handoffs           int64            `json:"handoffs"`
	HandoffsPerS       float64          `json:"handoffs_per_s"`
	Slices             []float64        `json:"handoffs_per_s_slices"`
	P50, P99, Max      float64          `json:"-"`
	P50Ms              float64          `json:"p50_ms"`
	P99Ms              float64          `json:"p99_ms"`
	MaxMs              float64          `json:"max_ms"`
	PerGoroutine       []int64          `json:"per_goroutine"`
	Granted            int64            `json:"granted"`
	GrantedNone        int              `json:"goroutines_granted_none"`
	Fairness           float64          `json:"fairness"`
	Failures           int64            `json:"failures"`
	FailMaxWaitMs      float64          `json:"failure_max_wait_ms"`
	ReleaseErrors      int64            `json:"release_errors"`
	ErrorSample        string           `json:"error_sample"`
	Overlaps           int64            `json:"overlaps"`
	ServerCPUS         float64          `json:"server_cpu_s"`
	CPUMsPer1000       float64          `json:"cpu_ms_per_1000_acquisitions"`
	Commands           int64            `json:"commands"`
	CommandsPerHandoff float64          `json:"commands_per_acquisition"`
	CommandsByName     map[string]int64 `json:"commands_by_name"`
	HeldMs             float64          `json:"held_ms"`
	OthersCores        float64          `json:"others_cores"`
}

func (g *group) row() row {
	r := row{Contender: g.c.name, Label: g.c.label, Procs: g.procs, Goroutines: goroutines,
		HoldMsSet: float64(g.hold.Microseconds()) / 1000}
	if g.failed != "" {
		r.Failed = g.failed
		return r
	}
	var total int64
	mn, mx := g.counts[0], g.counts[0]
	for _, n := range g.counts {
		total += n
		mn, mx = min(mn, n), max(mx, n)
	}
	var commands int64
	for _, v := range g.calls {
		commands += v
	}
	slices.Sort(g.waits)
	r.Seconds = g.seconds
	r.Handoffs = total
	r.HandoffsPerS = float64(total) / g.seconds
	r.Slices = g.perSlice
	r.P50Ms = percentile(g.waits, 50) / 1000
	r.P99Ms = percentile(g.waits, 99) / 1000
	r.MaxMs = percentile(g.waits, 100) / 1000
	r.PerGoroutine = g.counts
	r.Fairness = inf
	if mn > 0 {
		r.Fairness = float64(mx) / float64(mn)
	}
	r.Failures = g.failures
	slices.Sort(g.failWait)
	r.FailMaxWaitMs = percentile(g.failWait, 100) / 1000
	r.ReleaseErrors = g.relErrs
	r.ErrorSample = g.errText
	r.Overlaps = g.overlaps
	r.ServerCPUS = g.cpu
	r.CPUMsPer1000 = nan
	r.CommandsPerHandoff = nan
	// per granted acquisition: the server's counters run until the slice's last acquisition ends
	for _, n := range g.granted {
		r.Granted += n
		if n == 0 {
			r.GrantedNone++
		}
	}
	if r.Granted > 0 {
		r.CPUMsPer1000 = g.cpu * 1000 / (float64(r.Granted) / 1000)
		r.CommandsPerHandoff = float64(commands) / float64(r.Granted)
	}
	r.Commands = commands
	r.CommandsByName = g.calls
	if g.heldN > 0 {
		r.HeldMs = g.heldNs / float64(g.heldN) / 1e6
	}
	for _, o := range g.others {
		r.OthersCores += o / float64(len(g.others))
	}
	return r
}

// percentile of sorted values (nearest rank); NaN for none.
func percentile(sorted []int64, p float64) float64 {
	if len(sorted) == 0 {
		return nan
	}
	i := int(float64(len(sorted))*p/100+0.5) - 1
	return float64(sorted[max(0, min(len(sorted)-1, i))])
}

// contended: every contender's processes are started first; then the rounds, each giving every
// contender one slice in turn (the order rotating), so that a burst of other work on the machine
// falls on all of them alike. A row sums its slices.
func (b *bench) contended(s *server, names []string, hold time.Duration, seconds float64, rounds int) []row {
	var rows []row
	var cs []contender
	for _, n := range names {
		if c, ok := find(n); ok && b.selected(n) {
			cs = append(cs, c)
		}
	}
	if len(cs) == 0 {
		return nil
	}
	slice := seconds / float64(rounds)
	for _, procs := range []int{1, 4} {
		var groups []*group
		for _, c := range cs {
			fmt.Fprintf(os.Stderr, "go bench: %s, %d process(es): starting\n", c.name, procs)
			groups = append(groups, newGroup(s, c, procs, hold))
		}
		for round := 0; round < rounds; round++ {
			fmt.Fprintf(os.Stderr, "go bench: %d process(es), round %d of %d\n", procs, round+1, rounds)
			for i := range groups {
				groups[(i+round)%len(groups)].slice(s, slice)
			}
		}
		for _, g := range groups {
			g.close()
			rows = append(rows, g.row())
		}
	}
	return rows
}

// uncontendedRow is acquire + release on a free key, counted with MONITOR.
type uncontendedRow struct {
	Contender string  `json:"contender"`
	Label     string  `json:"label"`
	Failed    string  `json:"failed,omitempty"`
	Sent      float64 `json:"sent"`
	Run       float64 `json:"run"`
	Which     string  `json:"which"`
}

func (b *bench) uncontended(s *server, c contender) uncontendedRow {
	r := uncontendedRow{Contender: c.name, Label: c.label}
	fmt.Fprintf(os.Stderr, "go bench: %s, uncontended\n", c.name)
	key := fmt.Sprintf("%s-free-%d", c.name, time.Now().UnixNano())
	ch, err := startChild("uncontended", c.name, strconv.Itoa(uncontendedIterations), s.addr(), key)
	if err != nil {
		r.Failed = err.Error()
		return r
	}
	defer ch.close()
	if _, err := ch.await("READY", startup); err != nil {
		r.Failed = err.Error()
		return r
	}
	m, err := s.monitor()
	if err != nil {
		r.Failed = err.Error()
		return r
	}
	defer m.close()
	ctx := bg()
	start := fmt.Sprintf("warden-bench-start-%d", time.Now().UnixNano())
	end := fmt.Sprintf("warden-bench-end-%d", time.Now().UnixNano())
	s.admin.Echo(ctx, start)
	ch.send("GO")
	if _, err := ch.await("DONE", startup); err != nil {
		r.Failed = err.Error()
		return r
	}
	s.admin.Echo(ctx, end)
	sent, run, names, err := m.count(start, end)
	if err != nil {
		r.Failed = err.Error()
		return r
	}
	r.Sent = float64(sent) / uncontendedIterations
	r.Run = float64(run) / uncontendedIterations
	var which []string
	for _, k := range sortedKeys(names) {
		if names[k] == uncontendedIterations {
			which = append(which, k)
		} else {
			which = append(which, fmt.Sprintf("%s ×%s", k, fmtCount(float64(names[k])/uncontendedIterations)))
		}
	}
	r.Which = strings.Join(which, ", ")
	return r
}
