package io.warden;

import java.time.Duration;
import java.util.Objects;

/** What {@code RATE.INFO} reports of a limiter. */
public final class RateInfo {
  private final long count;
  private final Duration period;
  private final long burst;
  private final long remaining;
  private final Duration resetAfter;
  private final long waiters;

  private RateInfo(
      long count, Duration period, long burst, long remaining, Duration resetAfter, long waiters) {
    this.count = count;
    this.period = period;
    this.burst = burst;
    this.remaining = remaining;
    this.resetAfter = resetAfter;
    this.waiters = waiters;
  }

  /** The reply of {@code RATE.INFO} (field/value pairs); null for nil. */
  static RateInfo of(Object reply) {
    if (reply == null) {
      return null;
    }
    return new RateInfo(
        field(reply, "count"),
        Duration.ofMillis(field(reply, "period")),
        field(reply, "burst"),
        field(reply, "remaining"),
        Duration.ofMillis(field(reply, "reset_after")),
        field(reply, "waiters"));
  }

  private static long field(Object reply, String name) {
    Long v = Resp.asLong(Resp.field(reply, name));
    return v == null ? 0 : Math.max(0, v);
  }

  /** Tokens the rate gives every {@link #period()}. */
  public long count() {
    return count;
  }

  public Duration period() {
    return period;
  }

  /** The most tokens taken at once (the bucket's size). */
  public long burst() {
    return burst;
  }

  /** Whole tokens available now. */
  public long remaining() {
    return remaining;
  }

  /** When the bucket is full again. */
  public Duration resetAfter() {
    return resetAfter;
  }

  /** Requests waiting in the key's queue. */
  public long waiters() {
    return waiters;
  }

  @Override
  public boolean equals(Object o) {
    if (!(o instanceof RateInfo)) {
      return false;
    }
    RateInfo i = (RateInfo) o;
    return count == i.count
        && period.equals(i.period)
        && burst == i.burst
        && remaining == i.remaining
        && resetAfter.equals(i.resetAfter)
        && waiters == i.waiters;
  }

  @Override
  public int hashCode() {
    return Objects.hash(count, period, burst, remaining, resetAfter, waiters);
  }

  @Override
  public String toString() {
    return "RateInfo[count="
        + count
        + ", period="
        + period
        + ", burst="
        + burst
        + ", remaining="
        + remaining
        + ", resetAfter="
        + resetAfter
        + ", waiters="
        + waiters
        + "]";
  }
}
