package io.warden.bench;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;

/** The machine's busy CPU time and the bench's own, from /proc: what else ran meanwhile. */
final class Cpu {
  private Cpu() {}

  /** Clock ticks a second (USER_HZ): 100 on Linux. */
  private static final double HZ = 100;

  /** {wall ns, machine busy ticks, the given processes' ticks (their threads included)}. */
  static long[] sample(List<Long> pids) {
    long busy = 0;
    long ours = 0;
    try {
      String[] f = Files.readAllLines(Path.of("/proc/stat")).get(0).trim().split("\\s+");
      // user nice system idle iowait irq softirq steal: all but idle and iowait
      for (int i = 1; i <= 8; i++) {
        if (i != 4 && i != 5) {
          busy += Long.parseLong(f[i]);
        }
      }
      for (long pid : pids) {
        ours += processTicks(pid);
      }
    } catch (IOException | RuntimeException e) {
      return new long[] {System.nanoTime(), -1, 0};
    }
    return new long[] {System.nanoTime(), busy, ours};
  }

  private static long processTicks(long pid) {
    try {
      String stat = Files.readString(Path.of("/proc", String.valueOf(pid), "stat"));
      // fields after the command name (which may hold spaces): utime is the 14th field overall
      String[] f = stat.substring(stat.lastIndexOf(')') + 2).split(" ");
      return Long.parseLong(f[11]) + Long.parseLong(f[12]);
    } catch (IOException | RuntimeException e) {
      return 0; // gone already
    }
  }

  /** Cores the other processes used between two samples; NaN when /proc was not readable. */
  static double othersCores(long[] a, long[] b) {
    if (a[1] < 0 || b[1] < 0) {
      return Double.NaN;
    }
    double seconds = (b[0] - a[0]) / 1e9;
    double others = ((b[1] - a[1]) - (b[2] - a[2])) / HZ;
    return Math.max(0, others / seconds);
  }
}
