package io.warden;

import java.util.concurrent.TimeUnit;

/**
 * A caller's deadline ({@link System#nanoTime()}), turned into the {@code WAIT} a command carries.
 */
final class Deadline {
  /** No end: wait until granted ({@code WAIT 0}). */
  static final long FOREVER = Long.MAX_VALUE;

  /** The longest {@code WAIT} the server takes (2^46 ms). */
  static final long MAX_WAIT_MS = 1L << 46;

  private Deadline() {}

  /** {@code wait} from {@code start}; a wait beyond what nanoTime can hold is forever. */
  static long after(long startNanos, long waitNanos) {
    long end = startNanos + waitNanos;
    return waitNanos < 0 || end < startNanos ? FOREVER : end;
  }

  /**
   * The {@code WAIT} to send now, in ms: what remains less a margin for the reply's way back (a
   * tenth, 1 to 5 ms), at least 1 (never 0, which waits forever); 0 for {@link #FOREVER}; -1 once
   * less than a millisecond remains (send nothing: the caller timed out).
   */
  static long waitArg(long deadlineNanos, long nowNanos) {
    if (deadlineNanos == FOREVER) {
      return 0;
    }
    long remainingMs = TimeUnit.NANOSECONDS.toMillis(deadlineNanos - nowNanos);
    if (deadlineNanos - nowNanos <= 0 || remainingMs < 1) {
      return -1;
    }
    long margin = Math.min(5, Math.max(1, remainingMs / 10));
    return Math.min(MAX_WAIT_MS, Math.max(1, remainingMs - margin));
  }

  static boolean passed(long deadlineNanos, long nowNanos) {
    return deadlineNanos != FOREVER && nowNanos - deadlineNanos >= 0;
  }
}
