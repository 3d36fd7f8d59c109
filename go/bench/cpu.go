package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// cpuSample: the machine's busy clock ticks and the given processes' (their threads included),
// from /proc, to tell what else ran meanwhile.
type cpuSample struct {
	at         time.Time
	busy, ours int64
	ok         bool
}

// hz is USER_HZ, clock ticks a second: 100 on Linux.
const hz = 100

func sampleCPU(pids []int) cpuSample {
	s := cpuSample{at: time.Now()}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s
	}
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])
	// cpu user nice system idle iowait irq softirq steal: all but idle and iowait
	for i := 1; i <= 8 && i < len(f); i++ {
		if i != 4 && i != 5 {
			n, _ := strconv.ParseInt(f[i], 10, 64)
			s.busy += n
		}
	}
	for _, pid := range pids {
		s.ours += processTicks(pid)
	}
	s.ok = true
	return s
}

func processTicks(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0 // gone already
	}
	// the fields after the command name (which may hold spaces): utime is the 14th overall
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return u + k
}

// othersCores: cores the other processes used between two samples; NaN when /proc was unreadable.
func othersCores(a, b cpuSample) float64 {
	if !a.ok || !b.ok {
		return nan
	}
	secs := b.at.Sub(a.at).Seconds()
	others := float64((b.busy-a.busy)-(b.ours-a.ours)) / hz
	return max(0, others/secs)
}

// machine: load averages and what else used the cores over one second (top), this process left
// out.
func machine() string {
	load, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	l := strings.Fields(string(load))
	out, err := exec.Command("top", "-b", "-n", "2", "-d", "1", "-w", "200").Output()
	if err != nil {
		return fmt.Sprintf("load average %s %s %s", l[0], l[1], l[2])
	}
	frame := 0
	var busy []string
	me := strconv.Itoa(os.Getpid())
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "top -") {
			frame++
			continue
		}
		f := strings.Fields(line)
		if frame < 2 || len(f) < 12 || f[0] == me {
			continue
		}
		if _, err := strconv.Atoi(f[0]); err != nil {
			continue
		}
		if cpu, err := strconv.ParseFloat(f[8], 64); err == nil && cpu >= 1 {
			busy = append(busy, fmt.Sprintf("%s %s %%", f[11], fmtNum(cpu)))
		}
	}
	others := "none"
	if len(busy) > 0 {
		others = strings.Join(busy, ", ")
	}
	return fmt.Sprintf("load average %s %s %s; other processes using ≥ 1 %% of a core over one second (top): %s.",
		l[0], l[1], l[2], others)
}
